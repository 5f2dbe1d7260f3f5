package main

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolq/toolq/embedded"
	"github.com/toolq/toolq/internal/cli"
	"github.com/toolq/toolq/jobs"
)

func runPublish(ctx context.Context, args []string, stdio cli.IO, getenv func(string) string) error {
	fs := cli.NewFlagSet("publish", "publisher publish [--tenant T] --conversation C --turn N [--ordinal K] --tool T [--tool-use-id ID] --args JSON [--wait] [--timeout D]\n\n"+
		"Publishes one job. Without --wait it prints where JetStream stored it; with --wait it\n"+
		"prints the result (Result v1 JSON) and exits 0 only when its status is ok: 1 for error, 4 rejected, 5 indeterminate.", stdio)
	var nf cli.NATSFlags
	nf.Register(fs, getenv, "nats://127.0.0.1:4222", "NATS server URL")
	var job jobs.Job
	var argsJSON string
	fs.StringVar(&job.ConversationID, "conversation", "", "conversation id")
	fs.Int64Var(&job.TurnIndex, "turn", 0, "turn index")
	fs.Int64Var(&job.Ordinal, "ordinal", 0, "position among identical calls of the turn")
	fs.StringVar(&job.Tool, "tool", "", "tool name")
	fs.StringVar(&job.ToolUseID, "tool-use-id", "", "the model's tool_use id (default: a new toolu_… id)")
	fs.StringVar(&argsJSON, "args", "", "the call's arguments, a JSON object")
	fs.StringVar(&job.Tenant, "tenant", "", "the tenant whose call it is (docs/tenants.md): published on toolq.<tenant>.jobs.<tool>, awaited in its results stream, with the inbox prefix _INBOX_<tenant>; leave it out for the default tenant's call")
	wait := fs.Bool("wait", false, "wait for the result and print it")
	timeout := fs.Duration("timeout", 30*time.Second, "how long --wait waits")
	if err := cli.ParseNone(fs, args); err != nil {
		return err
	}
	if err := cli.RefuseEmpty(fs, "tenant", "for the default tenant's call"); err != nil {
		return err
	}
	if argsJSON == "" {
		return cli.Usagef("--args is required (a JSON object)")
	}
	job.Args = json.RawMessage(argsJSON)
	if job.ToolUseID == "" {
		job.ToolUseID = newToolUseID()
	}
	job.Version = jobs.Version
	if job.Tool == "" || job.ConversationID == "" {
		return cli.Usagef("--conversation and --tool are required")
	}
	if err := job.Validate(); err != nil {
		return cli.WithCode(cli.ExitRejected, err) // the call, as given, cannot run
	}
	opts, err := nf.Options("toolq publisher")
	if err != nil {
		return err
	}
	if job.Tenant != "" { // a tenant's user may subscribe to its own inbox only
		opts = append(opts, nats.CustomInboxPrefix("_INBOX_"+job.Tenant))
	}
	nc, err := nats.Connect(nf.URL, opts...)
	if err != nil {
		return fmt.Errorf("connect to NATS at %s: %w", embedded.RedactURL(nf.URL), err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	client := jobs.NewClient(js, jobs.WithTenant(job.Tenant))
	ctx, cancel := context.WithTimeout(ctx, *timeout)
	defer cancel()
	if !*wait {
		pub, err := client.Publish(ctx, &job)
		if err != nil {
			return err
		}
		return cli.PrintJSON(stdio.Out, map[string]any{"stream": pub.Stream, "seq": pub.Sequence, "key": pub.Key,
			"tool_use_id": job.ToolUseID, "duplicate": pub.Duplicate})
	}
	r, err := client.PublishAndAwait(ctx, &job)
	if err != nil {
		if errors.Is(err, context.DeadlineExceeded) {
			return fmt.Errorf("no result for %s within %s (is a consumer running?)", job.ToolUseID, *timeout)
		}
		return err
	}
	if err := cli.PrintJSON(stdio.Out, r); err != nil {
		return err
	}
	switch r.Status {
	case jobs.StatusOK:
		return nil
	case jobs.StatusRejected:
		return cli.WithCode(cli.ExitRejected, fmt.Errorf("result status %s", r.Status))
	case jobs.StatusIndeterminate:
		return cli.WithCode(cli.ExitIndeterminate, fmt.Errorf("result status %s", r.Status))
	}
	return fmt.Errorf("result status %s", r.Status)
}

// newToolUseID returns a toolu_-style id: 24 random base-62 characters.
func newToolUseID() string {
	const alphabet = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
	b := make([]byte, 24)
	rand.Read(b)
	for i := range b {
		b[i] = alphabet[int(b[i])%len(alphabet)]
	}
	return "toolu_" + string(b)
}
