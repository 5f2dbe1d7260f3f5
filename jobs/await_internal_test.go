package jobs

import "testing"

// TestWhichAnswerToACallStands: of two results read for one tool_use_id,
// the later stands, except a result awaiting approval after a final one
// (a pending answer that the decision overtook); and a wait ends at the
// first result, or with UntilFinal at a final one.
func TestWhichAnswerToACallStands(t *testing.T) {
	t.Parallel()
	pending := &Result{Status: StatusAwaitingApproval}
	ok := &Result{Status: StatusOK}
	denied := &Result{Status: StatusDenied}
	unknown := &Result{Status: StatusIndeterminate}
	for _, c := range []struct {
		name       string
		prev, next *Result
		want       bool
	}{
		{"first", nil, pending, true},
		{"final after pending", pending, ok, true},
		{"pending after pending", pending, pending, true},
		{"pending after final", ok, pending, false},
		{"pending after denied", denied, pending, false},
		{"final after final", unknown, ok, true},
	} {
		if got := c.next.Supersedes(c.prev); got != c.want {
			t.Errorf("%s: supersedes %v, want %v", c.name, got, c.want)
		}
	}
	for _, c := range []struct {
		name  string
		final bool
		r     *Result
		want  bool
	}{
		{"none", false, nil, false},
		{"pending", false, pending, true},
		{"pending, until final", true, pending, false},
		{"denied, until final", true, denied, true},
		{"ok, until final", true, ok, true},
	} {
		if got := (awaitConfig{final: c.final}).enough(c.r); got != c.want {
			t.Errorf("%s: enough %v, want %v", c.name, got, c.want)
		}
	}
}
