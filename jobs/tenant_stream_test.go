package jobs_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolq/toolq/internal/testenv"
	"github.com/toolq/toolq/jobs"
)

// Tenants added to a running deployment: TOOLQ_JOBS, as the default
// tenant's consumers left it, gets their job subjects, each gets its
// three streams, the default tenant's streams keep their subjects, and
// provisioning again changes nothing.
func TestProvisionAddsTenantsBesideTheDefaultTenant(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	js, _ := jetstream.New(testenv.StartNATS(t).Connect())
	if err := jobs.ProvisionStreams(ctx, js, jobs.Streams{}); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if err := jobs.ProvisionStreams(ctx, js, jobs.Streams{Tenants: []string{"acme", "globex"}}); err != nil {
			t.Fatal(err)
		}
	}
	subjects := func(stream string) string {
		s, err := js.Stream(ctx, stream)
		if err != nil {
			t.Fatal(err)
		}
		return fmt.Sprint(s.CachedInfo().Config.Subjects)
	}
	for stream, want := range map[string]string{
		jobs.JobsStream:        "[toolq.jobs.> toolq.acme.jobs.> toolq.globex.jobs.>]",
		jobs.ResultsStream:     "[toolq.results.>]",
		jobs.DLQStream:         "[toolq.dlq.>]",
		jobs.ApprovalsStream:   "[toolq.approvals.>]",
		"TOOLQ_acme_RESULTS":   "[toolq.acme.results.>]",
		"TOOLQ_acme_DLQ":       "[toolq.acme.dlq.>]",
		"TOOLQ_acme_APPROVALS": "[toolq.acme.approvals.>]",
		"TOOLQ_globex_RESULTS": "[toolq.globex.results.>]",
	} {
		if got := subjects(stream); got != want {
			t.Errorf("%s: subjects %s, want %s", stream, got, want)
		}
	}
	// A job of each tenant lands in TOOLQ_JOBS; a result in its tenant's stream.
	for _, c := range [][2]string{{jobs.TenantJobSubject("acme", "t"), jobs.JobsStream}, {jobs.TenantJobSubject("", "t"), jobs.JobsStream},
		{jobs.TenantResultSubject("globex", "c"), "TOOLQ_globex_RESULTS"}, {jobs.TenantDLQSubject("acme", "invalid"), "TOOLQ_acme_DLQ"}} {
		ack, err := js.Publish(ctx, c[0], []byte(`{}`))
		if err != nil || ack.Stream != c[1] {
			t.Fatalf("%s: %+v %v, want stream %s", c[0], ack, err, c[1])
		}
	}
	if err := jobs.ProvisionStreams(ctx, js, jobs.Streams{Tenants: []string{"results"}}); err == nil {
		t.Fatal("a tenant named results was provisioned")
	}
}
