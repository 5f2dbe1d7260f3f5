package tools

import (
	"bufio"
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/url"
	"os"
	"regexp"
	"slices"
	"strings"
	"unicode/utf16"
	"unicode/utf8"
)

// Redacted is what a secret of the registry is shown as.
const Redacted = "[redacted]"

// minSecret is the length below which a value from a ${…} reference is not
// looked for in text to redact: replacing every "1" or "on" would garble
// what is shown without hiding anything worth hiding.
const minSecret = 4

// secrets are the values a registry file's ${…} references gave a tool's
// executor: downstream credentials, which toolq never shows. Whatever an
// executor hands back to be shown (a result, through redactJSON; an error's
// message; a span's url.full; its Downstream; a stdio server's standard
// error) goes through redact.
type secrets []string

// add keeps v as a secret, unless it is too short to look for.
func (s *secrets) add(v string) {
	if len(v) >= minSecret && !slices.Contains(*s, v) {
		*s = append(*s, v)
	}
}

// forms are the ways v may be written where toolq shows it: as it is;
// URL-escaped as a path or a query writes it, and unescaped (a variable
// may hold it escaped, as a URL needs it); JSON-escaped as encoders write
// it in a string ("\/" for "/", "\u003c" or "\u003C" for "<", with or
// without HTML escaping, with or without what is not ASCII escaped).
// Forms shorter than minSecret are left out.
func forms(v string) []string {
	var out []string
	keep := func(f string) {
		if len(f) >= minSecret && !slices.Contains(out, f) {
			out = append(out, f)
		}
	}
	keep(v)
	keep(url.PathEscape(v))
	keep(url.QueryEscape(v))
	keep(strings.ReplaceAll(url.QueryEscape(v), "+", "%20"))
	if u, err := url.PathUnescape(v); err == nil {
		keep(u)
	}
	if u, err := url.QueryUnescape(v); err == nil {
		keep(u)
	}
	for _, html := range []bool{true, false} {
		var b strings.Builder
		enc := json.NewEncoder(&b)
		enc.SetEscapeHTML(html)
		enc.Encode(v)
		j := strings.TrimSuffix(b.String(), "\n")
		j = j[1 : len(j)-1] // the quotes
		for _, a := range []string{j, asciiJSON(j)} {
			upper := unicodeEscape.ReplaceAllStringFunc(a, strings.ToUpper)
			upper = strings.ReplaceAll(upper, `\U`, `\u`)
			for _, f := range []string{a, upper} {
				keep(f)
				keep(strings.ReplaceAll(f, "/", `\/`))
			}
		}
	}
	return out
}

// asciiJSON is j, the inside of a JSON string, with its characters beyond
// ASCII escaped as \uXXXX (UTF-16), as encoders that write only ASCII do.
func asciiJSON(j string) string {
	var b strings.Builder
	for _, r := range j {
		switch {
		case r < utf8.RuneSelf:
			b.WriteRune(r)
		case r > 0xFFFF:
			r1, r2 := utf16.EncodeRune(r)
			fmt.Fprintf(&b, `\u%04x\u%04x`, r1, r2)
		default:
			fmt.Fprintf(&b, `\u%04x`, r)
		}
	}
	return b.String()
}

// unicodeEscape matches a JSON \uXXXX escape.
var unicodeEscape = regexp.MustCompile(`\\u[0-9a-fA-F]{4}`)

// forms are the forms of every secret (see forms), the longest first.
func (s secrets) forms() []string {
	var out []string
	for _, v := range s {
		for _, f := range forms(v) {
			if !slices.Contains(out, f) {
				out = append(out, f)
			}
		}
	}
	slices.SortStableFunc(out, func(a, b string) int { return len(b) - len(a) })
	return out
}

// redact is text with every form of every secret (see forms) replaced by
// Redacted. Where forms overlap (a secret that contains another, or two
// that share bytes), the bytes of both are one Redacted: no part of either
// is left.
func (s secrets) redact(text string) string {
	if len(s) == 0 {
		return text
	}
	var hidden []bool
	for _, f := range s.forms() {
		for from := 0; ; {
			i := strings.Index(text[from:], f)
			if i < 0 {
				break
			}
			if hidden == nil {
				hidden = make([]bool, len(text))
			}
			for j := from + i; j < from+i+len(f); j++ {
				hidden[j] = true
			}
			from += i + 1
		}
	}
	if hidden == nil {
		return text
	}
	var b strings.Builder
	for i := 0; i < len(text); i++ {
		switch {
		case !hidden[i]:
			b.WriteByte(text[i])
		case i == 0 || !hidden[i-1]:
			b.WriteString(Redacted)
		}
	}
	return b.String()
}

