package worker

import (
	"errors"
	"testing"
)

// TestDeliveryLimitRules: the table of deliveryLimit, case by case: which
// hand-back spends a try, against what it counts, and when the job stops.
func TestDeliveryLimitRules(t *testing.T) {
	t.Parallel()
	why := errors.New("downstream refused")
	spent := func(tries int64) verdict { v := retryAfter(0, why); v.tries = tries; return v }
	for _, c := range []struct {
		name       string
		v          verdict
		deliveries int // counted deliveries of the message
		stop       bool
	}{
		{"an answer never stops", answered(OutcomeOK), 99, false},
		{"a dead letter is already stopped", deadLettered("invalid", why), 99, false},
		{"an uncounted hand-back never stops, however often", retryUncounted(0, why), 99, false},
		{"a call with a row: below the limit of tries", spent(2), 99, false},
		{"a call with a row: at the limit of tries", spent(3), 1, true},
		{"a call with a row: its deliveries do not count", spent(1), 99, false},
		{"no row: below the limit of deliveries", spent(0), 2, false},
		{"no row: at the limit of deliveries", spent(0), 3, true},
	} {
		l := deliveryLimit{max: 3}
		if got := l.reached(c.v, c.deliveries); (got != nil) != c.stop || (got != nil && !errors.Is(got, why)) {
			t.Errorf("%s: reached = %v, want stop=%v wrapping the cause", c.name, got, c.stop)
		}
	}

	l := deliveryLimit{max: 3}
	// A call's failures restart at the limit, so a requeue gets a full set.
	for failures, want := range map[int64][2]int64{0: {1, 1}, 1: {2, 2}, 2: {3, 0}, 7: {8, 0}} {
		if try, record := l.failure(failures); try != want[0] || record != want[1] {
			t.Errorf("failure(%d) = try %d, record %d; want %v", failures, try, record, want)
		}
	}
	if l.exhausts(2) || !l.exhausts(3) {
		t.Error("exhausts: want the try at the limit, not before")
	}
	// Uncounted hand-backs do not count as deliveries; an answer forgets them.
	l.ended(7, retryUncounted(0, why))
	l.ended(7, retryUncounted(0, why))
	l.ended(7, retryAfter(0, why))
	if got := l.deliveries(7, 5); got != 3 {
		t.Errorf("5 deliveries, 2 handed back uncounted: %d count, want 3", got)
	}
	if got := l.deliveries(8, 5); got != 5 {
		t.Errorf("another message: %d count, want 5", got)
	}
	l.ended(7, answered(OutcomeOK))
	if got := l.deliveries(7, 5); got != 5 {
		t.Errorf("after its answer: %d count, want 5", got)
	}
	// A job without a row whose worker dies every time stops on arrival
	// past crashLoop × max deliveries.
	if l.crashLooping(crashLoop*3) != nil || l.crashLooping(crashLoop*3+1) == nil {
		t.Errorf("crashLooping: want a stop past %d deliveries only", crashLoop*3)
	}
}
