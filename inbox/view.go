package inbox

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf16"
	"unicode/utf8"

	"github.com/toolq/toolq/internal/jcs"
	"github.com/toolq/toolq/ledger"
)

// call is a call as the page shows it. Args is the canonical JSON (RFC
// 8785) of the args that run, the bytes ArgsDigest digests, ArgsPretty the
// same indented
// (every literal as it is), Fields its values one per line; the page
// renders them all as text.
type call struct {
	Key            string  `json:"key"`
	Tool           string  `json:"tool"`
	ConversationID string  `json:"conversation_id"`
	TurnIndex      int64   `json:"turn_index"`
	Ordinal        int64   `json:"ordinal"`
	ToolUseID      string  `json:"tool_use_id"` // the first that asked
	Waiters        int     `json:"waiters"`
	Group          string  `json:"group"`
	Args           string  `json:"args"`
	ArgsPretty     string  `json:"args_pretty"`
	Fields         []field `json:"fields"`
	ArgsDigest     string  `json:"args_digest"`
	// ArgsVerified: the SHA-256 of Args is ArgsDigest. The page lets
	// nobody approve args it cannot show exactly.
	ArgsVerified bool      `json:"args_verified"`
	RequestedAt  time.Time `json:"requested_at"`
	ExpiresAt    time.Time `json:"expires_at"`
	// State is the ledger's (awaiting_approval, in_flight, completed,
	// failed, …); Decision, By, Reason and DecidedAt say how a decided
	// call was decided.
	State     string    `json:"state"`
	Decision  string    `json:"decision,omitempty"`
	By        string    `json:"by,omitempty"`
	Reason    string    `json:"reason,omitempty"`
	DecidedAt time.Time `json:"decided_at,omitzero"`
}

// field is one value of the args: its path (amount_cents, items[0].sku)
// and its JSON literal, with the characters that do not show (controls,
// bidirectional overrides, zero-width) escaped so that an approver sees
// them; Hidden says there were some.
type field struct {
	Path   string `json:"path"`
	Value  string `json:"value"`
	Kind   string `json:"kind"` // string, number, bool, null, object, array (empty ones)
	Hidden bool   `json:"hidden,omitempty"`
}

// maxFields is how many values of the args are listed one per line; the
// canonical JSON shows them all.
const maxFields = 200

func view(row ledger.Row) call {
	c := call{Key: row.Key, Tool: row.Tool, ConversationID: row.ConversationID, TurnIndex: row.TurnIndex, Ordinal: row.Ordinal,
		ToolUseID: row.FirstToolUseID, Waiters: len(row.Waiters), ArgsDigest: row.ArgsDigest, ExpiresAt: row.ApprovalExpiresAt,
		State: string(row.State), Fields: []field{}}
	if a := row.Approval; a != nil {
		c.Group, c.RequestedAt = a.Group, a.RequestedAt
		// The ledger keeps the args as JSON of the same value, not always
		// of the same bytes (it may escape <, > and &): the page shows
		// them canonical again, the bytes the digest was taken of.
		args := []byte(a.Args)
		if canon, err := jcs.Canonicalize(a.Args); err == nil {
			args = canon
		}
		sum := sha256.Sum256(args)
		c.Args, c.ArgsVerified = string(args), hex.EncodeToString(sum[:]) == row.ArgsDigest
		var b bytes.Buffer
		if json.Indent(&b, args, "", "  ") == nil {
			c.ArgsPretty = b.String()
		}
		c.Fields = fields(args)
	}
	if row.State != ledger.AwaitingApproval {
		c.Decision = string(row.ApprovalStatus)
		if d := row.LastDecision(); d != nil {
			c.By, c.Reason, c.DecidedAt = d.By, d.Reason, d.At
		}
	}
	return c
}

// fields lists the values of args (a JSON object) in their order, one per
// path; past maxFields, a last line says how many more there are.
func fields(args json.RawMessage) []field {
	out := []field{}
	dec := json.NewDecoder(bytes.NewReader(args))
	dec.UseNumber()
	n := 0
	if err := walk(dec, "", func(f field) {
		if n++; n <= maxFields {
			out = append(out, f)
		}
	}); err != nil {
		return []field{{Path: "(args)", Value: "not JSON: " + err.Error(), Kind: "error"}}
	}
	if n > maxFields {
		out = append(out, field{Path: "…", Value: fmt.Sprintf("%d more values: see the canonical JSON", n-maxFields), Kind: "more"})
	}
	return out
}

func walk(dec *json.Decoder, path string, emit func(field)) error {
	tok, err := dec.Token()
	if err != nil {
		return err
	}
	switch v := tok.(type) {
	case json.Delim:
		empty := true
		switch v {
		case '{':
			for dec.More() {
				k, err := dec.Token()
				if err != nil {
					return err
				}
				empty = false
				if err := walk(dec, member(path, k.(string)), emit); err != nil {
					return err
				}
			}
			if empty && path != "" {
				emit(field{Path: path, Value: "{}", Kind: "object"})
			}
		case '[':
			for i := 0; dec.More(); i++ {
				empty = false
				if err := walk(dec, path+"["+strconv.Itoa(i)+"]", emit); err != nil {
					return err
				}
			}
			if empty {
				emit(field{Path: path, Value: "[]", Kind: "array"})
			}
		}
		_, err := dec.Token() // the closing delimiter
		return err
	case string:
		value, hidden := quote(v)
		emit(field{Path: path, Value: value, Kind: "string", Hidden: hidden})
	case json.Number:
		emit(field{Path: path, Value: v.String(), Kind: "number"})
	case bool:
		emit(field{Path: path, Value: strconv.FormatBool(v), Kind: "bool"})
	case nil:
		emit(field{Path: path, Value: "null", Kind: "null"})
	}
	return nil
}

var identifier = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

// member is the path of key under path: a.b, or a["odd key"].
func member(path, key string) string {
	if identifier.MatchString(key) {
		if path == "" {
			return key
		}
		return path + "." + key
	}
	q, _ := quote(key)
	return path + "[" + q + "]"
}

// quote is s as a JSON string literal in which every character that does
// not show is escaped (\n, \u202e), and whether there was one.
func quote(s string) (string, bool) {
	var b strings.Builder
	hidden := false
	b.WriteByte('"')
	for _, r := range s {
		switch {
		case r == '"' || r == '\\':
			b.WriteByte('\\')
			b.WriteRune(r)
		case r == '\n':
			b.WriteString(`\n`)
		case r == '\t':
			b.WriteString(`\t`)
		case r == utf8.RuneError || (r != ' ' && (!unicode.IsPrint(r) || unicode.Is(unicode.Cf, r))):
			hidden = true
			if r1, r2 := utf16.EncodeRune(r); r1 != utf8.RuneError {
				fmt.Fprintf(&b, `\u%04x\u%04x`, r1, r2)
			} else {
				fmt.Fprintf(&b, `\u%04x`, r)
			}
		default:
			b.WriteRune(r)
		}
	}
	b.WriteByte('"')
	return b.String(), hidden
}
