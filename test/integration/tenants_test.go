package integration

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nats.go/micro"

	"github.com/toolq/toolq/approvals"
	"github.com/toolq/toolq/embedded"
	"github.com/toolq/toolq/internal/testenv"
	"github.com/toolq/toolq/jobs"
	"github.com/toolq/toolq/ledger"
	"github.com/toolq/toolq/tools"
	"github.com/toolq/toolq/worker"
)

// tenantsFile is the shipped configuration of a deployment shared by
// tenants acme and globex.
const tenantsFile = "../../deploy/nats-tenants.conf"

// tenantPasswords are its users' passwords, as the file takes them.
var tenantPasswords = map[string]string{
	"toolq": "pconsumer81aa", "acme": "pacme2c9f", "globex": "pglobex6e01",
	"acme-approver-finance": "pacmefin4d2", "globex-approver-finance": "pglobexfin90b",
}

// TestATenantCannotActAsAnother runs a consumer serving tenants acme and
// globex on a nats-server configured by deploy/nats-tenants.conf, each
// tenant as its own user. Both run the same call: two keys, two rows, two
// runs, each tenant reading its own result. Acme's credentials cannot
// publish a job as globex, read globex's results (its subjects, its
// stream, the default tenant's stream) or dead letters, look up globex's
// keys, or decide globex's calls: NATS refuses each. A job acme publishes
// on its own subject with globex in its body is refused by toolq (dead
// letter in acme's DLQ, never run). Acme's approver cannot decide globex's
// call on acme's own subject either (toolq answers 404); globex's approver
// approves it, and it runs as globex's.
//
// Not parallel: the file takes the passwords from the environment.
func TestATenantCannotActAsAnother(t *testing.T) {
	p := startTenants(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	acme, globex := p.connect("acme", "_INBOX_acme"), p.connect("globex", "_INBOX_globex")
	acmeFin, globexFin := p.connect("acme-approver-finance", "_INBOX_acme"), p.connect("globex-approver-finance", "_INBOX_globex")
	acmeClient, globexClient := jobs.NewClient(acme.js, jobs.WithTenant("acme")), jobs.NewClient(globex.js, jobs.WithTenant("globex"))

	// The same call from both tenants: two keys, two runs.
	call := func(id string, cents int) *jobs.Job {
		return &jobs.Job{ConversationID: "conv-t", TurnIndex: 1, Tool: "pay", ToolUseID: id,
			Args: json.RawMessage(`{"to":"acct_9","amount_cents":` + itoa(cents) + `}`)}
	}
	ra, err := acmeClient.PublishAndAwait(ctx, call("toolu_1", 100))
	if err != nil || ra.Status != jobs.StatusOK || ra.Tenant != "acme" {
		t.Fatalf("acme's result: %+v %v", ra, err)
	}
	rb, err := globexClient.PublishAndAwait(ctx, call("toolu_1", 100))
	if err != nil || rb.Status != jobs.StatusOK || rb.Tenant != "globex" || rb.Duplicate {
		t.Fatalf("globex's result: %+v %v", rb, err)
	}
	wantA, _ := jobs.Call{Tenant: "acme", ConversationID: "conv-t", TurnIndex: 1, Tool: "pay", Args: []byte(`{"to":"acct_9","amount_cents":100}`)}.Key()
	if ra.Key != wantA || rb.Key == ra.Key || p.runs.Load() != 2 {
		t.Fatalf("keys %s %s (want acme's %s), %d runs", ra.Key, rb.Key, wantA, p.runs.Load())
	}

	// Acme cannot publish a job as globex.
	acme.publish(t, jobs.TenantJobSubject("globex", "pay"), []byte(`{}`))
	acme.refusedPublish(t, jobs.TenantJobSubject("globex", "pay"))
	acme.publish(t, jobs.JobSubject("pay"), []byte(`{}`)) // nor as the default tenant
	acme.refusedPublish(t, jobs.JobSubject("pay"))
	acme.publish(t, jobs.TenantJobSubject("acme", "pay.extra"), []byte(`{}`)) // nor on a subject that is not a tool's
	acme.refusedPublish(t, jobs.TenantJobSubject("acme", "pay.extra"))
	// Nor read globex's results or dead letters: not on their subjects,
	// not through globex's streams, not through the default tenant's.
	for _, subject := range []string{jobs.TenantResultSubject("globex", ">"), jobs.TenantDLQSubject("globex", ">"), jobs.TenantApprovalSubject("globex", ">")} {
		if _, err := acme.nc.Subscribe(subject, func(*nats.Msg) {}); err != nil {
			t.Fatal(err)
		}
		acme.nc.Flush()
		acme.refused(t, `Subscription to "`+subject+`"`)
	}
	for _, stream := range []string{"TOOLQ_globex_RESULTS", "TOOLQ_globex_DLQ", "TOOLQ_globex_APPROVALS", jobs.ResultsStream, jobs.JobsStream} {
		short, stop := context.WithTimeout(ctx, 2*time.Second)
		_, err := acme.js.OrderedConsumer(short, stream, jetstream.OrderedConsumerConfig{})
		stop()
		if err == nil {
			t.Fatalf("acme read %s", stream)
		}
		acme.refusedPrefix(t, `Publish to "$JS.API.CONSUMER.CREATE.`+stream+`.`)
		acme.publish(t, "$JS.API.STREAM.MSG.GET."+stream, []byte(`{"seq":1}`)) // a reply would come to acme's inbox
		acme.refusedPublish(t, "$JS.API.STREAM.MSG.GET."+stream)
	}
	// Nor look up globex's keys.
	if _, err := acme.request(jobs.TenantLookupSubject("globex"), []byte(rb.Key)); err == nil {
		t.Fatal("acme's lookup on globex's subject was answered")
	}
	acme.refusedPublish(t, jobs.TenantLookupSubject("globex"))

	// A job with globex in its body, on acme's subject: toolq refuses it.
	forged := `{"version":1,"tenant":"globex","conversation_id":"conv-t","turn_index":2,"tool":"pay","tool_use_id":"toolu_9","args":{"to":"acct_1","amount_cents":5}}`
	if _, err := acme.js.Publish(ctx, jobs.TenantJobSubject("acme", "pay"), []byte(forged)); err != nil {
		t.Fatal(err)
	}
	var dead *jetstream.RawStreamMsg
	testenv.Eventually(t, 20*time.Second, "the forged job's dead letter in acme's DLQ", func() bool {
		s, err := acme.js.Stream(ctx, "TOOLQ_acme_DLQ")
		if err != nil {
			return false
		}
		dead, err = s.GetMsg(ctx, 1)
		return err == nil
	})
	if dead.Subject != jobs.TenantDLQSubject("acme", jobs.DLQInvalid) || string(dead.Data) != forged ||
		!strings.Contains(dead.Header.Get(jobs.HeaderDLQDetail), `job of tenant "globex" published on toolq.acme.jobs.pay`) {
		t.Fatalf("the dead letter: %s %q %q", dead.Subject, dead.Header.Get(jobs.HeaderDLQDetail), dead.Data)
	}
	forgedKey, _ := jobs.Call{Tenant: "globex", ConversationID: "conv-t", TurnIndex: 2, Tool: "pay", Args: []byte(`{"to":"acct_1","amount_cents":5}`)}.Key()
	if _, err := p.stack.Store.Get(ctx, forgedKey); !errors.Is(err, ledger.ErrNotFound) || p.runs.Load() != 2 {
		t.Fatalf("the forged job: row %v, %d runs", err, p.runs.Load())
	}

	// Globex's call that waits for its approvers: acme's cannot decide it.
	asked, err := globexClient.PublishAndAwait(ctx, call("toolu_2", 90000))
	if err != nil || asked.Status != jobs.StatusAwaitingApproval || asked.Tenant != "globex" {
		t.Fatalf("globex's call awaiting approval: %+v %v", asked, err)
	}
	if _, err := acmeFin.request(jobs.TenantDecideSubject("globex", "finance"), decision(asked.Key, "approve", "mallory", "mine now")); err == nil {
		t.Fatal("acme's approver's decision on globex's subject was answered")
	}
	acmeFin.refusedPublish(t, jobs.TenantDecideSubject("globex", "finance"))
	if _, err := acme.request(jobs.TenantDecideSubject("acme", "finance"), decision(asked.Key, "approve", "mallory", "mine now")); err == nil {
		t.Fatal("acme's agent decided")
	}
	acme.refusedPublish(t, jobs.TenantDecideSubject("acme", "finance"))
	msg, err := acmeFin.request(jobs.TenantDecideSubject("acme", "finance"), decision(asked.Key, "approve", "mallory", "mine now"))
	if err != nil || msg.Header.Get(micro.ErrorCodeHeader) != "404" {
		t.Fatalf("globex's call decided on acme's subject: %v %q", err, msg.Data)
	}
	if row := p.row(asked.Key); row.State != ledger.AwaitingApproval {
		t.Fatalf("after acme's attempts: %s", row.State)
	}
	requested := tenantApprovalEvent(t, globexFin.js, "globex", "conv-t")
	if requested.Key != asked.Key || requested.Event != jobs.ApprovalRequested {
		t.Fatalf("globex's approval event: %+v", requested)
	}
	msg, err = globexFin.request(jobs.TenantDecideSubject("globex", "finance"), decision(asked.Key, "approve", "gina", "invoice 7", requested.ArgsDigest))
	if err != nil || msg.Header.Get(micro.ErrorCodeHeader) != "" {
		t.Fatalf("globex's approver: %v %q", err, msg.Data)
	}
	final, err := globexClient.Await(ctx, "conv-t", "toolu_2", jobs.UntilFinal())
	if err != nil || final.Status != jobs.StatusOK || final.Tenant != "globex" || final.Key != asked.Key || p.runs.Load() != 3 {
		t.Fatalf("globex's approved call: %+v %v, %d runs", final, err, p.runs.Load())
	}
	if l, err := globexClient.Lookup(ctx, asked.Key); err != nil || l.State != jobs.LookupCompleted {
		t.Fatalf("globex's lookup: %+v %v", l, err)
	}
	if list, err := acmeClient.Tools(ctx, "anthropic"); err != nil || !strings.Contains(string(list), `"pay"`) {
		t.Fatalf("acme's tool list: %s %v", list, err)
	}
	for _, u := range []*natsUser{p.consumer, acme, globex, acmeFin, globexFin} {
		u.noMoreRefusals(t)
	}
}

type tenantsEnv struct {
	t        *testing.T
	nats     *testenv.NATS
	stack    *embedded.Stack
	consumer *natsUser
	runs     atomic.Int32
}

func startTenants(t *testing.T) *tenantsEnv {
	t.Helper()
	for env, user := range map[string]string{"TOOLQ_NATS_PASSWORD_CONSUMER": "toolq", "TOOLQ_NATS_PASSWORD_ACME": "acme", "TOOLQ_NATS_PASSWORD_GLOBEX": "globex",
		"TOOLQ_NATS_PASSWORD_ACME_APPROVER_FINANCE": "acme-approver-finance", "TOOLQ_NATS_PASSWORD_GLOBEX_APPROVER_FINANCE": "globex-approver-finance"} {
		t.Setenv(env, tenantPasswords[user])
	}
	file, err := server.ProcessConfigFile(tenantsFile)
	if err != nil {
		t.Fatalf("%s: %v", tenantsFile, err)
	}
	p := &tenantsEnv{t: t}
	p.nats = testenv.StartNATS(t, func(o *server.Options) {
		store, maxMem, maxStore := o.StoreDir, o.JetStreamMaxMemory, o.JetStreamMaxStore
		*o = *file
		o.Host, o.Port, o.HTTPPort, o.NoLog, o.NoSigs = "127.0.0.1", server.RANDOM_PORT, 0, true, true
		o.StoreDir, o.JetStreamMaxMemory, o.JetStreamMaxStore = store, maxMem, maxStore
	})
	pay := tools.ExecutorFunc(func(ctx context.Context, r tools.Request) (json.RawMessage, error) {
		p.runs.Add(1)
		return json.RawMessage(`{"paid":true}`), nil
	})
	reg, err := tools.NewRegistry([]tools.Definition{{Name: "pay", Class: tools.KeyedWrite, Executor: pay, Timeout: time.Second,
		Schema:   json.RawMessage(`{"type":"object","properties":{"amount_cents":{"type":"integer"},"to":{"type":"string"}}}`),
		Approval: &tools.Approval{When: "args.amount_cents > 50000", Group: "finance"}}}, tools.Config{})
	if err != nil {
		t.Fatal(err)
	}
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))
	tenants := []string{"acme", "globex"}
	p.consumer = &natsUser{name: "toolq", refusals: make(chan error, 16)}
	ctx := context.Background()
	p.stack, err = embedded.Start(ctx, embedded.Config{Dir: t.TempDir(), NATSURL: p.nats.URL, Tools: reg, Logger: logger,
		NATSOptions: []nats.Option{nats.UserInfo("toolq", tenantPasswords["toolq"]), nats.ErrorHandler(p.consumer.record)}})
	if err != nil {
		t.Fatalf("the consumer starts: %v", err)
	}
	t.Cleanup(p.stack.Close)
	p.consumer.nc, p.consumer.js = p.stack.Conn, p.stack.JS
	// As `consumer run --tenants acme,globex` wires it.
	appr, err := approvals.New(approvals.Config{Ledger: p.stack.Store, JS: p.stack.JS, Logger: logger, Tenants: tenants})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.stack.StartWorker(ctx, worker.Config{Approvals: appr, Logger: logger, Streams: jobs.Streams{Tenants: tenants}}); err != nil {
		t.Fatalf("the consumer's worker: %v", err)
	}
	lookup, err := worker.ServeLookup(p.stack.Conn, p.stack.Store, logger, tenants...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { lookup.Stop() })
	list, err := worker.ServeTools(p.stack.Conn, p.stack.Tools, logger)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { list.Stop() })
	decisions, err := appr.Serve(p.stack.Conn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { decisions.Stop() })
	return p
}