// snippetBytes is how much of a downstream's answer an error quotes.
const snippetBytes = 512

// snippet is body on one line, its secrets redacted, cut at snippetBytes.
// It is redacted before it is cut, so that no secret is cut in two and
// missed; and what the cut leaves at its end that begins a secret (of a
// body cut short before it came here) is dropped.
func (s secrets) snippet(body []byte) string {
	text := s.redact(oneLine(string(body)))
	if len(text) <= snippetBytes {
		return text
	}
	return s.dropSecretPrefix(text[:snippetBytes]) + "…"
}

// dropSecretPrefix is text without its longest end that is the beginning
// of a form of a secret.
func (s secrets) dropSecretPrefix(text string) string {
	cut := 0
	for _, f := range s.forms() {
		for k := min(len(f)-1, len(text)); k > cut; k-- {
			if strings.HasSuffix(text, f[:k]) {
				cut = k
				break
			}
		}
	}
	return text[:len(text)-cut]
}

// redactJSON is out, a successful call's output, with its secrets
// redacted and still valid JSON: the forms of a secret in its text are
// replaced (inside a string, a whole escaped form replaced by Redacted
// leaves a valid string); if that did not leave valid JSON, or a string
// still decodes to a secret (escaped in a way the forms do not list), the
// output is decoded, its strings redacted, and encoded again.
func (s secrets) redactJSON(out json.RawMessage) json.RawMessage {
	if len(s) == 0 || len(out) == 0 {
		return out
	}
	text := json.RawMessage(s.redact(string(out)))
	if json.Valid(text) {
		if v, changed := s.redactValue(decodeJSON(text)); changed {
			return encodeJSON(v)
		}
		return text
	}
	v, _ := s.redactValue(decodeJSON(out))
	return encodeJSON(v)
}

// redactValue is v, a decoded JSON value, with the secrets in its strings
// and member names redacted, and whether any were.
func (s secrets) redactValue(v any) (any, bool) {
	switch v := v.(type) {
	case string:
		r := s.redact(v)
		return r, r != v
	case []any:
		changed := false
		for i, e := range v {
			var c bool
			v[i], c = s.redactValue(e)
			changed = changed || c
		}
		return v, changed
	case map[string]any:
		out := make(map[string]any, len(v))
		changed := false
		for k, e := range v {
			r, c := s.redactValue(e)
			rk := s.redact(k)
			out[rk] = r
			changed = changed || c || rk != k
		}
		return out, changed
	}
	return v, false
}

func decodeJSON(data []byte) any {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	var v any
	if dec.Decode(&v) != nil {
		return nil
	}
	return v
}

func encodeJSON(v any) json.RawMessage {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	enc.Encode(v)
	return bytes.TrimSuffix(b.Bytes(), []byte("\n"))
}

// redactError is err with its message and its cause's redacted: an *Error
// keeps its Outcome, Code and RetryAfter; its cause, still reachable with
// errors.Is and errors.As, is shown redacted.
func (s secrets) redactError(err error) error {
	if err == nil || len(s) == 0 {
		return err
	}
	var e *Error
	if errors.As(err, &e) {
		r := *e
		r.Message = s.redact(e.Message)
		if e.Err != nil {
			r.Err = redactedError{msg: s.redact(e.Err.Error()), err: e.Err}
		}
		return &r
	}
	return redactedError{msg: s.redact(err.Error()), err: err}
}

// redactedError shows err as msg, its secrets redacted.
type redactedError struct {
	msg string
	err error
}

func (e redactedError) Error() string { return e.msg }
func (e redactedError) Unwrap() error { return e.err }

// ref matches a ${…} reference: ${file:/path}, ${VAR} or ${VAR:-default}.
var ref = regexp.MustCompile(`\$\{(?:file:([^}]+)|([A-Za-z_][A-Za-z0-9_]*)(:-([^}]*))?)\}`)

// substitution is where, in an expanded string, a reference's value is.
type substitution struct{ start, end int }

