package main

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/toolq/toolq/embedded"
	"github.com/toolq/toolq/internal/cli"
	"github.com/toolq/toolq/internal/testenv"
	"github.com/toolq/toolq/jobs"
	"github.com/toolq/toolq/worker"
)

// TestPublish drives `publisher publish` against a running worker: --wait
// prints the result and exits 0 for ok, non-zero otherwise; without --wait it
// prints where the job was stored.
func TestPublish(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	stack, err := embedded.Start(ctx, embedded.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer stack.Close()
	n, sb, dataDir := stack, stack.Sandbox, stack.Dir
	w, err := stack.NewWorker(ctx, worker.Config{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	defer func() { cancel(); <-done }()

	env := []string{"--nats-url", n.NATSURL, "--conversation", "cli", "--turn", "1"}
	out, err := runPublisher(t, "", append([]string{"publish", "--tool", "send_payment", "--wait",
		"--args", `{"invoice_id":"inv_cli","amount_cents":700,"currency":"EUR"}`}, env...)...)
	var r jobs.Result
	if err != nil || json.Unmarshal([]byte(out), &r) != nil || r.Status != jobs.StatusOK || !strings.HasPrefix(r.ToolUseID, "toolu_") {
		t.Fatalf("publish --wait: %q %v", out, err)
	}
	out, err = runPublisher(t, "", append([]string{"publish", "--tool", "no_such_tool", "--wait", "--args", `{}`}, env...)...)
	if err == nil || json.Unmarshal([]byte(out), &r) != nil || r.Status != jobs.StatusRejected {
		t.Fatalf("rejected job: %q %v", out, err)
	}
	out, err = runPublisher(t, "", append([]string{"publish", "--tool", "send_payment", "--tool-use-id", "toolu_fixed",
		"--args", `{"invoice_id":"inv_cli","amount_cents":700,"currency":"EUR"}`}, env...)...)
	var pub map[string]any
	if err != nil || json.Unmarshal([]byte(out), &pub) != nil || pub["stream"] != jobs.JobsStream || pub["seq"] == nil || pub["tool_use_id"] != "toolu_fixed" {
		t.Fatalf("publish: %q %v", out, err)
	}
	for _, bad := range [][]string{
		{"publish", "--tool", "send_payment", "--conversation", "a.b", "--args", "{}"},
		{"publish", "--tool", "send_payment", "--conversation", "c"},
		{"publish", "--tool", "send payment", "--conversation", "c", "--args", "{}"},
	} {
		if _, err := runPublisher(t, "", append(bad, "--nats-url", n.NATSURL)...); err == nil || strings.Contains(err.Error(), "\n") {
			t.Errorf("%v: %v", bad, err)
		}
	}
	if len(sb.Payments()) != 1 {
		t.Fatalf("%d payments", len(sb.Payments()))
	}
	// status: the streams, the durable, the ledger by state.
	var st struct {
		Streams   []struct{ Name string }
		Consumers []struct {
			Name       string
			Pending    uint64
			AckPending int `json:"ack_pending"`
		}
		Ledger map[string]int64
	}
	testenv.Eventually(t, 10*time.Second, "the durable to have nothing pending", func() bool {
		out, err = runPublisher(t, "", "status", "--json", "--nats-url", n.NATSURL, "--data-dir", dataDir)
		if err != nil || json.Unmarshal([]byte(out), &st) != nil {
			t.Fatalf("status: %q %v", out, err)
		}
		return len(st.Consumers) == 1 && st.Consumers[0].Pending == 0 && st.Consumers[0].AckPending == 0
	})
	if len(st.Streams) != 3 || st.Consumers[0].Name != "toolq" || st.Consumers[0].Pending != 0 || st.Ledger["completed"] != 1 {
		t.Fatalf("status %+v", st)
	}
	if out, err := runPublisher(t, "", "status", "--nats-url", n.NATSURL, "--data-dir", t.TempDir()); err != nil || !strings.Contains(out, "no ledger at") || !strings.Contains(out, "TOOLQ_JOBS") {
		t.Fatalf("status without a ledger: %q %v", out, err)
	}
	// Nobody answers a conversation whose consumer is gone: --wait gives up with a reason.
	cancel()
	<-done
	done <- nil
	_, err = runPublisher(t, "", append([]string{"publish", "--tool", "search_orders", "--wait", "--timeout", "1s", "--args", `{"query":"x"}`}, env...)...)
	if err == nil || !strings.Contains(err.Error(), "no result") {
		t.Fatalf("wait without a consumer: %v", err)
	}
}

// TestPublishRefusesAnEmptyTenant: `--tenant ""` (--tenant "$TENANT" with
// TENANT unset) is a usage error naming --tenant, before any connection:
// the call is not published as the default tenant's.
func TestPublishRefusesAnEmptyTenant(t *testing.T) {
	t.Parallel()
	_, err := runPublisher(t, "", "publish", "--nats-url", "nats://127.0.0.1:1", "--tenant", "",
		"--conversation", "c", "--turn", "1", "--tool", "t", "--args", "{}")
	var exit *cli.ExitError
	if !errors.As(err, &exit) || exit.Code != cli.ExitUsage || !strings.Contains(err.Error(), "--tenant") {
		t.Fatalf("publish --tenant \"\": %v, want a usage error naming --tenant", err)
	}
}
