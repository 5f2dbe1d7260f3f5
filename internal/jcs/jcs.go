// Package jcs parses JSON strictly and writes its RFC 8785 (JSON
// Canonicalization Scheme) form, the canonical(args) of toolq's idempotency
// key. It rejects, never coerces, what could make two implementations disagree
// on the canonical form: duplicate member names, invalid UTF-8, lone surrogate
// escapes, numbers outside the double range, integer literals beyond ±2^53 and
// nesting deeper than MaxDepth. Each rule has a sentinel error; the errors that
// come back are *SyntaxError values that match it with errors.Is.
package jcs

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"unicode/utf16"
	"unicode/utf8"
)

// MaxDepth is the deepest nesting of arrays and objects that Canonicalize
// accepts. The bound keeps a hostile document from exhausting the stack.
const MaxDepth = 64

// maxSafeInteger is 2^53 written in decimal: the largest magnitude at which every
// integer still has its own double.
const maxSafeInteger = "9007199254740992"

// Errors returned by Canonicalize, CanonicalizeObject and ParseStrict. Each
// names one rule; the error that comes back is a *SyntaxError that wraps one of
// these together with the byte offset where the input broke it.
var (
	ErrSyntax        = errors.New("jcs: invalid JSON")
	ErrNotObject     = errors.New("jcs: not a JSON object")
	ErrDuplicateName = errors.New("jcs: duplicate member name")
	ErrInvalidUTF8   = errors.New("jcs: invalid UTF-8")
	ErrLoneSurrogate = errors.New("jcs: lone surrogate escape")
	ErrNumberRange   = errors.New("jcs: number outside the double range")
	ErrUnsafeInteger = errors.New("jcs: integer beyond ±2^53 (send it as a string)")
	ErrTooDeep       = errors.New("jcs: nesting deeper than the limit")
)

// A SyntaxError reports where a document broke a rule. It unwraps to the
// sentinel error of the rule, so errors.Is(err, ErrDuplicateName) works.
type SyntaxError struct {
	Offset int    // byte offset into the input
	Detail string // what was found, for the human reading the message
	rule   error
}

// Error returns the rule, the offset and the detail on one line.
func (e *SyntaxError) Error() string {
	if e.Detail == "" {
		return fmt.Sprintf("%v at offset %d", e.rule, e.Offset)
	}
	return fmt.Sprintf("%v at offset %d: %s", e.rule, e.Offset, e.Detail)
}

// Unwrap returns the sentinel error of the rule the input broke.
func (e *SyntaxError) Unwrap() error { return e.rule }

// Canonicalize returns the RFC 8785 (JSON Canonicalization Scheme) form of a
// JSON document: members sorted by the UTF-16 code units of their names, no
// insignificant whitespace, numbers in their shortest ECMAScript form, strings
// with the minimal escapes. It rejects, never coerces, a document that is not
// valid JSON or that breaks one of its rules: duplicate member names,
// invalid UTF-8, lone surrogate escapes, numbers outside the double range,
// integer literals beyond ±2^53 and nesting deeper than MaxDepth. The error
// wraps one of the Err* sentinels.
func Canonicalize(doc []byte) ([]byte, error) {
	v, err := ParseStrict(doc)
	if err != nil {
		return nil, err
	}
	var buf bytes.Buffer
	buf.Grow(len(doc))
	v.appendCanonical(&buf, compareUTF16)
	return buf.Bytes(), nil
}

// CanonicalizeObject is Canonicalize for documents that must be a JSON object,
// as tool arguments are; any other top-level value gives ErrNotObject.
func CanonicalizeObject(doc []byte) ([]byte, error) {
	v, err := ParseStrict(doc)
	if err != nil {
		return nil, err
	}
	if v.Kind != KindObject {
		return nil, &SyntaxError{Offset: 0, Detail: "found " + v.Kind.String(), rule: ErrNotObject}
	}
	var buf bytes.Buffer
	buf.Grow(len(doc))
	v.appendCanonical(&buf, compareUTF16)
	return buf.Bytes(), nil
}

