package operate_test

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolq/toolq/jobs"
	"github.com/toolq/toolq/operate"
)

// TestAListingOfLargeDeadLettersDoesNotOverrunTheConnection: 100 dead
// letters of 1000 KB each (a job body near the server's 1 MB limit) are
// 100 MB; a listing fetches min(pending, 256) of them in one pull, more
// than the server buffers for a client (64 MB by default).
func TestAListingOfLargeDeadLettersDoesNotOverrunTheConnection(t *testing.T) {
	n, direct := withDeadLetters(t, 0)
	body := `{"tool_use_id":"toolu_x","pad":"` + strings.Repeat("x", 1000<<10) + `"}`
	for i := range 100 {
		publishDeadLetter(t, direct, jobs.DLQMaxDeliver, uint64(i+1), body)
	}
	var disconnects atomic.Int32
	nc, err := nats.Connect(n.URL, nats.DisconnectErrHandler(func(_ *nats.Conn, err error) {
		disconnects.Add(1)
		t.Logf("disconnected: %v", err)
	}), nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) { t.Logf("async error: %v", err) }))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	began := time.Now()
	got, err := operate.ListDeadLetters(ctx, js, "")
	t.Logf("listed %d in %v: %v", len(got), time.Since(began).Round(time.Millisecond), err)
	if err != nil || len(got) != 100 || disconnects.Load() > 0 {
		t.Fatalf("listed %d of 100 dead letters (%v), %d disconnect(s)", len(got), err, disconnects.Load())
	}
}
