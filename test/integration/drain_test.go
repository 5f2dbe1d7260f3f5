package integration

import (
	"context"
	"fmt"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/toolq/toolq/demo/sandbox"
	"github.com/toolq/toolq/internal/testenv"
	"github.com/toolq/toolq/jobs"
	"github.com/toolq/toolq/ledger"
)

// TestSIGTERMDrains: a worker process gets SIGTERM while tools run. The
// running calls finish and are recorded, the process exits 0, and nothing is
// lost: another worker answers every job, each paid once.
func TestSIGTERMDrains(t *testing.T) {
	t.Parallel()
	o := options{ackWait: time.Second, faults: sandbox.Faults{LatencyMS: 700}}
	e := setup(t, o)
	h := e.startHelper(helperSpec{AckWaitMS: 1000})
	var js []*jobs.Job
	for i := range 6 {
		j := job(conv(t), 0, "send_payment", payment(fmt.Sprintf("drain_%d", i)))
		e.publish(j)
		js = append(js, j)
	}
	testenv.Eventually(t, 10*time.Second, "tools running in the worker process", func() bool {
		rows, _ := e.store.List(context.Background(), ledger.Filter{State: ledger.InFlight})
		return len(rows) > 0
	})
	if err := h.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	last, err := h.wait(t, 30*time.Second)
	if err != nil || !strings.HasPrefix(last, "drained") {
		t.Fatalf("worker process ended with %q, %v\n%s", last, err, e.logs.String())
	}
	if rows, _ := e.store.List(context.Background(), ledger.Filter{State: ledger.InFlight}); len(rows) != 0 {
		t.Fatalf("the drain left claims in flight: %+v", rows)
	}
	e.startWorker(o, nil)
	for _, j := range js {
		if r := e.await(j); r.Status != jobs.StatusOK || r.Duplicate {
			t.Fatalf("result %+v", r)
		}
	}
	e.settled()
	if n := len(e.sandbox.Payments()); n != len(js) {
		t.Fatalf("%d payments for %d jobs", n, len(js))
	}
	if n := len(e.results(conv(t))); n != len(js) {
		t.Fatalf("%d results for %d jobs", n, len(js))
	}
}