// Kind is the type of a parsed JSON value.
type Kind uint8

// The kinds of JSON value.
const (
	KindNull Kind = iota
	KindBool
	KindNumber
	KindString
	KindArray
	KindObject
)

// String returns the JSON name of the kind: "null", "boolean", "number",
// "string", "array" or "object".
func (k Kind) String() string {
	return [...]string{"null", "boolean", "number", "string", "array", "object"}[k]
}

// Value is a JSON value parsed by ParseStrict.
type Value struct {
	Kind   Kind
	Bool   bool
	Number float64
	// String is a string's value, or a number's literal as written
	// (Instance hands it on, so that a schema checks the number written,
	// not its nearest double).
	String  string
	Array   []Value
	Members []Member // in document order
}

// Member is one name/value pair of an object.
type Member struct {
	Name  string
	Value Value
	Raw   []byte // the value as written in the document (a slice of it, not a copy)
}

// ParseStrict parses one JSON document under the rules of Canonicalize, so
// that callers can validate a whole message body with the same rules that
// protect the key. Errors are *SyntaxError values, as for Canonicalize.
func ParseStrict(doc []byte) (Value, error) {
	return parseStrict(doc, MaxDepth)
}

// ParseStrictEnvelope is ParseStrict for a document that wraps values held
// to MaxDepth in one more level (a job body around its args): an object
// whose members may nest MaxDepth deep.
func ParseStrictEnvelope(doc []byte) (Value, error) {
	return parseStrict(doc, MaxDepth+1)
}

func parseStrict(doc []byte, maxDepth int) (Value, error) {
	p := parser{in: doc, max: maxDepth}
	p.skipSpace()
	v, err := p.value(0)
	if err != nil {
		return Value{}, err
	}
	p.skipSpace()
	if p.pos != len(p.in) {
		return Value{}, p.fail(ErrSyntax, "data after the top-level value")
	}
	return v, nil
}

type parser struct {
	max int // the deepest nesting allowed
	in  []byte
	pos int
}

func (p *parser) fail(rule error, detail string) error {
	return &SyntaxError{Offset: p.pos, Detail: detail, rule: rule}
}

func (p *parser) skipSpace() {
	for p.pos < len(p.in) {
		switch p.in[p.pos] {
		case ' ', '\t', '\n', '\r':
			p.pos++
		default:
			return
		}
	}
}

func (p *parser) value(depth int) (Value, error) {
	if p.pos >= len(p.in) {
		return Value{}, p.fail(ErrSyntax, "unexpected end of input")
	}
	switch c := p.in[p.pos]; {
	case c == '{':
		return p.object(depth + 1)
	case c == '[':
		return p.array(depth + 1)
	case c == '"':
		s, err := p.string()
		return Value{Kind: KindString, String: s}, err
	case c == '-' || (c >= '0' && c <= '9'):
		f, lit, err := p.number()
		return Value{Kind: KindNumber, Number: f, String: lit}, err
	case c == 't':
		return Value{Kind: KindBool, Bool: true}, p.literal("true")
	case c == 'f':
		return Value{Kind: KindBool}, p.literal("false")
	case c == 'n':
		return Value{Kind: KindNull}, p.literal("null")
	default:
		return Value{}, p.fail(ErrSyntax, fmt.Sprintf("unexpected character %q", c))
	}
}

func (p *parser) literal(word string) error {
	if !bytes.HasPrefix(p.in[p.pos:], []byte(word)) {
		return p.fail(ErrSyntax, "invalid literal")
	}
	p.pos += len(word)
	return nil
}

