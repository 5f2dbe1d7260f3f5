package worker_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/toolq/toolq/jobs"
	"github.com/toolq/toolq/tools"
	"github.com/toolq/toolq/worker"
)

// TestATenantLooksUpItsOwnCallsOnly: a lookup on toolq.<tenant>.ledger.get
// answers the tenant's own keys; another tenant's key, or the default
// tenant's, is unknown there, and a tenant's key is unknown on the default
// subject: permission to ask on one's own subject is all a tenant needs,
// and all it gets.
func TestATenantLooksUpItsOwnCallsOnly(t *testing.T) {
	t.Parallel()
	reg, err := tools.NewRegistry([]tools.Definition{{Name: "pay", Class: tools.KeyedWrite, Schema: json.RawMessage(`{"type":"object"}`),
		Executor: tools.ExecutorFunc(func(context.Context, tools.Request) (json.RawMessage, error) {
			return json.RawMessage(`{"paid":true}`), nil
		})}}, tools.Config{})
	if err != nil {
		t.Fatal(err)
	}
	tenants := []string{"acme", "globex"}
	js, store := startWorker(t, reg, worker.Config{Streams: jobs.Streams{Tenants: tenants}, Consumer: worker.Consumer{Tenants: tenants}})
	svc, err := worker.ServeLookup(js.Conn(), store, testLogger(t), tenants...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { svc.Stop() })
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	keys := map[string]string{}
	for _, tenant := range []string{"", "acme", "globex"} {
		var opts []jobs.ClientOption
		if tenant != "" {
			opts = append(opts, jobs.WithTenant(tenant))
		}
		r, err := jobs.NewClient(js, opts...).PublishAndAwait(ctx, &jobs.Job{ConversationID: "c1", Tool: "pay", ToolUseID: "u_" + tenant + "x",
			Args: json.RawMessage(`{"n":1}`)})
		if err != nil || r.Status != jobs.StatusOK {
			t.Fatalf("tenant %q: %+v %v", tenant, r, err)
		}
		keys[tenant] = r.Key
	}
	for asker := range keys {
		var opts []jobs.ClientOption
		if asker != "" {
			opts = append(opts, jobs.WithTenant(asker))
		}
		client := jobs.NewClient(js, opts...)
		for owner, key := range keys {
			l, err := client.Lookup(ctx, key)
			if err != nil {
				t.Fatal(err)
			}
			want := jobs.LookupUnknown
			if owner == asker {
				want = jobs.LookupCompleted
			}
			if l.State != want || (want == jobs.LookupUnknown && l.Output != nil) {
				t.Errorf("tenant %q looking up tenant %q's key: %s, want %s", asker, owner, l.State, want)
			}
		}
	}
}
