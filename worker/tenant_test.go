package worker_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/toolq/toolq/internal/testenv"
	"github.com/toolq/toolq/jobs"
	"github.com/toolq/toolq/tools"
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

// A job runs as the tenant of the subject it came on, and only if its body
// names that tenant: a tenant's job answers on its tenant's results
// subject, under its tenant's key; a job naming another tenant, or none,
// on a tenant's subject (or a tenant's on the default tenant's subject) is
// dead-lettered, to the dead letters of the subject's tenant, and never
// run.
func TestAJobRunsAsTheTenantOfItsSubjectOnly(t *testing.T) {
	t.Parallel()
	var runs atomic.Int32
	reg, err := tools.NewRegistry([]tools.Definition{{Name: "pay", Class: tools.KeyedWrite, Schema: json.RawMessage(`{"type":"object"}`),
		Executor: tools.ExecutorFunc(func(context.Context, tools.Request) (json.RawMessage, error) {
			runs.Add(1)
			return json.RawMessage(`{"paid":true}`), nil
		})}}, tools.Config{})
	if err != nil {
		t.Fatal(err)
	}
	js, _ := startWorker(t, reg, worker.Config{Streams: jobs.Streams{Tenants: []string{"acme"}}})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	body := func(tenant, id string) []byte {
		t := ""
		if tenant != "" {
			t = `"tenant":"` + tenant + `",`
		}
		return []byte(`{"version":1,` + t + `"conversation_id":"c1","turn_index":0,"tool":"pay","tool_use_id":"` + id + `","args":{"n":1}}`)
	}
	for _, c := range []struct{ subject, tenant, id string }{
		{"toolq.acme.jobs.pay", "globex", "u_forged"},   // another tenant's name
		{"toolq.acme.jobs.pay", "", "u_none"},           // no tenant on a tenant's subject
		{"toolq.jobs.pay", "acme", "u_default_subject"}, // a tenant's job on the default tenant's subject
	} {
		if _, err := js.Publish(ctx, c.subject, body(c.tenant, c.id)); err != nil {
			t.Fatal(err)
		}
	}
	client := jobs.NewClient(js, jobs.WithTenant("acme"))
	r, err := client.PublishAndAwait(ctx, &jobs.Job{ConversationID: "c1", Tool: "pay", ToolUseID: "u_ok", Args: json.RawMessage(`{"n":1}`)})
	if err != nil || r.Status != jobs.StatusOK || r.Tenant != "acme" {
		t.Fatalf("acme's job: %+v %v", r, err)
	}
	want, _ := jobs.Call{Tenant: "acme", ConversationID: "c1", Tool: "pay", Args: []byte(`{"n":1}`)}.Key()
	if r.Key != want {
		t.Fatalf("key %s, want acme's %s", r.Key, want)
	}
	dead := func(stream string) []string {
		var out []string
		testenv.Eventually(t, 20*time.Second, "the dead letters in "+stream, func() bool {
			s, err := js.Stream(ctx, stream)
			if err != nil {
				return false
			}
			info, err := s.Info(ctx)
			if err != nil {
				return false
			}
			out = out[:0]
			for seq := info.State.FirstSeq; info.State.Msgs > 0 && seq <= info.State.LastSeq; seq++ {
				if m, err := s.GetMsg(ctx, seq); err == nil {
					out = append(out, m.Subject+" "+m.Header.Get(jobs.HeaderDLQDetail))
				}
			}
			return len(out) > 0 && (stream != "TOOLQ_acme_DLQ" || len(out) == 2)
		})
		return out
	}
	acme, def := dead("TOOLQ_acme_DLQ"), dead(jobs.DLQStream)
	all := strings.Join(acme, "\n") // in the order they were processed
	if len(acme) != 2 || !strings.Contains(all, `toolq.acme.dlq.invalid job of tenant "globex" published on toolq.acme.jobs.pay`) ||
		!strings.Contains(all, `toolq.acme.dlq.invalid job of tenant "" published on toolq.acme.jobs.pay`) {
		t.Fatalf("acme's dead letters: %q", acme)
	}
	if len(def) != 1 || !strings.Contains(def[0], `toolq.dlq.invalid job of tenant "acme" published on toolq.jobs.pay, a subject of tenant ""`) {
		t.Fatalf("the default tenant's dead letters: %q", def)
	}
	if n := runs.Load(); n != 1 {
		t.Fatalf("%d runs, want acme's one", n)
	}
}