func (p *parser) object(depth int) (Value, error) {
	if depth > p.max {
		return Value{}, p.fail(ErrTooDeep, fmt.Sprintf("more than %d levels", MaxDepth))
	}
	p.pos++ // '{'
	// Room for a job's eight top-level members, and for four in a nested
	// object: growing one by one from nothing took up to five allocations
	// per object.
	room := 4
	if depth == 1 {
		room = 8
	}
	v := Value{Kind: KindObject, Members: make([]Member, 0, room)}
	var seen map[string]struct{} // from the 16th member; before, the members are scanned
	p.skipSpace()
	if p.pos < len(p.in) && p.in[p.pos] == '}' {
		p.pos++
		return v, nil
	}
	for {
		p.skipSpace()
		if p.pos >= len(p.in) || p.in[p.pos] != '"' {
			return Value{}, p.fail(ErrSyntax, "expected a member name")
		}
		at := p.pos
		name, err := p.string()
		if err != nil {
			return Value{}, err
		}
		if seen == nil && len(v.Members) >= 16 {
			seen = make(map[string]struct{}, 2*len(v.Members))
			for _, m := range v.Members {
				seen[m.Name] = struct{}{}
			}
		}
		dup := false
		if seen != nil {
			_, dup = seen[name]
			seen[name] = struct{}{}
		} else {
			dup = slices.ContainsFunc(v.Members, func(m Member) bool { return m.Name == name })
		}
		if dup {
			return Value{}, &SyntaxError{Offset: at, Detail: strconv.Quote(name), rule: ErrDuplicateName}
		}
		p.skipSpace()
		if p.pos >= len(p.in) || p.in[p.pos] != ':' {
			return Value{}, p.fail(ErrSyntax, "expected ':'")
		}
		p.pos++
		p.skipSpace()
		start := p.pos
		mv, err := p.value(depth)
		if err != nil {
			return Value{}, err
		}
		v.Members = append(v.Members, Member{Name: name, Value: mv, Raw: p.in[start:p.pos]})
		p.skipSpace()
		if p.pos >= len(p.in) {
			return Value{}, p.fail(ErrSyntax, "unexpected end of input in an object")
		}
		switch p.in[p.pos] {
		case ',':
			p.pos++
		case '}':
			p.pos++
			return v, nil
		default:
			return Value{}, p.fail(ErrSyntax, "expected ',' or '}'")
		}
	}
}

func (p *parser) array(depth int) (Value, error) {
	if depth > p.max {
		return Value{}, p.fail(ErrTooDeep, fmt.Sprintf("more than %d levels", MaxDepth))
	}
	p.pos++ // '['
	v := Value{Kind: KindArray, Array: []Value{}}
	p.skipSpace()
	if p.pos < len(p.in) && p.in[p.pos] == ']' {
		p.pos++
		return v, nil
	}
	for {
		p.skipSpace()
		ev, err := p.value(depth)
		if err != nil {
			return Value{}, err
		}
		v.Array = append(v.Array, ev)
		p.skipSpace()
		if p.pos >= len(p.in) {
			return Value{}, p.fail(ErrSyntax, "unexpected end of input in an array")
		}
		switch p.in[p.pos] {
		case ',':
			p.pos++
		case ']':
			p.pos++
			return v, nil
		default:
			return Value{}, p.fail(ErrSyntax, "expected ',' or ']'")
		}
	}
}

