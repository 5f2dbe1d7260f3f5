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

	"github.com/toolq/toolq/internal/jcs"
	"github.com/toolq/toolq/ledger"
)

// call is a call as the page shows it. Args is the canonical JSON (RFC
// 8785) of the args that run, the bytes ArgsDigest digests; ArgsShown is
// the same JSON value with every character that does not show written as
// a \u escape, ArgsPretty ArgsShown indented (every literal as it is), and
// Fields its values one per line; the page renders them all as text.
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
	ArgsShown      string  `json:"args_shown"`
	ArgsPretty     string  `json:"args_pretty"`
	Fields         []field `json:"fields"`
	ArgsDigest     string  `json:"args_digest"`
	// ArgsVerified: the SHA-256 of Args is ArgsDigest. The page lets
	// nobody approve args it cannot show exactly.
	ArgsVerified bool `json:"args_verified"`
	// Unseen: some key or string of the args, anywhere in them, holds a
	// character that does not show (see unseen). Lookalikes say which keys
	// and strings read as others: a word that mixes scripts, keys of one
	// object that read alike.
	Unseen      bool      `json:"unseen"`
	Lookalikes  []string  `json:"lookalikes"`
	RequestedAt time.Time `json:"requested_at"`
	ExpiresAt   time.Time `json:"expires_at"`
	// State is the ledger's (awaiting_approval, in_flight, completed,
	// failed, …), or not_run_yet for an approved call that no worker has
	// claimed to run since; Decision, By, Reason and DecidedAt say how a
	// decided call was decided.
	State     string    `json:"state"`
	Decision  string    `json:"decision,omitempty"`
	By        string    `json:"by,omitempty"`
	Reason    string    `json:"reason,omitempty"`
	DecidedAt time.Time `json:"decided_at,omitzero"`
}

// notRunYet is the State of an approved call that has not run yet.
const notRunYet = "not_run_yet"

// field is one value of the args: its path (amount_cents, items[0].sku)
// and its JSON literal, with the characters that do not show (controls,
// bidirectional overrides, zero-width, variation selectors) escaped in
// both so that an approver sees them; Hidden says there were some, in its
// value or in a key of its path, Lookalike that one of them reads as
// another.
type field struct {
	Path      string `json:"path"`
	Value     string `json:"value"`
	Kind      string `json:"kind"` // string, number, bool, null, object, array (empty ones)
	Hidden    bool   `json:"hidden,omitempty"`
	Lookalike bool   `json:"lookalike,omitempty"`
}

// maxFields is how many values of the args are listed one per line; the
// canonical JSON shows them all, and every value is read for what does
// not show and for lookalikes.
const maxFields = 200

// maxLookalikes is how many lookalikes a call names.
const maxLookalikes = 20

func view(row ledger.Row) call {
	c := call{Key: row.Key, Tool: row.Tool, ConversationID: row.ConversationID, TurnIndex: row.TurnIndex, Ordinal: row.Ordinal,
		ToolUseID: row.FirstToolUseID, Waiters: len(row.Waiters), ArgsDigest: row.ArgsDigest, ExpiresAt: row.ApprovalExpiresAt,
		State: string(row.State), Fields: []field{}, Lookalikes: []string{}}
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
		c.ArgsShown = shown(c.Args)
		var b bytes.Buffer
		if json.Indent(&b, []byte(c.ArgsShown), "", "  ") == nil {
			c.ArgsPretty = b.String()
		}
		rd := read(args)
		c.Fields, c.Unseen, c.Lookalikes = rd.fields, rd.unseen, rd.lookalikes
	}
	if row.State != ledger.AwaitingApproval {
		c.Decision = string(row.ApprovalStatus)
		if d := row.LastDecision(); d != nil {
			c.By, c.Reason, c.DecidedAt = d.By, d.Reason, d.At
		}
	}
	if row.State == ledger.Released {
		c.State = notRunYet
	}
	return c
}

// reading is what a person reads of args: their values one per line (the
// first maxFields), whether a key or string anywhere in them holds a
// character that does not show, and the lookalikes among them.
type reading struct {
	fields     []field
	more       int // values past maxFields
	unseen     bool
	lookalikes []string
}