func (p *tenantsEnv) connect(user, inbox string) *natsUser {
	p.t.Helper()
	u := &natsUser{name: user, refusals: make(chan error, 16)}
	u.nc = p.nats.Connect(nats.UserInfo(user, tenantPasswords[user]), nats.CustomInboxPrefix(inbox), nats.ErrorHandler(u.record))
	u.js, _ = jetstream.New(u.nc)
	return u
}

func (p *tenantsEnv) row(key string) ledger.Row {
	p.t.Helper()
	row, err := p.stack.Store.Get(context.Background(), key)
	if err != nil {
		p.t.Fatal(err)
	}
	return row
}

// refusedPrefix asserts that the next violation reported to u is a
// publish on a subject starting with prefix.
func (u *natsUser) refusedPrefix(t *testing.T, prefix string) {
	t.Helper()
	select {
	case err := <-u.refusals:
		if !strings.Contains(err.Error(), "Permissions Violation for "+prefix) {
			t.Fatalf("%s: refused %v, want %s…", u.name, err, prefix)
		}
	case <-time.After(5 * time.Second):
		t.Fatalf("%s: NATS did not refuse %s…", u.name, prefix)
	}
}

// tenantApprovalEvent reads the first approval event of the conversation
// in the tenant's approvals stream.
func tenantApprovalEvent(t *testing.T, js jetstream.JetStream, tenant, conv string) jobs.ApprovalEvent {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	cons, err := js.OrderedConsumer(ctx, jobs.TenantStream(tenant, jobs.ApprovalsStream),
		jetstream.OrderedConsumerConfig{FilterSubjects: []string{jobs.TenantApprovalSubject(tenant, conv)}})
	if err != nil {
		t.Fatalf("read %s's approvals: %v", tenant, err)
	}
	msg, err := cons.Next(jetstream.FetchContext(ctx))
	if err != nil {
		t.Fatalf("no approval event in %s's %s: %v", tenant, conv, err)
	}
	var ev jobs.ApprovalEvent
	if err := json.Unmarshal(msg.Data(), &ev); err != nil {
		t.Fatal(err)
	}
	return ev
}

func itoa(n int) string { b, _ := json.Marshal(n); return string(b) }
