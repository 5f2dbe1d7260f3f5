package inbox_test

import (
	"fmt"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"testing"

	"github.com/toolq/toolq/inbox"
	"github.com/toolq/toolq/internal/testenv"
)

// TestGuessingTokensIsThrottled: a token given as token_sha256 has no
// length rule (the file cannot tell), so the login is where guessing is
// slowed: after a few wrong tokens from one client, the login refuses
// (429, with Retry-After) without looking at the token, the right one
// included, and the refusals are logged a few times, not once each.
func TestGuessingTokensIsThrottled(t *testing.T) {
	t.Parallel()
	var logs testenv.Buffer
	b := setup(t, inbox.Config{Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	guesser := b.browser(t)
	const guesses = 300
	wrong, refused := 0, 0
	for i := range guesses {
		res := guesser.do(http.MethodPost, "/api/login", map[string]string{"token": fmt.Sprintf("guess-%06d", i)})
		switch res.status {
		case http.StatusUnauthorized:
			wrong++
		case http.StatusTooManyRequests:
			refused++
			if s, err := strconv.Atoi(res.header.Get("Retry-After")); err != nil || s < 1 || res.code() != "throttled" {
				t.Fatalf("throttled: Retry-After %q, %s", res.header.Get("Retry-After"), res.body)
			}
		default:
			t.Fatalf("guess %d: %d %s", i, res.status, res.body)
		}
	}
	if wrong > 10 || refused != guesses-wrong {
		t.Fatalf("%d wrong tokens from one client looked at, %d throttled; want a few looked at, the rest throttled", wrong, refused)
	}
	if res := guesser.do(http.MethodPost, "/api/login", map[string]string{"token": aliceToken}); res.status != http.StatusTooManyRequests {
		t.Fatalf("the right token from the throttled client: %d, want 429 (the token is not looked at)", res.status)
	}
	if n := strings.Count(logs.String(), "level=WARN"); n < 1 || n > 3 {
		t.Fatalf("%d warnings for %d refused logins:\n%s", n, guesses+1, logs.String())
	}
}
