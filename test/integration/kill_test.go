package integration

import (
	"strings"
	"testing"
	"time"

	"github.com/toolq/toolq/jobs"
	"github.com/toolq/toolq/worker"
)

// TestKilledWorker kills a real worker process with SIGKILL at each point
// between claim and ack, then lets another worker finish the job. A keyed
// write takes effect exactly once; an unkeyed write at most once, with an
// indeterminate result when its outcome was unknown; every job ends with a
// result.
func TestKilledWorker(t *testing.T) {
	t.Parallel()
	points := []worker.FaultPoint{worker.AfterClaim, worker.DuringTool, worker.AfterComplete, worker.AfterPublish, worker.BeforeAck}
	for _, tool := range []string{"send_payment", "create_ticket"} {
		for _, point := range points {
			t.Run(tool+"/"+string(point), func(t *testing.T) {
				t.Parallel()
				o := options{ackWait: time.Second}
				e := setup(t, o)
				h := e.startHelper(helperSpec{KillAt: string(point), KillTool: tool, AckWaitMS: 1000})
				args := payment("kill")
				if tool == "create_ticket" {
					args = `{"title":"kill","body":"test"}`
				}
				j := job(conv(t), 0, tool, args)
				e.publish(j)
				last, err := h.wait(t, 30*time.Second)
				if last != "killed at "+string(point) || err == nil || !strings.Contains(err.Error(), "killed") {
					t.Fatalf("helper ended with %q, %v\n%s", last, err, e.logs.String())
				}
				e.startWorker(o, nil)
				r := e.await(j)
				e.settled()
				results := e.results(conv(t))
				if len(results) != 1 {
					t.Fatalf("%d results for one job", len(results))
				}
				if tool == "send_payment" {
					if n := len(e.sandbox.Payments()); n != 1 || r.Status != jobs.StatusOK {
						t.Fatalf("keyed write: %d payments, result %+v", n, r)
					}
					return
				}
				tickets := len(e.sandbox.Tickets())
				switch point {
				case worker.AfterClaim:
					// Nothing was sent, but nobody can know that: indeterminate, never re-run.
					if tickets != 0 || r.Status != jobs.StatusIndeterminate {
						t.Fatalf("%d tickets, result %+v", tickets, r)
					}
				case worker.DuringTool:
					if tickets != 1 || r.Status != jobs.StatusIndeterminate {
						t.Fatalf("%d tickets, result %+v", tickets, r)
					}
				default:
					if tickets != 1 || r.Status != jobs.StatusOK {
						t.Fatalf("%d tickets, result %+v", tickets, r)
					}
				}
			})
		}
	}
}