// expand replaces the ${…} references of s:
//
//	${VAR}             the environment variable VAR (getenv); unset or empty: an error naming it
//	${VAR:-default}    VAR, or default when it is unset or empty
//	${file:/path}      the file's content, one trailing newline trimmed; unreadable or empty: an error naming the path
//
// It returns where each value (not a default) lies in the result. Errors
// name the variable or the file, never a value.
func expand(s string, getenv func(string) string) (string, []substitution, error) {
	var (
		b       strings.Builder
		subs    []substitution
		missing []string
		last    int
	)
	for _, m := range ref.FindAllStringSubmatchIndex(s, -1) {
		b.WriteString(s[last:m[0]])
		last = m[1]
		var v string
		switch {
		case m[2] >= 0:
			path := s[m[2]:m[3]]
			data, err := os.ReadFile(path)
			if err != nil {
				var pe *os.PathError
				if errors.As(err, &pe) {
					err = pe.Err
				}
				return "", nil, fmt.Errorf("${file:%s}: cannot read the file: %v", path, err)
			}
			v = strings.TrimSuffix(strings.TrimSuffix(string(data), "\n"), "\r")
			if v == "" {
				return "", nil, fmt.Errorf("${file:%s}: the file is empty", path)
			}
		default:
			name := s[m[4]:m[5]]
			if v = getenv(name); v == "" {
				if m[6] >= 0 {
					b.WriteString(s[m[8]:m[9]])
					continue
				}
				missing = append(missing, name)
				continue
			}
		}
		subs = append(subs, substitution{b.Len(), b.Len() + len(v)})
		b.WriteString(v)
	}
	if len(missing) > 0 {
		return "", nil, fmt.Errorf("environment variable %s is not set", strings.Join(missing, ", "))
	}
	b.WriteString(s[last:])
	return b.String(), subs, nil
}

// expandSecret is expand, the values it put in kept as secrets.
func expandSecret(s string, getenv func(string) string, into *secrets) (string, error) {
	out, subs, err := expand(s, getenv)
	for _, sub := range subs {
		into.add(out[sub.start:sub.end])
	}
	return out, err
}

// expandURL is expand for a URL: the values it put in are kept as secrets,
// except what of them is the URL's scheme, host or port, which is shown
// as the downstream's name anyway (${TOOLQ_SANDBOX_URL} giving
// http://127.0.0.1:8089 is not a secret; a token in the path or the
// password of its userinfo is).
func expandURL(s string, getenv func(string) string, into *secrets) (string, error) {
	out, subs, err := expand(s, getenv)
	if err != nil || len(subs) == 0 {
		return out, err
	}
	shown := make([]bool, len(out)) // the bytes of the scheme, host and port
	if u, perr := url.Parse(out); perr == nil && u.Scheme != "" && u.Host != "" {
		scheme := len(u.Scheme) + len("://")
		for i := 0; i < scheme && i < len(out); i++ {
			shown[i] = true
		}
		rest := out[scheme:]
		if at := strings.IndexByte(rest, '@'); at >= 0 && u.User != nil {
			if fromReference(subs, scheme, scheme+at) {
				addUserinfo(u.User, into)
			}
			scheme += at + 1
			rest = out[scheme:]
		}
		if strings.HasPrefix(rest, u.Host) {
			for i := scheme; i < scheme+len(u.Host); i++ {
				shown[i] = true
			}
		}
	}
	for _, sub := range subs {
		start := -1
		for i := sub.start; i <= sub.end; i++ {
			secret := i < sub.end && !shown[i]
			switch {
			case secret && start < 0:
				start = i
			case !secret && start >= 0:
				into.add(out[start:i])
				start = -1
			}
		}
	}
	return out, nil
}

// fromReference says whether a reference's value lies in out[start:end].
func fromReference(subs []substitution, start, end int) bool {
	for _, sub := range subs {
		if sub.start < end && start < sub.end {
			return true
		}
	}
	return false
}

// addUserinfo keeps a URL's userinfo as secrets: its user name and its
// password, each alone and both as the URL writes them (escaped), as they
// are decoded, and as the Basic Authorization net/http makes of them.
func addUserinfo(user *url.Userinfo, into *secrets) {
	name := user.Username()
	into.add(name)
	into.add(user.String())
	if pass, ok := user.Password(); ok {
		into.add(pass)
		into.add(name + ":" + pass)
		into.add(base64.StdEncoding.EncodeToString([]byte(name + ":" + pass)))
	}
}

// copyLines copies r to w line by line, each line's secrets redacted, until
// r ends. A line longer than its buffer is copied in parts, each redacted.
func (s secrets) copyLines(w io.Writer, r io.Reader) {
	br := bufio.NewReaderSize(r, 64<<10)
	for {
		line, err := br.ReadSlice('\n')
		if len(line) > 0 {
			io.WriteString(w, s.redact(string(line)))
		}
		if err != nil && err != bufio.ErrBufferFull {
			return
		}
	}
}