// read reads args (a JSON object) in their order, one field per path; past
// maxFields, a last line says how many more there are.
func read(args json.RawMessage) reading {
	rd := reading{fields: []field{}, lookalikes: []string{}}
	dec := json.NewDecoder(bytes.NewReader(args))
	dec.UseNumber()
	if err := rd.walk(dec, "", false, false); err != nil {
		return reading{fields: []field{{Path: "(args)", Value: "not JSON: " + err.Error(), Kind: "error"}}, lookalikes: []string{}}
	}
	if rd.more > 0 {
		rd.fields = append(rd.fields, field{Path: "…", Value: fmt.Sprintf("%d more values: see the canonical JSON", rd.more), Kind: "more"})
	}
	if n := len(rd.lookalikes) - maxLookalikes; n > 0 {
		rd.lookalikes = append(rd.lookalikes[:maxLookalikes], fmt.Sprintf("and %d more", n))
	}
	return rd
}

// fields lists the values of args; see read.
func fields(args json.RawMessage) []field { return read(args).fields }

func (rd *reading) emit(f field) {
	if len(rd.fields) < maxFields {
		rd.fields = append(rd.fields, f)
	} else {
		rd.more++
	}
}

// text reads a key or a string at path: whether it holds a character that
// does not show, and whether it mixes scripts.
func (rd *reading) text(path, what, s string) (hidden, lookalike bool) {
	q, hidden := quote(s)
	rd.unseen = rd.unseen || hidden
	if scripts := mixedScripts(s); scripts != nil {
		rd.lookalikes = append(rd.lookalikes, fmt.Sprintf("%s %s%s mixes %s letters", what, q, at(path), strings.Join(scripts, " and ")))
		lookalike = true
	}
	return hidden, lookalike
}

// at is " at path", or "" at the top.
func at(path string) string {
	if path == "" {
		return ""
	}
	return " at " + path
}

// walk reads the value at path; hidden and lookalike say whether a key of
// the path was flagged.
func (rd *reading) walk(dec *json.Decoder, path string, hidden, lookalike bool) error {
	tok, err := dec.Token()
	if err != nil {
		return err
	}
	switch v := tok.(type) {
	case json.Delim:
		empty := true
		switch v {
		case '{':
			skeletons := map[string]string{} // skeleton: the first key with it
			for dec.More() {
				k, err := dec.Token()
				if err != nil {
					return err
				}
				key := k.(string)
				empty = false
				h, l := rd.text(path, "key", key)
				sk := skeleton(key)
				if other, ok := skeletons[sk]; ok && other != key {
					q1, _ := quote(other)
					q2, _ := quote(key)
					where := " of the args"
					if path != "" {
						where = " of " + path
					}
					rd.lookalikes = append(rd.lookalikes, fmt.Sprintf("keys %s and %s%s read alike", q1, q2, where))
					l = true
				} else if !ok {
					skeletons[sk] = key
				}
				if err := rd.walk(dec, member(path, key), hidden || h, lookalike || l); err != nil {
					return err
				}
			}
			if empty && path != "" {
				rd.emit(field{Path: path, Value: "{}", Kind: "object", Hidden: hidden, Lookalike: lookalike})
			}
		case '[':
			for i := 0; dec.More(); i++ {
				empty = false
				if err := rd.walk(dec, path+"["+strconv.Itoa(i)+"]", hidden, lookalike); err != nil {
					return err
				}
			}
			if empty {
				rd.emit(field{Path: path, Value: "[]", Kind: "array", Hidden: hidden, Lookalike: lookalike})
			}
		}
		_, err := dec.Token() // the closing delimiter
		return err
	case string:
		h, l := rd.text(path, "string", v)
		value, _ := quote(v)
		rd.emit(field{Path: path, Value: value, Kind: "string", Hidden: hidden || h, Lookalike: lookalike || l})
	case json.Number:
		rd.emit(field{Path: path, Value: v.String(), Kind: "number", Hidden: hidden, Lookalike: lookalike})
	case bool:
		rd.emit(field{Path: path, Value: strconv.FormatBool(v), Kind: "bool", Hidden: hidden, Lookalike: lookalike})
	case nil:
		rd.emit(field{Path: path, Value: "null", Kind: "null", Hidden: hidden, Lookalike: lookalike})
	}
	return nil
}

var identifier = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

// member is the path of key under path: a.b, or a["odd key"] (escaped as
// quote escapes it).
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