// number parses an RFC 8259 number. Integer literals beyond ±2^53 are refused
// because a double cannot tell two of them apart, and so are numbers whose
// canonical form would be such a literal; so are values that overflow.
func (p *parser) number() (float64, string, error) {
	start := p.pos
	if p.in[p.pos] == '-' {
		p.pos++
	}
	intStart := p.pos
	switch {
	case p.pos < len(p.in) && p.in[p.pos] == '0':
		p.pos++
	case p.pos < len(p.in) && p.in[p.pos] >= '1' && p.in[p.pos] <= '9':
		for p.pos < len(p.in) && isDigit(p.in[p.pos]) {
			p.pos++
		}
	default:
		return 0, "", p.fail(ErrSyntax, "invalid number")
	}
	intDigits := p.in[intStart:p.pos]
	integer := true
	if p.pos < len(p.in) && p.in[p.pos] == '.' {
		integer = false
		p.pos++
		if p.pos >= len(p.in) || !isDigit(p.in[p.pos]) {
			return 0, "", p.fail(ErrSyntax, "invalid number: no digit after '.'")
		}
		for p.pos < len(p.in) && isDigit(p.in[p.pos]) {
			p.pos++
		}
	}
	if p.pos < len(p.in) && (p.in[p.pos] == 'e' || p.in[p.pos] == 'E') {
		integer = false
		p.pos++
		if p.pos < len(p.in) && (p.in[p.pos] == '+' || p.in[p.pos] == '-') {
			p.pos++
		}
		if p.pos >= len(p.in) || !isDigit(p.in[p.pos]) {
			return 0, "", p.fail(ErrSyntax, "invalid number: no digit in the exponent")
		}
		for p.pos < len(p.in) && isDigit(p.in[p.pos]) {
			p.pos++
		}
	}
	lit := string(p.in[start:p.pos])
	if integer && (len(intDigits) > len(maxSafeInteger) ||
		(len(intDigits) == len(maxSafeInteger) && string(intDigits) > maxSafeInteger)) {
		return 0, "", &SyntaxError{Offset: start, Detail: lit, rule: ErrUnsafeInteger}
	}
	f, err := strconv.ParseFloat(lit, 64)
	if err != nil || math.IsInf(f, 0) {
		return 0, "", &SyntaxError{Offset: start, Detail: lit, rule: ErrNumberRange}
	}
	// Spelled another way (1e16), a value in (2^53, 1e21) still has an integer
	// literal beyond 2^53 as its canonical form; refusing it too keeps every
	// canonical form acceptable as input.
	if a := math.Abs(f); a > 1<<53 && a < 1e21 {
		return 0, "", &SyntaxError{Offset: start, Detail: lit, rule: ErrUnsafeInteger}
	}
	return f, lit, nil
}

func isDigit(c byte) bool { return c >= '0' && c <= '9' }

func (p *parser) string() (string, error) {
	p.pos++ // opening quote
	var out []byte
	runStart := p.pos
	for {
		if p.pos >= len(p.in) {
			return "", p.fail(ErrSyntax, "unterminated string")
		}
		c := p.in[p.pos]
		switch {
		case c == '"':
			var s string
			if out == nil { // no escape: one copy, straight from the input
				s = string(p.in[runStart:p.pos])
			} else {
				s = string(append(out, p.in[runStart:p.pos]...))
			}
			p.pos++
			return s, nil
		case c == '\\':
			out = append(out, p.in[runStart:p.pos]...)
			r, err := p.escape()
			if err != nil {
				return "", err
			}
			out = utf8.AppendRune(out, r)
			runStart = p.pos
		case c < 0x20:
			return "", p.fail(ErrSyntax, "control character in a string")
		case c < utf8.RuneSelf:
			p.pos++
		default:
			r, size := utf8.DecodeRune(p.in[p.pos:])
			if r == utf8.RuneError && size <= 1 {
				return "", p.fail(ErrInvalidUTF8, "")
			}
			p.pos += size
		}
	}
}

