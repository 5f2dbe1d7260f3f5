package progress_test

import (
	"regexp"
	"strings"
	"testing"

	"github.com/toolq/toolq/internal/progress"
)

// TestPlainLines: a writer that is not a terminal gets plain lines, the last
// at Finish, and nothing after it.
func TestPlainLines(t *testing.T) {
	t.Parallel()
	var b strings.Builder
	r := progress.New(&b, "replay", 4)
	for i := int64(1); i <= 3; i++ {
		r.Set(i, 0)
	}
	r.Finish()
	r.Set(4, 0)
	r.Finish()
	if !regexp.MustCompile(`^replay: 3/4 \(75%\), [0-9.]+/s(, eta \S+)?\n$`).MatchString(b.String()) {
		t.Fatalf("got %q", b.String())
	}
	var nilReporter *progress.Reporter
	nilReporter.Set(1, 1)
	nilReporter.Finish()
	b.Reset()
	u := progress.New(&b, "purge", 0)
	u.Set(10, 0)
	u.Finish()
	if !strings.HasPrefix(b.String(), "purge: 10, ") {
		t.Fatalf("unknown total: %q", b.String())
	}
}
