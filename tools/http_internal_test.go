package tools

import (
	"io"
	"net/http"
	"strings"
	"testing"
)

// TestABodyThatIsNotItsLengthIsNotSent: a request whose body is shorter or
// longer than its ContentLength is refused before anything is sent, as
// net/http refuses it, and its body is closed.
func TestABodyThatIsNotItsLengthIsNotSent(t *testing.T) {
	for _, tc := range []struct {
		body   string
		length int64
	}{{"{}", 3}, {`{"a":1}`, 2}} {
		var sent bool
		next := roundTripFunc(func(*http.Request) (*http.Response, error) { sent = true; return nil, io.EOF })
		body := &closeCounter{Reader: strings.NewReader(tc.body)}
		req, _ := http.NewRequest("POST", "http://127.0.0.1:1/", body)
		req.ContentLength = tc.length
		if _, err := (noReplay{next: next}).RoundTrip(req); err == nil || !strings.Contains(err.Error(), "ContentLength") {
			t.Errorf("body %q of ContentLength %d: err %v, want a ContentLength error", tc.body, tc.length, err)
		}
		if sent {
			t.Errorf("body %q of ContentLength %d was handed to the transport", tc.body, tc.length)
		}
		if body.closes != 1 {
			t.Errorf("body %q of ContentLength %d closed %d times, want 1", tc.body, tc.length, body.closes)
		}
	}
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

type closeCounter struct {
	io.Reader
	closes int
}

func (c *closeCounter) Close() error { c.closes++; return nil }
