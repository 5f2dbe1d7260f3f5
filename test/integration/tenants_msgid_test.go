package integration

import (
	"context"
	"encoding/json"
	"strconv"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"

	"github.com/toolq/toolq/jobs"
)

// TestATenantCannotSuppressAnothersDecidedCall: tenants share TOOLQ_JOBS,
// and so its duplicate window. Acme, who can compute globex's key for a
// call whose content it can guess (the tenant's name is no secret), must
// not be able to make JetStream drop the job of globex's decided call by
// publishing, on its own subject, a message with the Nats-Msg-Id that job
// will carry.
func TestATenantCannotSuppressAnothersDecidedCall(t *testing.T) {
	p := startTenants(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	acme, globex := p.connect("acme", "_INBOX_acme"), p.connect("globex", "_INBOX_globex")
	globexFin := p.connect("globex-approver-finance", "_INBOX_globex")
	globexClient := jobs.NewClient(globex.js, jobs.WithTenant("globex"))
	args := `{"to":"acct_9","amount_cents":90000}`

	// Acme guesses globex's call and derives its key.
	key, _ := jobs.Call{Tenant: "globex", ConversationID: "conv-g", TurnIndex: 1, Tool: "pay", Args: []byte(args)}.Key()
	for attempt := 0; attempt < 4; attempt++ {
		msg := nats.NewMsg(jobs.TenantJobSubject("acme", "pay"))
		msg.Data = []byte(`{}`)
		msg.Header.Set("Nats-Msg-Id", "decided:"+key+":approved:"+strconv.Itoa(attempt))
		if _, err := acme.js.PublishMsg(ctx, msg); err != nil {
			t.Fatal(err)
		}
	}

	asked, err := globexClient.PublishAndAwait(ctx, &jobs.Job{ConversationID: "conv-g", TurnIndex: 1, Tool: "pay", ToolUseID: "toolu_1", Args: json.RawMessage(args)})
	if err != nil || asked.Status != jobs.StatusAwaitingApproval || asked.Key != key {
		t.Fatalf("globex's call: %+v %v", asked, err)
	}
	requested := tenantApprovalEvent(t, globexFin.js, "globex", "conv-g")
	msg, err := globexFin.request(jobs.TenantDecideSubject("globex", "finance"), decision(key, "approve", "gina", "invoice 7", requested.ArgsDigest))
	if err != nil || msg.Header.Get(micro.ErrorCodeHeader) != "" {
		t.Fatalf("globex's approver: %v %q", err, msg.Data)
	}
	short, stop := context.WithTimeout(ctx, 15*time.Second)
	defer stop()
	final, err := globexClient.Await(short, "conv-g", "toolu_1", jobs.UntilFinal())
	if err != nil || final.Status != jobs.StatusOK {
		t.Fatalf("globex's approved call never ran (acme's message ids took its job's): %+v %v; runs %d", final, err, p.runs.Load())
	}
}
