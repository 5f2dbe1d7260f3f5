package worker_test

import (
	"fmt"
	"testing"

	"github.com/toolq/toolq/worker"
)

// The durable takes the default tenant's jobs and each tenant's; with
// no tenants its filter is today's, and a filter an operator chose is
// kept as is.
func TestConsumerFiltersTakeEachTenantsJobs(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		cons          worker.Consumer
		one, multiple string
	}{
		{worker.Consumer{}, "toolq.jobs.>", "[]"},
		{worker.Consumer{Tenants: []string{"acme", "globex"}}, "", "[toolq.jobs.> toolq.acme.jobs.> toolq.globex.jobs.>]"},
		{worker.Consumer{Tenants: []string{"acme"}, FilterSubject: "toolq.acme.jobs.pay"}, "toolq.acme.jobs.pay", "[]"},
	} {
		cfg := c.cons.Config()
		if cfg.FilterSubject != c.one || fmt.Sprint(cfg.FilterSubjects) != c.multiple {
			t.Errorf("%+v: filter %q, filters %v", c.cons, cfg.FilterSubject, cfg.FilterSubjects)
		}
	}
}
