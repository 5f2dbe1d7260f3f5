package tools

import (
	"errors"
	"fmt"
	"net/url"
	"os"
	"regexp"
	"slices"
	"strings"
)

// Redacted is what a secret of the registry is shown as.
const Redacted = "[redacted]"

// minSecret is the length below which a value from a ${…} reference is not
// looked for in text to redact: replacing every "1" or "on" would garble
// what is shown without hiding anything worth hiding.
const minSecret = 4

// secrets are the values a registry file's ${…} references gave a tool's
// executor: downstream credentials, which toolq never shows. Whatever an
// executor hands back to be shown (an error's message, a span's url.full,
// its Downstream) goes through redact.
type secrets []string

// add keeps v as a secret, unless it is too short to look for.
func (s *secrets) add(v string) {
	if len(v) >= minSecret && !slices.Contains(*s, v) {
		*s = append(*s, v)
	}
}

// redact is text with every secret replaced by Redacted, and the same in
// its URL-escaped forms (a secret in a URL's path is shown escaped).
func (s secrets) redact(text string) string {
	for _, v := range s {
		text = strings.ReplaceAll(text, v, Redacted)
		if e := url.PathEscape(v); e != v {
			text = strings.ReplaceAll(text, e, Redacted)
		}
		if e := url.QueryEscape(v); e != v {
			text = strings.ReplaceAll(text, e, Redacted)
		}
	}
	return text
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