// escape decodes one escape sequence at p.pos (the backslash), joining a
// surrogate pair; a surrogate without its partner is an error.
func (p *parser) escape() (rune, error) {
	at := p.pos
	p.pos++
	if p.pos >= len(p.in) {
		return 0, p.fail(ErrSyntax, "unterminated escape")
	}
	c := p.in[p.pos]
	p.pos++
	switch c {
	case '"', '\\', '/':
		return rune(c), nil
	case 'b':
		return '\b', nil
	case 'f':
		return '\f', nil
	case 'n':
		return '\n', nil
	case 'r':
		return '\r', nil
	case 't':
		return '\t', nil
	case 'u':
	default:
		return 0, &SyntaxError{Offset: at, Detail: fmt.Sprintf("invalid escape \\%c", c), rule: ErrSyntax}
	}
	r, err := p.hex4()
	if err != nil {
		return 0, err
	}
	switch {
	case r >= 0xDC00 && r <= 0xDFFF:
		return 0, &SyntaxError{Offset: at, Detail: fmt.Sprintf("\\u%04x", r), rule: ErrLoneSurrogate}
	case r >= 0xD800 && r <= 0xDBFF:
		if p.pos+6 > len(p.in) || p.in[p.pos] != '\\' || p.in[p.pos+1] != 'u' {
			return 0, &SyntaxError{Offset: at, Detail: fmt.Sprintf("\\u%04x", r), rule: ErrLoneSurrogate}
		}
		p.pos += 2
		lo, err := p.hex4()
		if err != nil {
			return 0, err
		}
		if lo < 0xDC00 || lo > 0xDFFF {
			return 0, &SyntaxError{Offset: at, Detail: fmt.Sprintf("\\u%04x", r), rule: ErrLoneSurrogate}
		}
		return utf16.DecodeRune(r, lo), nil
	}
	return r, nil
}

func (p *parser) hex4() (rune, error) {
	if p.pos+4 > len(p.in) {
		return 0, p.fail(ErrSyntax, "short \\u escape")
	}
	var r rune
	for _, c := range p.in[p.pos : p.pos+4] {
		r <<= 4
		switch {
		case c >= '0' && c <= '9':
			r |= rune(c - '0')
		case c >= 'a' && c <= 'f':
			r |= rune(c - 'a' + 10)
		case c >= 'A' && c <= 'F':
			r |= rune(c - 'A' + 10)
		default:
			return 0, p.fail(ErrSyntax, "invalid \\u escape")
		}
	}
	p.pos += 4
	return r, nil
}

// Instance returns v as encoding/json decodes a document with UseNumber:
// map[string]any, []any, json.Number (the literal as written), string,
// bool or nil. It is the instance a JSON Schema validator takes, built from
// the parse already made rather than from a second one.
func (v *Value) Instance() any {
	switch v.Kind {
	case KindBool:
		return v.Bool
	case KindNumber:
		return json.Number(v.String)
	case KindString:
		return v.String
	case KindArray:
		a := make([]any, len(v.Array))
		for i := range v.Array {
			a[i] = v.Array[i].Instance()
		}
		return a
	case KindObject:
		m := make(map[string]any, len(v.Members))
		for i := range v.Members {
			m[v.Members[i].Name] = v.Members[i].Value.Instance()
		}
		return m
	default:
		return nil
	}
}

// Canonical returns the RFC 8785 form of a value ParseStrict returned: what
// Canonicalize returns for the document it was parsed from.
func (v *Value) Canonical() []byte {
	var buf bytes.Buffer
	v.appendCanonical(&buf, compareUTF16)
	return buf.Bytes()
}

// appendCanonical writes the canonical form of v, its members sorted by
// order.
func (v *Value) appendCanonical(buf *bytes.Buffer, order func(a, b string) int) {
	switch v.Kind {
	case KindNull:
		buf.WriteString("null")
	case KindBool:
		if v.Bool {
			buf.WriteString("true")
		} else {
			buf.WriteString("false")
		}
	case KindNumber:
		buf.WriteString(FormatNumber(v.Number))
	case KindString:
		appendString(buf, v.String)
	case KindArray:
		buf.WriteByte('[')
		for i := range v.Array {
			if i > 0 {
				buf.WriteByte(',')
			}
			v.Array[i].appendCanonical(buf, order)
		}
		buf.WriteByte(']')
	case KindObject:
		members := slices.Clone(v.Members)
		slices.SortFunc(members, func(a, b Member) int { return order(a.Name, b.Name) })
		buf.WriteByte('{')
		for i := range members {
			if i > 0 {
				buf.WriteByte(',')
			}
			appendString(buf, members[i].Name)
			buf.WriteByte(':')
			members[i].Value.appendCanonical(buf, order)
		}
		buf.WriteByte('}')
	}
}

