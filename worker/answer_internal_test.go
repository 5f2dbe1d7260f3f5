package worker

import (
	"testing"

	"github.com/toolq/toolq/jobs"
)

// TestAnswerIDNamesOneAnswer: the same answer to a job gets the same id
// however it was published (the delivery that settled the call, or a
// duplicate answered from the row), and each other answer to the job
// another: a run after a rejection, a run after a release, a resolution,
// the job published again.
func TestAnswerIDNamesOneAnswer(t *testing.T) {
	t.Parallel()
	result := func(status jobs.Status, attempts int, code string) *jobs.Result {
		r := &jobs.Result{Status: status, Attempts: attempts}
		if code != "" {
			r.Error = &jobs.ResultError{Code: code}
		}
		return r
	}
	for _, c := range []struct {
		name     string
		a, b     *jobs.Result
		ledgered bool
		same     bool
	}{
		{"the settling delivery and a duplicate from the row", result(jobs.StatusOK, 1, ""), result(jobs.StatusOK, 1, ""), true, true},
		{"indeterminate, then the same from the row", result(jobs.StatusIndeterminate, 2, "holder_lost"), result(jobs.StatusIndeterminate, 2, "holder_lost"), true, true},
		{"indeterminate, then resolved as completed", result(jobs.StatusIndeterminate, 1, "reset"), result(jobs.StatusOK, 1, ""), true, false},
		{"indeterminate, then released and run again", result(jobs.StatusIndeterminate, 1, "reset"), result(jobs.StatusIndeterminate, 2, "reset"), true, false},
		{"rejected, then run", result(jobs.StatusRejected, 0, "unknown_tool"), result(jobs.StatusOK, 1, ""), true, false},
		{"rejected, then rejected otherwise", result(jobs.StatusRejected, 0, "unknown_tool"), result(jobs.StatusRejected, 0, "invalid_args"), false, false},
		{"rejected twice alike", result(jobs.StatusRejected, 0, "invalid_args"), result(jobs.StatusRejected, 0, "invalid_args"), false, true},
		{"no ledger: a redelivery run again", result(jobs.StatusOK, 1, ""), result(jobs.StatusOK, 2, ""), false, true},
		{"no ledger: failed, then run", result(jobs.StatusError, 1, "http_404"), result(jobs.StatusOK, 2, ""), false, false},
	} {
		a, b := answerID(c.a, c.ledgered, 7), answerID(c.b, c.ledgered, 7)
		if (a == b) != c.same {
			t.Errorf("%s: %q and %q, want same=%v", c.name, a, b, c.same)
		}
		// The same answer to the job published again, at another sequence,
		// is another answer: its agent waits for what comes after it.
		if again := answerID(c.b, c.ledgered, 8); again == b {
			t.Errorf("%s: %q for the job at two sequences", c.name, again)
		}
	}
}
