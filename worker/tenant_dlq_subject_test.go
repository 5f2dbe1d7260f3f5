package worker_test

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolq/toolq/internal/testenv"
	"github.com/toolq/toolq/jobs"
	"github.com/toolq/toolq/tools"
	"github.com/toolq/toolq/worker"
)

// TestATenantsJobOnALongerSubjectIsDeadLetteredToItsTenant: a job acme publishes on a subject under toolq.acme.jobs.> that is not
// toolq.acme.jobs.<tool> (its permissions allow toolq.acme.jobs.>, and
// TOOLQ_JOBS and the durable take it) is dead-lettered in acme's DLQ,
// never in the default tenant's: its body is acme's.
func TestATenantsJobOnALongerSubjectIsDeadLetteredToItsTenant(t *testing.T) {
	t.Parallel()
	reg, err := tools.NewRegistry([]tools.Definition{{Name: "pay", Class: tools.KeyedWrite, Schema: json.RawMessage(`{"type":"object"}`),
		Executor: tools.ExecutorFunc(func(context.Context, tools.Request) (json.RawMessage, error) {
			return json.RawMessage(`{"paid":true}`), nil
		})}}, tools.Config{})
	if err != nil {
		t.Fatal(err)
	}
	js, _ := startWorker(t, reg, worker.Config{Streams: jobs.Streams{Tenants: []string{"acme"}}})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	secret := `{"version":1,"tenant":"acme","conversation_id":"c1","turn_index":0,"tool":"pay","tool_use_id":"u_1","args":{"acme_secret":"s3cr3t"}}`
	if _, err := js.Publish(ctx, "toolq.acme.jobs.pay.extra", []byte(secret)); err != nil {
		t.Fatal(err)
	}
	var where string
	testenv.Eventually(t, 20*time.Second, "the dead letter", func() bool {
		for _, stream := range []string{"TOOLQ_acme_DLQ", jobs.DLQStream} {
			s, err := js.Stream(ctx, stream)
			if err != nil {
				continue
			}
			if m, err := s.GetMsg(ctx, 1); err == nil {
				where = stream + " " + m.Subject + " " + string(m.Data)
				return true
			}
		}
		return false
	})
	if !strings.HasPrefix(where, "TOOLQ_acme_DLQ toolq.acme.dlq.invalid ") {
		t.Fatalf("acme's job was dead-lettered as %s, want in TOOLQ_acme_DLQ on toolq.acme.dlq.invalid", where)
	}
	if s, _ := js.Stream(ctx, jobs.DLQStream); s != nil {
		if _, err := s.GetMsg(ctx, 1); !errors.Is(err, jetstream.ErrMsgNotFound) {
			t.Fatalf("acme's job went to the default tenant's dead letters too: %v", err)
		}
	}
}
