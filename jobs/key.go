package jobs

import (
	"crypto/sha256"
	"encoding/hex"
	"regexp"
	"strconv"
	"strings"

	"github.com/toolq/toolq/internal/jcs"
)

// The patterns that make the key material unambiguous: none of them admits the
// '|' separator, and none admits '.', '*' or '>', so each is also safe as a NATS
// subject token.
var (
	conversationIDPattern = idPattern{regexp.MustCompile(`^[A-Za-z0-9_:-]{1,128}$`), "_:-", 128}
	toolNamePattern       = idPattern{regexp.MustCompile(`^[a-zA-Z0-9_-]{1,64}$`), "_-", 64}
	toolUseIDPattern      = idPattern{regexp.MustCompile(`^[A-Za-z0-9_-]{1,128}$`), "_-", 128}
)

// idPattern is a rule of the form ^[A-Za-z0-9<extra>]{1,max}$: re states it
// (in error messages), and MatchString checks it with a loop over the bytes.
// The regexp engine took a tenth of decoding a job at every delivery.
type idPattern struct {
	re    *regexp.Regexp
	extra string
	max   int
}

func (p idPattern) MatchString(s string) bool {
	if len(s) == 0 || len(s) > p.max {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || strings.IndexByte(p.extra, c) >= 0 {
			continue
		}
		return false
	}
	return true
}

func (p idPattern) String() string { return p.re.String() }

// KeyLen is the length of a key in hexadecimal characters (128 bits).
const KeyLen = 32

// Call names one tool call for the purpose of its key: everything that makes
// two calls the same call, and nothing that changes across a retry (the
// tool_use_id is not here on purpose).
type Call struct {
	// Tenant, when not empty, starts the material: "tenant|". The default
	// tenant's material is that of a single-tenant deployment, unchanged.
	Tenant         string
	ConversationID string
	TurnIndex      int64
	Tool           string
	Ordinal        int64
	Args           []byte // a JSON object, in any formatting
}

// Material is the exact byte string a key is hashed from, with the canonical
// form of the arguments kept apart for callers that store or compare it.
type Material struct {
	Text      string // [tenant|]conversation_id|turn_index|tool|ordinal|canonical(args)
	Canonical []byte // canonical(args)

	legacy []byte     // canonical(args) in the legacy member order, when it differs
	args   *jcs.Value // the args as parsed, when the material was derived from a parse
}

// ArgsInstance returns the call's args as a JSON Schema validator takes
// them (jcs.Value.Instance: numbers as their literals), built from the parse
// the material came from, and true; false for a material not derived from a
// parse (Legacy's).
func (m Material) ArgsInstance() (any, bool) {
	if m.args == nil {
		return nil, false
	}
	return m.args.Instance(), true
}

// Validate checks the identifying fields of the call (not its arguments) and
// returns a *FieldError naming the first one that breaks its rule.
func (c Call) Validate() error {
	switch {
	case !ValidTenant(c.Tenant):
		return tenantError()
	case !conversationIDPattern.MatchString(c.ConversationID):
		return &FieldError{Field: "conversation_id", Rule: "must match " + conversationIDPattern.String()}
	case c.TurnIndex < 0:
		return &FieldError{Field: "turn_index", Rule: "must be a non-negative integer"}
	case !toolNamePattern.MatchString(c.Tool):
		return &FieldError{Field: "tool", Rule: "must match " + toolNamePattern.String()}
	case c.Ordinal < 0:
		return &FieldError{Field: "ordinal", Rule: "must be a non-negative integer"}
	}
	return nil
}

// Material validates the call and returns the material its key is hashed
// from. Errors: a *FieldError for a bad identifying field, or a *SyntaxError
// (wrapping ErrNotObject, ErrDuplicateName, …) for arguments the contract
// rejects, itself wrapped in a *FieldError naming "args".
func (c Call) Material() (Material, error) {
	if err := c.Validate(); err != nil {
		return Material{}, err
	}
	args, err := jcs.ParseStrict(c.Args)
	if err == nil && args.Kind != jcs.KindObject {
		_, err = jcs.CanonicalizeObject(c.Args)
	}
	if err != nil {
		return Material{}, &FieldError{Field: "args", Rule: "must be a canonicalizable JSON object", Err: err}
	}
	return c.material(&args), nil
}

// material is the material of a valid call whose parsed args are args.
func (c Call) material(args *jcs.Value) Material {
	m := c.materialOf(args.Canonical())
	m.legacy = args.LegacyCanonical()
	m.args = args
	return m
}

// materialOf is the material of a valid call whose canonical args are canon.
func (c Call) materialOf(canon []byte) Material {
	text := make([]byte, 0, len(c.Tenant)+len(c.ConversationID)+len(c.Tool)+len(canon)+49)
	if c.Tenant != "" {
		text = append(text, c.Tenant...)
		text = append(text, '|')
	}
	text = append(text, c.ConversationID...)
	text = append(text, '|')
	text = strconv.AppendInt(text, c.TurnIndex, 10)
	text = append(text, '|')
	text = append(text, c.Tool...)
	text = append(text, '|')
	text = strconv.AppendInt(text, c.Ordinal, 10)
	text = append(text, '|')
	text = append(text, canon...)
	return Material{Text: string(text), Canonical: canon}
}

// Key derives the idempotency key of the call:
//
//	hex(sha256(conversation_id|turn_index|tool|ordinal|canonical(args)))[:32]
//
// Errors are those of Material.
func (c Call) Key() (string, error) {
	m, err := c.Material()
	if err != nil {
		return "", err
	}
	return m.Key(), nil
}

// Key hashes the material into the key.
func (m Material) Key() string {
	sum := sha256.Sum256([]byte(m.Text))
	return hex.EncodeToString(sum[:])[:KeyLen]
}

// Legacy returns the material the call had before member names were ordered
// by all their UTF-16 code units (RFC 8785), and true, when the two differ:
// only args with an object holding two names that first differ at characters
// above U+FFFF sharing a high surrogate (👍 U+1F44D and 👎 U+1F44E) can make
// them differ, and then the legacy form kept those names in the order they
// were written. A worker looks the legacy key up so that a call settled, or
// in flight, under it before the upgrade is not run a second time.
func (m Material) Legacy() (Material, bool) {
	if m.legacy == nil {
		return Material{}, false
	}
	prefix := m.Text[:len(m.Text)-len(m.Canonical)]
	return Material{Text: prefix + string(m.legacy), Canonical: m.legacy}, true
}

// ArgsDigest is the full SHA-256 of the canonical arguments in hex; the ledger
// keeps it to tell a key collision from a genuine duplicate.
func (m Material) ArgsDigest() string {
	sum := sha256.Sum256(m.Canonical)
	return hex.EncodeToString(sum[:])
}

// ValidToolName reports whether name may name a tool: it matches
// ^[a-zA-Z0-9_-]{1,64}$, so it is unambiguous in the key and a single subject
// token.
func ValidToolName(name string) bool { return toolNamePattern.MatchString(name) }