// compareUTF16 orders two strings by their UTF-16 code units, all of them,
// as RFC 8785 sorts member names. It differs from byte (code point) order
// only where, at the first character that differs, one string has a
// character above U+FFFF (two units, the first in D800–DBFF) and the other
// one in U+E000–U+FFFF, which sorts after it.
func compareUTF16(a, b string) int {
	i := 0
	for i < len(a) && i < len(b) && a[i] == b[i] {
		i++
	}
	if i == len(a) || i == len(b) { // one is a prefix of the other
		return len(a) - len(b)
	}
	for i > 0 && !utf8.RuneStart(a[i]) { // back to the first character that differs
		i--
	}
	ra, _ := utf8.DecodeRuneInString(a[i:])
	rb, _ := utf8.DecodeRuneInString(b[i:])
	return utf16Rank(ra) - utf16Rank(rb)
}

// utf16Rank maps a character to a number that orders characters as their
// UTF-16 encodings do: characters above U+FFFF (surrogate pairs, in code
// point order among themselves) come after U+D7FF and before U+E000.
func utf16Rank(r rune) int {
	switch {
	case r >= 0x10000:
		return 0xD800 + int(r-0x10000)
	case r >= 0xE000:
		return int(r) + 0x100000
	}
	return int(r)
}

const hexDigits = "0123456789abcdef"

func appendString(buf *bytes.Buffer, s string) {
	buf.WriteByte('"')
	start := 0
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c >= 0x20 && c != '"' && c != '\\' {
			continue
		}
		buf.WriteString(s[start:i])
		switch c {
		case '"':
			buf.WriteString(`\"`)
		case '\\':
			buf.WriteString(`\\`)
		case '\b':
			buf.WriteString(`\b`)
		case '\f':
			buf.WriteString(`\f`)
		case '\n':
			buf.WriteString(`\n`)
		case '\r':
			buf.WriteString(`\r`)
		case '\t':
			buf.WriteString(`\t`)
		default:
			buf.WriteString(`\u00`)
			buf.WriteByte(hexDigits[c>>4])
			buf.WriteByte(hexDigits[c&0xF])
		}
		start = i + 1
	}
	buf.WriteString(s[start:])
	buf.WriteByte('"')
}

// FormatNumber writes a finite double as ECMAScript's Number.prototype.toString
// does (ECMA-262 "Number::toString"), which is the form RFC 8785 requires:
// shortest round-trip digits, exponent form below 1e-6 and from 1e21 up.
func FormatNumber(f float64) string {
	if f == 0 {
		return "0" // -0 too
	}
	var out []byte
	if f < 0 {
		out = append(out, '-')
		f = -f
	}
	// Shortest digits d1.d2d3…e±x; ECMAScript's n is x+1 with the value 0.digits×10^n.
	e := strconv.AppendFloat(nil, f, 'e', -1, 64)
	mant, exp, _ := bytes.Cut(e, []byte{'e'})
	digits := make([]byte, 0, len(mant))
	for _, c := range mant {
		if c != '.' {
			digits = append(digits, c)
		}
	}
	x, _ := strconv.Atoi(string(exp))
	n, k := x+1, len(digits)
	switch {
	case k <= n && n <= 21:
		out = append(out, digits...)
		for range n - k {
			out = append(out, '0')
		}
	case 0 < n && n <= 21:
		out = append(out, digits[:n]...)
		out = append(out, '.')
		out = append(out, digits[n:]...)
	case -6 < n && n <= 0:
		out = append(out, '0', '.')
		for range -n {
			out = append(out, '0')
		}
		out = append(out, digits...)
	default:
		out = append(out, digits[0])
		if k > 1 {
			out = append(out, '.')
			out = append(out, digits[1:]...)
		}
		out = append(out, 'e')
		if n-1 >= 0 {
			out = append(out, '+')
		}
		out = strconv.AppendInt(out, int64(n-1), 10)
	}
	return string(out)
}
