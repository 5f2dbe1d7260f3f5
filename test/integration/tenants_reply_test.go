package integration

import (
	"context"
	"encoding/json"
	"strconv"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolq/toolq/jobs"
)

// TestATenantsPullsLandNothingInAnothersStreams: acme's permissions let it
// read its own results stream through consumers. The server delivers a
// pull request's messages to the request's reply subject, which NATS does
// not check against acme's publish permissions: nothing of acme's may land
// in globex's or the default tenant's streams that way. (A core
// subscriber of such a subject does get them: docs/tenants.md, Limits.)
func TestATenantsPullsLandNothingInAnothersStreams(t *testing.T) {
	p := startTenants(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	acme := p.connect("acme", "_INBOX_acme")
	acmeClient := jobs.NewClient(acme.js, jobs.WithTenant("acme"))
	ra, err := acmeClient.PublishAndAwait(ctx, &jobs.Job{ConversationID: "conv-x", TurnIndex: 1, Tool: "pay", ToolUseID: "toolu_1",
		Args: json.RawMessage(`{"to":"acct_9","amount_cents":100}`)})
	if err != nil || ra.Status != jobs.StatusOK {
		t.Fatalf("acme's result: %+v %v", ra, err)
	}
	n := 0
	pull := func(reply string) {
		n++
		name := "pull" + strconv.Itoa(n)
		if _, err := acme.js.CreateConsumer(ctx, "TOOLQ_acme_RESULTS", jetstream.ConsumerConfig{Name: name,
			AckPolicy: jetstream.AckNonePolicy, DeliverPolicy: jetstream.DeliverAllPolicy}); err != nil {
			t.Fatal(err)
		}
		if err := acme.nc.PublishRequest("$JS.API.CONSUMER.MSG.NEXT.TOOLQ_acme_RESULTS."+name, reply, []byte(`{"batch":1}`)); err != nil {
			t.Fatal(err)
		}
		if err := acme.nc.Flush(); err != nil {
			t.Fatal(err)
		}
	}
	count := func(stream, subject string) uint64 {
		s, err := p.consumer.js.Stream(ctx, stream)
		if err != nil {
			t.Fatal(err)
		}
		info, err := s.Info(ctx, jetstream.WithSubjectFilter(subject))
		if err != nil {
			t.Fatal(err)
		}
		var n uint64
		for _, c := range info.State.Subjects {
			n += c
		}
		return n
	}

	pull(jobs.TenantJobSubject("globex", "pay"))
	pull(jobs.JobSubject("pay"))
	pull(jobs.TenantResultSubject("globex", "conv-x"))
	pull(jobs.ResultSubject("conv-x"))
	pull(jobs.TenantDLQSubject("globex", "invalid"))
	pull(jobs.TenantApprovalSubject("globex", "conv-x"))
	pull("toolq.approvals.evil")
	time.Sleep(3 * time.Second)

	for _, c := range []struct{ stream, subject string }{
		{jobs.JobsStream, jobs.TenantJobSubject("globex", "pay")},
		{jobs.JobsStream, jobs.JobSubject("pay")},
		{"TOOLQ_globex_RESULTS", "toolq.globex.results.>"},
		{jobs.ResultsStream, "toolq.results.>"},
		{"TOOLQ_globex_DLQ", "toolq.globex.dlq.>"},
		{jobs.DLQStream, "toolq.dlq.>"},
		{"TOOLQ_globex_APPROVALS", "toolq.globex.approvals.>"},
	} {
		if got := count(c.stream, c.subject); got != 0 {
			t.Errorf("acme's pull requests landed %d messages on %s in %s", got, c.subject, c.stream)
		}
	}
}
