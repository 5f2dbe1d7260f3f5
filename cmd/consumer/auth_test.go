package main

import (
	"context"
	"encoding/json"
	"net/http/httptest"
	"os"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolq/toolq/demo"
	"github.com/toolq/toolq/demo/sandbox"
	"github.com/toolq/toolq/internal/testenv"
	"github.com/toolq/toolq/jobs"
)

// TestAuthorization: against a server with users and permissions, the
// consumer works with its own credentials (flags from the environment), an
// agent may publish jobs, and a user without publish permission on
// toolq.jobs.> cannot inject one.
func TestAuthorization(t *testing.T) {
	t.Parallel()
	n := testenv.StartNATS(t, func(o *server.Options) {
		o.Users = []*server.User{
			{Username: "toolq", Password: "consumer-secret"},
			{Username: "agent", Password: "agent-secret", Permissions: &server.Permissions{
				Publish:   &server.SubjectPermission{Allow: []string{"toolq.jobs.>", "$JS.API.>", "_INBOX.>"}},
				Subscribe: &server.SubjectPermission{Allow: []string{"_INBOX.>"}},
			}},
			{Username: "intruder", Password: "x", Permissions: &server.Permissions{
				Publish: &server.SubjectPermission{Deny: []string{"toolq.jobs.>"}},
			}},
		}
	})
	ctx := context.Background()
	connect := func(user, pass string) (*nats.Conn, jetstream.JetStream) {
		nc, err := nats.Connect(n.URL, nats.UserInfo(user, pass))
		if err != nil {
			t.Fatalf("%s: %v", user, err)
		}
		t.Cleanup(nc.Close)
		js, _ := jetstream.New(nc)
		return nc, js
	}
	if _, err := nats.Connect(n.URL, nats.UserInfo("toolq", "wrong")); err == nil {
		t.Fatal("a wrong password connected")
	}
	_, adminJS := connect("toolq", "consumer-secret")
	if err := jobs.ProvisionStreams(ctx, adminJS, jobs.Streams{}); err != nil {
		t.Fatal(err)
	}
	_, agentJS := connect("agent", "agent-secret")
	good := &jobs.Job{ConversationID: "auth", Tool: "send_payment", ToolUseID: "toolu_agent",
		Args: json.RawMessage(`{"invoice_id":"inv_a","amount_cents":100,"currency":"EUR"}`)}
	if _, err := jobs.NewClient(agentJS).Publish(ctx, good); err != nil {
		t.Fatalf("agent publish: %v", err)
	}
	_, intruderJS := connect("intruder", "x")
	evil := &jobs.Job{ConversationID: "auth", Tool: "send_payment", ToolUseID: "toolu_evil",
		Args: json.RawMessage(`{"invoice_id":"inv_evil","amount_cents":100000,"currency":"EUR"}`)}
	pctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	_, err := jobs.NewClient(intruderJS).Publish(pctx, evil)
	cancel()
	if err == nil {
		t.Fatal("a user without permission published a job")
	}

	sb, _ := sandbox.New(sandbox.Config{})
	srv := httptest.NewServer(sb)
	defer srv.Close()
	toolsFile := t.TempDir() + "/tools.yaml"
	os.WriteFile(toolsFile, demo.ToolsYAML, 0o600)
	env := map[string]string{"NATS_URL": n.URL, "NATS_USER": "toolq", "NATS_PASSWORD": "consumer-secret",
		"DATABASE_URL": testenv.Postgres(t), "TOOLQ_SANDBOX_URL": srv.URL}
	if _, err := runConsumer(t, env, "--tools", toolsFile, "--until-empty"); err != nil {
		t.Fatal(err)
	}
	if ps := sb.Payments(); len(ps) != 1 || ps[0].InvoiceID != "inv_a" {
		t.Fatalf("payments %+v", ps)
	}
	// Without credentials the consumer cannot start.
	delete(env, "NATS_PASSWORD")
	if _, err := runConsumer(t, env, "--tools", toolsFile, "--until-empty"); err == nil {
		t.Fatalf("consumer without password: %v", err)
	}
}
