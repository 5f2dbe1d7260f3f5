package simulate_test

import (
	"context"
	"sync"
	"testing"

	"github.com/toolq/toolq/demo/simulate"
)

// recorder is a side that keeps what it was asked, per conversation.
type recorder struct {
	mu     sync.Mutex
	events map[string][]string
}

func (r *recorder) Conversation(_ context.Context, id string) (simulate.Conversation, error) {
	return &recConv{r: r, id: id}, nil
}

type recConv struct {
	r     *recorder
	id    string
	index int64
}

func (c *recConv) log(e string) {
	c.r.mu.Lock()
	defer c.r.mu.Unlock()
	c.r.events[c.id] = append(c.r.events[c.id], e)
}

func (c *recConv) NextTurn() simulate.Turn     { return &recTurn{c: c} }
func (c *recConv) Close(context.Context) error { return nil }

type recTurn struct{ c *recConv }

func (t *recTurn) Index() int64 { return t.c.index }
func (t *recTurn) Attempt()     { t.c.log("attempt") }
func (t *recTurn) Cut(c simulate.Call) {
	t.c.log("cut " + c.ToolUseID)
}
func (t *recTurn) Dispatch(_ context.Context, c simulate.Call) error {
	t.c.log("dispatch " + c.ToolUseID)
	return nil
}
func (t *recTurn) Complete(context.Context) error {
	t.c.log("complete")
	t.c.index++
	return nil
}

func play(t *testing.T, cfg simulate.Config) (simulate.Stats, map[string][]string) {
	t.Helper()
	r := &recorder{events: map[string][]string{}}
	st, err := simulate.Run(context.Background(), cfg, r)
	if err != nil {
		t.Fatal(err)
	}
	return st, r.events
}

// TestRunPlaysTheRules: a failure after dispatch is retried once, one before
// dispatch abandons the call, a resend plays the turn again; the same seed
// plays the same failures whatever the concurrency.
func TestRunPlaysTheRules(t *testing.T) {
	t.Parallel()
	st, ev := play(t, simulate.Config{Turns: 1, FailureRate: 1, AfterDispatch: 1})
	if got := ev["sim-0"]; len(got) != 4 || got[1] != "dispatch toolu_0_0" || got[3] != "dispatch toolu_0_1" {
		t.Fatalf("after dispatch, twice: %q", got)
	}
	if st.Dispatches != 2 || st.AfterDispatch != 2 || st.GaveUp != 1 || st.Committed != 0 {
		t.Fatalf("%+v", st)
	}
	st, ev = play(t, simulate.Config{Turns: 1, FailureRate: 1, AfterDispatch: 0, ResendRate: 1})
	if got := ev["sim-0"]; len(got) != 4 || got[1] != "cut toolu_0_0" || got[3] != "cut toolu_0_1" {
		t.Fatalf("cut, resent, cut: %q", got)
	}
	if st.NotRun != 2 || st.Dispatches != 0 || st.Resends != 1 || st.GaveUp != 1 {
		t.Fatalf("%+v", st)
	}

	cfg := simulate.Config{Turns: 500, FailureRate: 0.3, AfterDispatch: 0.5, ResendRate: 0.5, Seed: 9}
	a, evA := play(t, cfg)
	cfg.Concurrency = 1
	b, evB := play(t, cfg)
	if a != b || len(evA) != 50 {
		t.Fatalf("%+v then %+v over %d conversations", a, b, len(evA))
	}
	for id, e := range evA {
		if len(e) != len(evB[id]) {
			t.Fatalf("%s: %q then %q", id, e, evB[id])
		}
	}
	if a.Turns != 500 || a.Committed+a.GaveUp != a.Turns || a.Resends == 0 || a.NotRun == 0 {
		t.Fatalf("%+v", a)
	}
}
