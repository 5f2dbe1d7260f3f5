package integration

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
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

// permissionsFile is the shipped server configuration the test runs on.
const permissionsFile = "../../deploy/nats-approvals.conf"

// TestOnlyTheCallsApproverGroupCanApproveIt runs a consumer, an agent and
// two approvers on a nats-server configured by deploy/nats-approvals.conf,
// each as its own user. The agent publishes a call that needs finance's
// approval, reads that it awaits it, and cannot decide it: NATS refuses its
// request on toolq.decide.finance, its approval event and result on
// toolq.approvals.> and toolq.results.>, and its subscription to
// toolq.decide.>. The ops approver is refused by NATS on finance's subject
// and by toolq (403) on its own. The finance approver reads the request
// from the approvals stream and approves it: the call runs once, and the
// agent reads its result, looks it up and lists its tools; the streams
// hold nothing the agent sent. The consumer does its whole part (streams,
// its durable, in-progress and acks, results, approval events, a dead
// letter, its services) without a single permissions violation.
//
// Not parallel: the file takes the passwords from the environment.
func TestOnlyTheCallsApproverGroupCanApproveIt(t *testing.T) {
	p := startPermissioned(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	agent, finance, ops := p.connect("agent"), p.connect("approver-finance"), p.connect("approver-ops")
	client := jobs.NewClient(agent.js)

	call := &jobs.Job{ConversationID: "conv-perm", TurnIndex: 1, Tool: "pay", ToolUseID: "toolu_1",
		Args: json.RawMessage(`{"to":"acct_9","amount_cents":90000}`)}
	asked, err := client.PublishAndAwait(ctx, call)
	if err != nil || asked.Status != jobs.StatusAwaitingApproval || asked.Approval == nil || asked.Approval.Group != "finance" {
		t.Fatalf("the agent's first result: %+v %v", asked, err)
	}
	key := asked.Key

	// The agent cannot decide, nor forge what the consumer writes.
	if _, err := agent.request(jobs.DecideSubject("finance"), decision(key, "approve", "agent", "urgent")); err == nil {
		t.Fatal("the agent's decision on toolq.decide.finance was answered")
	}
	agent.refusedPublish(t, jobs.DecideSubject("finance"))
	forged, _ := json.Marshal(jobs.ApprovalEvent{Version: 1, Event: jobs.ApprovalApproved, Key: key, ConversationID: call.ConversationID, By: "agent"})
	agent.publish(t, jobs.ApprovalSubject(call.ConversationID), forged)
	agent.refusedPublish(t, jobs.ApprovalSubject(call.ConversationID))
	fake, _ := json.Marshal(jobs.Result{Version: 1, ConversationID: call.ConversationID, ToolUseID: call.ToolUseID, Key: key, Status: jobs.StatusOK,
		Output: json.RawMessage(`{"paid":true}`)})
	agent.publish(t, jobs.ResultSubject(call.ConversationID), fake)
	agent.refusedPublish(t, jobs.ResultSubject(call.ConversationID))
	if _, err := agent.nc.Subscribe(jobs.DecidePrefix+">", func(*nats.Msg) {}); err != nil {
		t.Fatal(err)
	}
	if err := agent.nc.Flush(); err != nil {
		t.Fatal(err)
	}
	agent.refused(t, `Subscription to "toolq.decide.>"`)
	// Another group's approver: refused by NATS on finance's subject, by
	// toolq on its own.
	if _, err := ops.request(jobs.DecideSubject("finance"), decision(key, "approve", "olga", "ops on call")); err == nil {
		t.Fatal("the ops approver's decision on toolq.decide.finance was answered")
	}
	ops.refusedPublish(t, jobs.DecideSubject("finance"))
	msg, err := ops.request(jobs.DecideSubject("ops"), decision(key, "approve", "olga", "ops on call"))
	if err != nil {
		t.Fatalf("the ops approver on toolq.decide.ops: %v", err)
	}
	var reply jobs.DecisionReply
	if err := json.Unmarshal(msg.Data, &reply); err != nil || msg.Header.Get(micro.ErrorCodeHeader) != "403" ||
		reply.Error == nil || reply.Error.Code != "refused" || reply.Status != "" {
		t.Fatalf("a finance call decided on toolq.decide.ops: %s %q %v", msg.Header.Get(micro.ErrorCodeHeader), msg.Data, err)
	}
	if row := p.row(key); row.State != ledger.AwaitingApproval || p.runs.Load() != 0 {
		t.Fatalf("after the refusals: %s, %d runs", row.State, p.runs.Load())
	}

	// The finance approver reads the request from the approvals stream, and
	// approves the args it saw.
	requested := approvalEventOf(t, finance.js, call.ConversationID, jobs.ApprovalRequested)
	if requested.Key != key || requested.Group != "finance" || string(requested.Args) != `{"amount_cents":90000,"to":"acct_9"}` {
		t.Fatalf("the request in the approvals stream: %+v", requested)
	}
	live, err := p.consumer.nc.SubscribeSync(jobs.ApprovalsSubjects)
	if err != nil {
		t.Fatal(err)
	}
	msg, err = finance.request(jobs.DecideSubject("finance"), decision(key, "approve", "alice", "invoice 42", requested.ArgsDigest))
	if err != nil {
		t.Fatalf("the finance approver's decision: %v", err)
	}
	reply = jobs.DecisionReply{}
	if err := json.Unmarshal(msg.Data, &reply); err != nil || msg.Header.Get(micro.ErrorCodeHeader) != "" ||
		reply.Key != key || reply.Status != "approved" || reply.Error != nil {
		t.Fatalf("the finance approver's decision: %q %v", msg.Data, err)
	}
	final, err := client.Await(ctx, call.ConversationID, call.ToolUseID, jobs.UntilFinal())
	if err != nil || final.Status != jobs.StatusOK || final.Approval == nil || final.Approval.Decision != "approved" || final.Approval.DecidedBy != "alice" {
		t.Fatalf("the agent's final result: %+v %v", final, err)
	}
	// The streams hold what the consumer wrote, and nothing the agent did.
	var events []string
	for _, m := range messagesOf(t, finance.js, jobs.ApprovalsStream, jobs.ApprovalSubject(call.ConversationID)) {
		var ev jobs.ApprovalEvent
		json.Unmarshal(m.Data(), &ev)
		events = append(events, ev.Event+" by "+ev.By)
	}
	if fmt.Sprint(events) != "[requested by  approved by alice]" {
		t.Fatalf("the approval events: %q", events)
	}
	var results []string
	for _, m := range messagesOf(t, agent.js, jobs.ResultsStream, jobs.ResultSubject(call.ConversationID)) {
		r, _ := jobs.DecodeResult(m.Data())
		results = append(results, string(r.Status))
	}
	if fmt.Sprint(results) != "[awaiting_approval ok]" {
		t.Fatalf("the results: %q", results)
	}
	if msg, err := live.NextMsg(10 * time.Second); err != nil || !strings.Contains(string(msg.Data), `"event":"approved"`) {
		t.Fatalf("the approval events the consumer follows (its inbox): %v", err)
	}
	// The MCP front door reads results on the consumer's connection.
	if r, err := jobs.NewClient(p.stack.JS).Await(ctx, call.ConversationID, call.ToolUseID, jobs.UntilFinal()); err != nil || r.Status != jobs.StatusOK {
		t.Fatalf("the consumer reads the result: %+v %v", r, err)
	}
	// A job that is not one is dead-lettered.
	if _, err := agent.js.Publish(ctx, jobs.JobSubject("pay"), []byte(`{"not":"a job"}`)); err != nil {
		t.Fatal(err)
	}
	// The consumer's pending count can read zero for a moment after the
	// publish is acknowledged: wait for the dead letter itself, then for
	// the consumer to settle, then count.
	dlqMsgs := func() uint64 {
		dlq, err := p.stack.JS.Stream(ctx, jobs.DLQStream)
		if err != nil {
			return 0
		}
		return dlq.CachedInfo().State.Msgs
	}
	testenv.Eventually(t, 20*time.Second, "the job that is not one dead-lettered", func() bool { return dlqMsgs() > 0 })
	p.settled(t)
	if n := p.runs.Load(); n != 1 {
		t.Fatalf("the approved call ran %d times", n)
	}
	if n := dlqMsgs(); n != 1 {
		t.Fatalf("%d dead letters, want the job that is not one", n)
	}
	if l, err := client.Lookup(ctx, key); err != nil || l.State != jobs.LookupCompleted {
		t.Fatalf("the agent's lookup: %+v %v", l, err)
	}
	if list, err := client.Tools(ctx, "anthropic"); err != nil || !strings.Contains(string(list), `"pay"`) {
		t.Fatalf("the agent's tool list: %s %v", list, err)
	}
	// Nothing else was refused to anyone: each user's grants cover what it
	// did.
	for _, u := range []*natsUser{p.consumer, agent, finance, ops} {
		u.noMoreRefusals(t)
	}
}

// permissioned is a nats-server configured by permissionsFile, and a
// consumer connected to it as its own user, with a tool that needs
// finance's approval above 500.00.
type permissioned struct {
	t        *testing.T
	nats     *testenv.NATS
	stack    *embedded.Stack
	consumer *natsUser
	runs     atomic.Int32 // the tool's runs
}

// passwords are the users' passwords, as the file takes them.
var passwords = map[string]string{
	"toolq":            "pconsumer5f0c",
	"agent":            "pagent77d1",
	"approver-finance": "pfinance0a9e",
	"approver-ops":     "pops3b24",
}

func startPermissioned(t *testing.T) *permissioned {
	t.Helper()
	for env, user := range map[string]string{"TOOLQ_NATS_PASSWORD_CONSUMER": "toolq", "TOOLQ_NATS_PASSWORD_AGENT": "agent",
		"TOOLQ_NATS_PASSWORD_APPROVER_FINANCE": "approver-finance", "TOOLQ_NATS_PASSWORD_APPROVER_OPS": "approver-ops"} {
		t.Setenv(env, passwords[user])
	}
	file, err := server.ProcessConfigFile(permissionsFile)
	if err != nil {
		t.Fatalf("%s: %v", permissionsFile, err)
	}
	p := &permissioned{t: t}
	p.nats = testenv.StartNATS(t, func(o *server.Options) {
		// The file's users, accounts and permissions; the test's address and store.
		store, maxMem, maxStore := o.StoreDir, o.JetStreamMaxMemory, o.JetStreamMaxStore
		*o = *file
		o.Host, o.Port, o.HTTPPort, o.NoLog, o.NoSigs = "127.0.0.1", server.RANDOM_PORT, 0, true, true
		o.StoreDir, o.JetStreamMaxMemory, o.JetStreamMaxStore = store, maxMem, maxStore
	})
	if !file.JetStream {
		t.Fatalf("%s does not enable JetStream", permissionsFile)
	}

	// The call lasts longer than a third of its lease, so that the
	// consumer tells JetStream it is in progress before it acks it.
	pay := tools.ExecutorFunc(func(ctx context.Context, r tools.Request) (json.RawMessage, error) {
		p.runs.Add(1)
		select {
		case <-time.After(500 * time.Millisecond):
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		return json.RawMessage(`{"paid":true}`), nil
	})
	reg, err := tools.NewRegistry([]tools.Definition{{Name: "pay", Class: tools.KeyedWrite, Executor: pay, Timeout: time.Second, Lease: 1200 * time.Millisecond,
		Schema:   json.RawMessage(`{"type":"object","properties":{"amount_cents":{"type":"integer"},"to":{"type":"string"}}}`),
		Approval: &tools.Approval{When: "args.amount_cents > 50000", Group: "finance"}}}, tools.Config{})
	if err != nil {
		t.Fatal(err)
	}
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))
	// The consumer as `consumer run` wires it, on its own user.
	p.consumer = &natsUser{name: "toolq", refusals: make(chan error, 16)}
	ctx := context.Background()
	p.stack, err = embedded.Start(ctx, embedded.Config{Dir: t.TempDir(), NATSURL: p.nats.URL, Tools: reg, Logger: logger,
		NATSOptions: []nats.Option{nats.UserInfo("toolq", passwords["toolq"]), nats.ErrorHandler(p.consumer.record)}})
	if err != nil {
		t.Fatalf("the consumer starts: %v", err)
	}
	t.Cleanup(p.stack.Close)
	p.consumer.nc, p.consumer.js = p.stack.Conn, p.stack.JS
	// The streams exist, as another consumer left them: the worker's start
	// updates them.
	if err := jobs.ProvisionStreams(ctx, p.stack.JS, jobs.Streams{}); err != nil {
		t.Fatalf("the consumer updates the streams: %v", err)
	}
	appr, err := approvals.New(approvals.Config{Ledger: p.stack.Store, JS: p.stack.JS, Logger: logger})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.stack.StartWorker(ctx, worker.Config{Approvals: appr, Logger: logger}); err != nil {
		t.Fatalf("the consumer's worker: %v", err)
	}
	lookup, err := worker.ServeLookup(p.stack.Conn, p.stack.Store, logger)
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

// natsUser is a connection as one of the file's users, and the
// permissions violations the server reported to it.
type natsUser struct {
	name     string
	nc       *nats.Conn
	js       jetstream.JetStream
	refusals chan error
}

func (p *permissioned) connect(user string) *natsUser {
	p.t.Helper()
	u := &natsUser{name: user, refusals: make(chan error, 16)}
	u.nc = p.nats.Connect(nats.UserInfo(user, passwords[user]), nats.ErrorHandler(u.record))
	u.js, _ = jetstream.New(u.nc)
	return u
}

// record keeps a permissions violation; the server reports one as an
// -ERR on the connection, which the client hands its error handler.
func (u *natsUser) record(_ *nats.Conn, _ *nats.Subscription, err error) {
	if !errors.Is(err, nats.ErrPermissionViolation) {
		return
	}
	select {
	case u.refusals <- err:
	default: // more than the test reads: it has failed already
	}
}

// request asks on subject with a short patience: a request the server
// refuses is never answered.
func (u *natsUser) request(subject string, body []byte) (*nats.Msg, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	return u.nc.RequestWithContext(ctx, subject, body)
}

func (u *natsUser) publish(t *testing.T, subject string, body []byte) {
	t.Helper()
	if err := u.nc.Publish(subject, body); err != nil {
		t.Fatal(err)
	}
	if err := u.nc.Flush(); err != nil {
		t.Fatal(err)
	}
}

// refusedPublish asserts that the next violation reported to u is its
// publish on subject.
func (u *natsUser) refusedPublish(t *testing.T, subject string) {
	t.Helper()
	u.refused(t, fmt.Sprintf("Publish to %q", subject))
}

func (u *natsUser) refused(t *testing.T, what string) {
	t.Helper()
	select {
	case err := <-u.refusals:
		if !strings.Contains(err.Error(), "Permissions Violation for "+what) {
			t.Fatalf("%s: refused %v, want %s", u.name, err, what)
		}
	case <-time.After(5 * time.Second):
		t.Fatalf("%s: NATS did not refuse %s", u.name, what)
	}
}

func (u *natsUser) noMoreRefusals(t *testing.T) {
	t.Helper()
	select {
	case err := <-u.refusals:
		t.Fatalf("%s: %v", u.name, err)
	default:
	}
}

func decision(key, verdict, by, reason string, digest ...string) []byte {
	d := jobs.DecisionRequest{Key: key, Decision: verdict, By: by, Reason: reason}
	if len(digest) > 0 {
		d.Digest = digest[0]
	}
	body, _ := json.Marshal(d)
	return body
}

// approvalEventOf reads the conversation's approval events through js
// until the one named event.
func approvalEventOf(t *testing.T, js jetstream.JetStream, conv, event string) jobs.ApprovalEvent {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	cons, err := js.OrderedConsumer(ctx, jobs.ApprovalsStream, jetstream.OrderedConsumerConfig{FilterSubjects: []string{jobs.ApprovalSubject(conv)}})
	if err != nil {
		t.Fatalf("read the approvals stream: %v", err)
	}
	for {
		msg, err := cons.Next(jetstream.FetchContext(ctx))
		if err != nil {
			t.Fatalf("no %s event in %s: %v", event, conv, err)
		}
		var ev jobs.ApprovalEvent
		if err := json.Unmarshal(msg.Data(), &ev); err != nil {
			t.Fatal(err)
		}
		if ev.Event == event {
			return ev
		}
	}
}

// messagesOf reads through js every message of the stream on subject.
func messagesOf(t *testing.T, js jetstream.JetStream, stream, subject string) []jetstream.Msg {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	cons, err := js.OrderedConsumer(ctx, stream, jetstream.OrderedConsumerConfig{FilterSubjects: []string{subject}})
	if err != nil {
		t.Fatalf("read %s: %v", stream, err)
	}
	var out []jetstream.Msg
	for {
		msg, err := cons.Next(jetstream.FetchContext(ctx))
		if err != nil {
			t.Fatalf("read %s on %s: %v", stream, subject, err)
		}
		out = append(out, msg)
		if meta, err := msg.Metadata(); err != nil || meta.NumPending == 0 {
			return out
		}
	}
}

func (p *permissioned) row(key string) ledger.Row {
	p.t.Helper()
	row, err := p.stack.Store.Get(context.Background(), key)
	if err != nil {
		p.t.Fatal(err)
	}
	return row
}

// settled waits until the consumer has acked every job.
func (p *permissioned) settled(t *testing.T) {
	t.Helper()
	testenv.Eventually(t, 20*time.Second, "the consumer to settle its jobs", func() bool {
		select {
		case err := <-p.consumer.refusals:
			t.Fatalf("the consumer: %v", err)
		default:
		}
		cons, err := p.stack.JS.Consumer(context.Background(), jobs.JobsStream, "toolq")
		if err != nil {
			return false
		}
		info, err := cons.Info(context.Background())
		return err == nil && info.NumPending == 0 && info.NumAckPending == 0
	})
}
