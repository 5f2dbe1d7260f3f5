package embedded_test

import (
	"testing"

	"github.com/toolq/toolq/embedded"
)

func TestRedactURLHidesPasswordsAndTokens(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ in, want string }{
		{"nats://127.0.0.1:4222", "nats://127.0.0.1:4222"},
		{"nats://toolq:s3cret@nats:4222", "nats://toolq:redacted@nats:4222"},
		{"nats://s3cret@nats:4222", "nats://redacted@nats:4222"},
		{"tls://a:s3cret@n1:4222,tls://a:s3cret@n2:4222", "tls://a:redacted@n1:4222,tls://a:redacted@n2:4222"},
		{"nats1:4222", "nats1:4222"},
		{"postgres://toolq:s3cret@db:5432/toolq?sslmode=verify-full", "postgres://toolq:redacted@db:5432/toolq?sslmode=verify-full"},
		{"nats://a:s3cret%zz@n1", "redacted"},
	} {
		if got := embedded.RedactURL(tc.in); got != tc.want {
			t.Errorf("RedactURL(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}
