package main

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolq/toolq/internal/cli"
	"github.com/toolq/toolq/internal/testenv"
	"github.com/toolq/toolq/jobs"
	"github.com/toolq/toolq/ledger"
)

func TestMain(m *testing.M) { testenv.Main(m) }

func runConsumer(t *testing.T, env map[string]string, args ...string) (string, error) {
	t.Helper()
	var out, errOut bytes.Buffer
	err := run(context.Background(), args, cli.IO{In: strings.NewReader(""), Out: &out, Err: &errOut}, func(k string) string { return env[k] })
	return out.String(), err
}

// TestLedgerCommands drives migrate and every ledger subcommand against both
// backends, the way an operator would.
func TestLedgerCommands(t *testing.T) {
	t.Parallel()
	for _, backend := range []string{"postgres", "sqlite"} {
		t.Run(backend, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			n := testenv.StartNATS(t)
			js, _ := jetstream.New(n.Connect())
			if err := jobs.ProvisionStreams(ctx, js, jobs.Streams{}); err != nil {
				t.Fatal(err)
			}
			env := map[string]string{"TOOLQ_DATA_DIR": t.TempDir(), "NATS_URL": n.URL}
			if backend == "postgres" {
				env["DATABASE_URL"] = testenv.Postgres(t)
			}
			out, err := runConsumer(t, env, "migrate")
			if err != nil || !strings.Contains(out, backend) {
				t.Fatalf("migrate: %q %v", out, err)
			}
			if out, err := runConsumer(t, env, "ledger", "ls", "--json"); err != nil || strings.TrimSpace(out) != "[]" {
				t.Fatalf("ls on an empty ledger: %q %v", out, err)
			}
			st, err := ledger.Open(ctx, env["DATABASE_URL"], env["TOOLQ_DATA_DIR"])
			if err != nil {
				t.Fatal(err)
			}
			defer st.Close()
			claim := func(key string) ledger.Row {
				res, err := st.Claim(ctx, []ledger.Claim{{Key: key, ConversationID: "c", Tool: "create_ticket", ArgsDigest: "d",
					ToolUseID: "toolu_1", Owner: "o", Lease: time.Hour}})
				if err != nil || !res[0].Claimed {
					t.Fatalf("claim %s: %v", key, err)
				}
				return res[0].Row
			}
			for _, k := range []string{"k-done", "k-open", "k-notrun"} {
				row := claim(k)
				if k != "k-open" {
					if err := st.MarkIndeterminate(ctx, row.Fence(), ledger.ErrorInfo{Code: "reset", Message: "reset mid-response"}); err != nil {
						t.Fatal(err)
					}
				}
			}
			out, err = runConsumer(t, env, "ledger", "ls", "--state", "indeterminate", "--json")
			var rows []ledger.Row
			if err != nil || json.Unmarshal([]byte(out), &rows) != nil || len(rows) != 2 {
				t.Fatalf("ls --state indeterminate: %q %v", out, err)
			}
			if out, err := runConsumer(t, env, "ledger", "ls"); err != nil || !strings.Contains(out, "k-open") || !strings.Contains(out, "in_flight") {
				t.Fatalf("ls table: %q %v", out, err)
			}
			out, err = runConsumer(t, env, "ledger", "show", "k-done", "--json")
			var row ledger.Row
			if err != nil || json.Unmarshal([]byte(out), &row) != nil || row.State != ledger.Indeterminate || row.Error.Code != "reset" {
				t.Fatalf("show --json: %q %v", out, err)
			}
			if _, err := runConsumer(t, env, "ledger", "show", "missing"); err == nil || !strings.Contains(err.Error(), "not found") {
				t.Fatalf("show missing: %v", err)
			}
			for _, bad := range [][]string{
				{"ledger", "resolve", "k-done"},
				{"ledger", "resolve", "k-done", "--not-run", "--output", "{}"},
				{"ledger", "resolve", "k-done", "--output", "{bad"},
				{"ledger", "resolve", "--not-run"},
				{"ledger", "resolve", "k-done", "--not-run"},
				{"ledger", "resolve", "k-done", "--not-run", "--reason", " "},
				{"ledger", "show"},
				{"ledger", "show", "k-done", "--tool", "create_ticket", "--args", "{}"},
				{"ledger", "show", "--conversation", "c", "--turn", "1", "--tool", "create_ticket"},
				{"ledger", "show", "--conversation", "c", "--turn", "1", "--tool", "create_ticket", "--args", "[1]"},
				{"ledger", "show", "--conversation", "c", "--turn", "1", "--tool", "create_ticket", "--args", "{}"},
				{"ledger", "ls", "--older-than", "soon"},
				{"ledger", "ls", "--limit", "0"},
				{"ledger", "ls", "--state", "bogus"},
				{"ledger", "purge"},
				{"ledger", "purge", "--older-than", "soon"},
				{"ledger", "frob"},
			} {
				if _, err := runConsumer(t, env, bad...); err == nil || strings.Contains(err.Error(), "\n") {
					t.Errorf("%v: %v", bad, err)
				}
			}
			if _, err := runConsumer(t, env, "ledger", "resolve", "k-done", "--attempt", "2", "--output", `{"ticket":"T-9"}`, "--reason", "T-9 is in the tracker"); err == nil ||
				!strings.Contains(err.Error(), "indeterminate at attempt 1, not 2") {
				t.Fatalf("a resolution of another attempt: %v", err)
			}
			if _, err := runConsumer(t, env, "ledger", "resolve", "k-done", "--attempt", "1", "--output", `{"ticket":"T-9"}`, "--reason", "T-9 is in the tracker"); err != nil {
				t.Fatal(err)
			}
			if _, err := runConsumer(t, env, "ledger", "resolve", "k-notrun", "--not-run", "--reason", "no ticket", "--by", "alice"); err != nil {
				t.Fatal(err)
			}
			if _, err := runConsumer(t, env, "ledger", "resolve", "k-open", "--not-run", "--reason", "x"); err == nil {
				t.Fatal("resolved an in-flight row")
			}
			if out, err := runConsumer(t, env, "ledger", "resolve", "k-done", "--output", `{"ticket":"T-9"}`, "--reason", "again"); err != nil ||
				!strings.Contains(out, "already resolved") {
				t.Fatalf("the same resolution again: %q %v", out, err)
			}
			if _, err := runConsumer(t, env, "ledger", "resolve", "k-done", "--not-run", "--reason", "changed my mind"); err == nil ||
				!strings.Contains(err.Error(), "was resolved completed") {
				t.Fatalf("another decision: %v", err)
			}
			if out, err := runConsumer(t, env, "ledger", "show", "k-done"); err != nil || !strings.Contains(out, "history:") ||
				!strings.Contains(out, "resolve completed (T-9 is in the tracker); was indeterminate, reset: reset mid-response") {
				t.Fatalf("show prints the history: %q %v", out, err)
			}
			for _, c := range []struct {
				args []string
				want int
			}{
				{[]string{"--tool", "create_ticket"}, 2},
				{[]string{"--conversation", "c", "--state", "completed"}, 1},
				{[]string{"--newer-than", "1h"}, 2},
				{[]string{"--older-than", "1h"}, 0},
				{[]string{"--tool", "other"}, 0},
			} {
				out, err := runConsumer(t, env, append([]string{"ledger", "ls", "--json"}, c.args...)...)
				var rows []ledger.Row
				if err != nil || json.Unmarshal([]byte(out), &rows) != nil || len(rows) != c.want {
					t.Errorf("ls %v: %q %v, want %d rows", c.args, out, err, c.want)
				}
			}
			if got, _ := st.Get(ctx, "k-done"); got.State != ledger.Completed || string(got.Result) != `{"ticket":"T-9"}` {
				t.Fatalf("after resolve --output: %+v", got)
			}
			if _, err := st.Get(ctx, "k-notrun"); err == nil {
				t.Fatal("resolve --not-run kept the row")
			}
			// A call named by its fields instead of its key.
			key, _ := jobs.Call{ConversationID: "c9", TurnIndex: 2, Tool: "create_ticket", Args: []byte(`{"a":1}`)}.Key()
			row = claim(key)
			if err := st.MarkIndeterminate(ctx, row.Fence(), ledger.ErrorInfo{Code: "reset"}); err != nil {
				t.Fatal(err)
			}
			fields := []string{"--conversation", "c9", "--turn", "2", "--tool", "create_ticket", "--args", `{ "a": 1 }`}
			if out, err := runConsumer(t, env, append([]string{"ledger", "resolve", "--output", `{"id":"T-3"}`, "--reason", "found T-3"}, fields...)...); err != nil ||
				!strings.Contains(out, key+" completed") {
				t.Fatalf("resolve by the call's fields: %q %v", out, err)
			}
			if out, err := runConsumer(t, env, append([]string{"ledger", "show"}, fields...)...); err != nil || !strings.Contains(out, "found T-3") {
				t.Fatalf("show by the call's fields: %q %v", out, err)
			}
			// A tenant's call is named by its fields with --tenant: its key
			// carries the tenant, and the same fields without it name the
			// default tenant's call, another row.
			tenantKey, _ := jobs.Call{Tenant: "acme", ConversationID: "c9", TurnIndex: 2, Tool: "create_ticket", Args: []byte(`{"a":1}`)}.Key()
			if tenantKey == key {
				t.Fatal("a tenant's call has the default tenant's key")
			}
			res, err := st.Claim(ctx, []ledger.Claim{{Key: tenantKey, ConversationID: "c9", TurnIndex: 2, Tool: "create_ticket", ArgsDigest: "d",
				ToolUseID: "toolu_1", Owner: "o", Lease: time.Hour, Tenant: "acme"}})
			if err != nil || !res[0].Claimed {
				t.Fatalf("claim acme's call: %v", err)
			}
			row = res[0].Row
			if err := st.MarkIndeterminate(ctx, row.Fence(), ledger.ErrorInfo{Code: "reset"}); err != nil {
				t.Fatal(err)
			}
			tenantFields := append([]string{"--tenant", "acme"}, fields...)
			if out, err := runConsumer(t, env, append([]string{"ledger", "resolve", "--not-run", "--reason", "no T-4 for acme"}, tenantFields...)...); err != nil ||
				!strings.Contains(out, tenantKey) {
				t.Fatalf("resolve a tenant's call by its fields: %q %v", out, err)
			}
			if got, _ := st.Get(ctx, key); got.State != ledger.Completed {
				t.Fatalf("resolving the tenant's call touched the default tenant's: %+v", got)
			}
			if _, err := runConsumer(t, env, "ledger", "show", "--tenant", "Not A Tenant", "--conversation", "c9", "--turn", "2", "--tool", "create_ticket", "--args", "{}"); err == nil ||
				!strings.Contains(err.Error(), "tenant") {
				t.Fatalf("show with an invalid tenant: %v", err)
			}
			out, err = runConsumer(t, env, "ledger", "purge", "--older-than", "31d")
			if err != nil || !strings.Contains(out, "purged 0 row") {
				t.Fatalf("purge: %q %v", out, err)
			}
		})
	}
}

// TestLedgerPurgeDeletesOnlyFinishedRows: on streams whose DLQ keeps 30
// days, --older-than 1d is refused with the reason and changes nothing; a
// safe age deletes the finished rows older than it, and no in-flight or
// indeterminate one, however old.
func TestLedgerPurgeDeletesOnlyFinishedRows(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dir, env := purgeEnv(t)
	st, err := ledger.Open(ctx, "", dir)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	settle := map[string]func(ledger.Fence) error{
		"old-completed":     func(f ledger.Fence) error { return st.Complete(ctx, f, json.RawMessage(`{}`)) },
		"old-failed":        func(f ledger.Fence) error { return st.Fail(ctx, f, ledger.ErrorInfo{Code: "declined"}) },
		"old-indeterminate": func(f ledger.Fence) error { return st.MarkIndeterminate(ctx, f, ledger.ErrorInfo{Code: "reset"}) },
		"old-in-flight":     func(ledger.Fence) error { return nil },
		"new-completed":     func(f ledger.Fence) error { return st.Complete(ctx, f, json.RawMessage(`{}`)) },
	}
	for key, settle := range settle {
		res, err := st.Claim(ctx, []ledger.Claim{{Key: key, ConversationID: "c", Tool: "send_payment", ArgsDigest: "d", ToolUseID: "toolu_1", Owner: "o", Lease: time.Hour}})
		if err != nil || !res[0].Claimed {
			t.Fatalf("claim %s: %v", key, err)
		}
		if err := settle(res[0].Row.Fence()); err != nil {
			t.Fatal(err)
		}
	}
	raw, err := sql.Open("sqlite", filepath.Join(dir, "ledger.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	if _, err := raw.Exec(`UPDATE toolq_ledger SET updated_at = updated_at - ? WHERE key LIKE 'old-%'`, (40 * 24 * time.Hour).Milliseconds()); err != nil {
		t.Fatal(err)
	}
	if _, err := runConsumer(t, env, "ledger", "purge", "--older-than", "1d"); err == nil ||
		!strings.Contains(err.Error(), "refused: --older-than 1d is not longer than TOOLQ_DLQ's max age 30d") {
		t.Fatalf("purge --older-than 1d: %v", err)
	}
	if out, err := runConsumer(t, env, "ledger", "purge", "--older-than", "31d", "--dry-run"); err != nil || !strings.Contains(out, "would purge 2 row(s)") {
		t.Fatalf("dry run: %q %v", out, err)
	}
	if out, err := runConsumer(t, env, "ledger", "purge", "--older-than", "31d"); err != nil || !strings.Contains(out, "purged 2 row(s)") {
		t.Fatalf("purge: %q %v", out, err)
	}
	for key := range settle {
		_, err := st.Get(ctx, key)
		if gone := errors.Is(err, ledger.ErrNotFound); gone != (key == "old-completed" || key == "old-failed") {
			t.Errorf("%s: %v", key, err)
		}
	}
}

// TestLedgerCommandsFailCleanly: every ledger command on a missing key or
// ledger, or with bad flags, returns one line of error and changes nothing:
// no row, no purge record, no ledger file where there was none.
func TestLedgerCommandsFailCleanly(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	n, _ := withStreams(t)
	dir, empty := t.TempDir(), t.TempDir()
	env := map[string]string{"TOOLQ_DATA_DIR": dir, "NATS_URL": n.URL}
	st := migratedLedger(t, env)
	for _, key := range []string{"k-done", "k-unknown"} {
		res, err := st.Claim(ctx, []ledger.Claim{{Key: key, ConversationID: "c", Tool: "create_ticket", ArgsDigest: "d", ToolUseID: "toolu_1", Owner: "o", Lease: time.Hour}})
		if err != nil {
			t.Fatal(err)
		}
		f := res[0].Row.Fence()
		if key == "k-unknown" {
			err = st.MarkIndeterminate(ctx, f, ledger.ErrorInfo{Code: "reset"})
		} else {
			err = st.Complete(ctx, f, json.RawMessage(`{}`))
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	snapshot := func() string {
		rows, err := st.List(ctx, ledger.Filter{Limit: 1000})
		if err != nil {
			t.Fatal(err)
		}
		for i := range rows {
			rows[i].LeaseRemaining = 0
		}
		p, err := st.LastPurge(ctx)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := json.Marshal([]any{rows, p})
		return string(b)
	}
	before := snapshot()
	other := map[string]string{"TOOLQ_DATA_DIR": empty, "NATS_URL": n.URL}
	for _, c := range []struct {
		env  map[string]string
		args []string
		want string
	}{
		{env, []string{"show", "missing"}, "key not found: missing"},
		{env, []string{"show", "--conversation", "c", "--turn", "1", "--tool", "create_ticket", "--args", "{}"}, "key not found"},
		{env, []string{"resolve", "missing", "--not-run", "--reason", "r"}, "key not found: missing"},
		{env, []string{"resolve", "k-done", "--not-run", "--reason", "r"}, "row is not indeterminate: k-done is completed"},
		{env, []string{"resolve", "k-unknown", "--not-run"}, "--reason is required"},
		{env, []string{"resolve", "k-unknown", "--output", "{bad", "--reason", "r"}, "not valid JSON"},
		{env, []string{"resolve", "k-unknown", "--not-run", "--reason", "r", "--log-format", "xml"}, "--log-format"},
		{env, []string{"purge", "--older-than", "1d"}, "refused: --older-than 1d is not longer than TOOLQ_DLQ's max age 30d"},
		{env, []string{"purge", "--older-than", "31d", "--batch", "0"}, "--batch 0"},
		{env, []string{"purge", "--older-than", "31d", "--bogus"}, "bogus"},
		{env, []string{"ls", "--state", "bogus"}, "--state"},
		{env, []string{"ls", "--older-than", "soon"}, "--older-than"},
		{env, []string{"ls", "--limit", "0"}, "--limit"},
		{env, []string{"ls", "--database-url", "mysql://x"}, "unsupported database URL"},
		{env, []string{"show"}, "want exactly one KEY"},
		{other, []string{"ls"}, "no ledger at " + empty},
		{other, []string{"show", "k-done"}, "no ledger at"},
		{other, []string{"resolve", "k-unknown", "--not-run", "--reason", "r"}, "no ledger at"},
		{other, []string{"purge", "--older-than", "31d"}, "no ledger at"},
	} {
		out, err := runConsumer(t, c.env, append([]string{"ledger"}, c.args...)...)
		if err == nil || !strings.Contains(err.Error(), c.want) || strings.Contains(err.Error(), "\n") {
			t.Errorf("ledger %v: %q %v, want one line with %q", c.args, out, err, c.want)
		}
	}
	if after := snapshot(); after != before {
		t.Fatalf("a failed command changed the ledger:\nbefore %s\nafter  %s", before, after)
	}
	if _, err := os.Stat(filepath.Join(empty, "ledger.db")); err == nil {
		t.Fatal("a failed command made a ledger")
	}
}

func TestToolsAudit(t *testing.T) {
	t.Parallel()
	out, err := runConsumer(t, nil, "tools", "audit", "--json")
	var audits []map[string]any
	if err != nil || json.Unmarshal([]byte(out), &audits) != nil || len(audits) != 3 {
		t.Fatalf("audit --json: %q %v", out, err)
	}
	for _, a := range audits {
		if a["name"] == "" || a["class"] == "" || a["can_double_fire"] != false {
			t.Fatalf("demo tool %v", a)
		}
	}
	// A keyed write that does not forward its key can double-fire, and the
	// table says why.
	path := t.TempDir() + "/tools.yaml"
	os.WriteFile(path, []byte(`tools:
  - name: legacy_pay
    class: keyed_write
    schema: {type: object}
    http: {url: "http://127.0.0.1:1/pay", idempotency_header: "-"}
`), 0o600)
	out, err = runConsumer(t, nil, "tools", "audit", "--tools", path)
	if err != nil || !strings.Contains(out, "legacy_pay") || !strings.Contains(out, "yes, because a keyed write that does not forward its key") {
		t.Fatalf("audit table: %q %v", out, err)
	}
	if _, err := runConsumer(t, nil, "tools", "audit", "--tools", path+".missing"); err == nil {
		t.Fatal("missing file accepted")
	}
}

// TestLedgerPurgeOutlivesTheStreams: a purge whose retention does not
// outlive every way a job can come back is refused, with the stream setting
// it fails, read from the live streams; without them it takes a stated
// horizon, never one shorter than the defaults. A purge is recorded.
func TestLedgerPurgeOutlivesTheStreams(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	streams := func(s jobs.Streams) string {
		n := testenv.StartNATS(t)
		js, _ := jetstream.New(n.Connect())
		if err := jobs.ProvisionStreams(ctx, js, s); err != nil {
			t.Fatal(err)
		}
		return n.URL
	}
	defaults, longJobs := streams(jobs.Streams{}), streams(jobs.Streams{JobsMaxAge: 45 * 24 * time.Hour})
	bare := testenv.StartNATS(t).URL // JetStream, and none of toolq's streams
	down := testenv.StartNATS(t)
	down.Shutdown()
	dir := t.TempDir()
	env := func(natsURL string) map[string]string {
		return map[string]string{"TOOLQ_DATA_DIR": dir, "NATS_URL": natsURL}
	}
	if _, err := runConsumer(t, env(defaults), "migrate"); err != nil {
		t.Fatal(err)
	}
	registry := func(text string) string {
		path := filepath.Join(t.TempDir(), "tools.yaml")
		os.WriteFile(path, []byte(text), 0o600)
		return path
	}
	payLonger := registry("retention: 31d\ntools:\n  - name: send_payment\n    retention: 90d\n")
	tooShort := registry("retention: 31d\ntools:\n  - name: create_ticket\n    retention: 10d\n")
	noDefault := registry("tools:\n  - name: send_payment\n    retention: 90d\n")
	for _, c := range []struct {
		nats string
		args []string
		want string // in the error; empty: accepted
	}{
		{defaults, []string{"--older-than", "8d"}, "refused: --older-than 8d is not longer than TOOLQ_DLQ's max age 30d: a dead letter requeued after the purge would run its call again"},
		{defaults, []string{"--older-than", "30d"}, "TOOLQ_DLQ's max age 30d"},
		{defaults, []string{"--older-than", "3d", "--dry-run"}, "TOOLQ_DLQ's max age 30d"},
		{longJobs, []string{"--older-than", "31d"}, "TOOLQ_JOBS's max age 45d: a replay of an older job would run its call again"},
		{bare, []string{"--older-than", "31d"}, "refused: cannot read the streams at " + bare},
		{down.URL, []string{"--older-than", "31d"}, "--horizon"},
		{down.URL, []string{"--older-than", "31d", "--horizon", "10d"}, "--horizon 10d is shorter than TOOLQ_DLQ's default max age 30d"},
		{down.URL, []string{"--older-than", "20d", "--horizon", "30d"}, "--older-than 20d is not longer than --horizon 30d"},
		{longJobs, []string{"--older-than", "40d", "--horizon", "30d"}, "TOOLQ_JOBS's max age 45d"},
		{defaults, []string{"--older-than", "31d", "--dry-run"}, ""},
		{defaults, []string{"--older-than", "31d", "--tools", payLonger}, "refused: --older-than 31d is shorter than send_payment's retention 90d in " + payLonger},
		{defaults, []string{"--tools", tooShort}, "refused: create_ticket's retention 10d in " + tooShort + " is not longer than TOOLQ_DLQ's max age 30d"},
		{defaults, []string{"--tools", noDefault}, "--older-than is required: " + noDefault + " states no top-level retention"},
		{defaults, []string{"--tools", payLonger + ".missing"}, "no such file"},
		{defaults, []string{"--tools", payLonger, "--dry-run"}, ""},
	} {
		out, err := runConsumer(t, env(c.nats), append([]string{"ledger", "purge"}, c.args...)...)
		switch {
		case c.want == "" && err != nil:
			t.Errorf("%v: %v", c.args, err)
		case c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want) || strings.Contains(err.Error(), "\n")):
			t.Errorf("%v on %s: %q %v, want a one-line refusal with %q", c.args, c.nats, out, err, c.want)
		}
	}
	st, err := ledger.Open(ctx, "", dir)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if r, err := st.LastPurge(ctx); err != nil || !r.PurgedBefore.IsZero() {
		t.Fatalf("a refused purge or a dry run was recorded: %+v %v", r, err)
	}
	out, err := runConsumer(t, env(down.URL), "ledger", "purge", "--older-than", "31d", "--horizon", "30d")
	if err != nil || !strings.Contains(out, "purged 0 row(s)") {
		t.Fatalf("purge with a horizon: %q %v", out, err)
	}
	if out, err := runConsumer(t, env(defaults), "ledger", "purge", "--older-than", "31d", "--dry-run"); err != nil || !strings.Contains(out, "would purge 0 row(s)") {
		t.Fatalf("dry run: %q %v", out, err)
	}
	if r, err := st.LastPurge(ctx); err != nil || r.OlderThan != 31*24*time.Hour {
		t.Fatalf("the purge was not recorded: %+v %v", r, err)
	}
	// Each tool at its own retention: send_payment's rows are kept 90 days.
	var logs bytes.Buffer
	err = run(ctx, []string{"ledger", "purge", "--tools", payLonger, "--log-format", "json"}, cli.IO{Out: &logs, Err: &logs},
		func(k string) string { return env(defaults)[k] })
	if err != nil || !strings.Contains(logs.String(), "purged 0 row(s) of send_payment finished before") ||
		!strings.Contains(logs.String(), "purged 0 row(s) of every other tool") ||
		!strings.Contains(logs.String(), `"msg":"ledger purged","rows":"send_payment","older_than":"90d"`) {
		t.Fatalf("purge by tool: %q %v", logs.String(), err)
	}
}

// withStreams starts a server with toolq's streams.
func withStreams(t *testing.T) (*testenv.NATS, jetstream.JetStream) {
	t.Helper()
	n := testenv.StartNATS(t)
	js, _ := jetstream.New(n.Connect())
	if err := jobs.ProvisionStreams(context.Background(), js, jobs.Streams{}); err != nil {
		t.Fatal(err)
	}
	return n, js
}

// migratedLedger migrates the ledger env names with `consumer migrate` and
// opens it.
func migratedLedger(t *testing.T, env map[string]string) *ledger.Store {
	t.Helper()
	if _, err := runConsumer(t, env, "migrate"); err != nil {
		t.Fatal(err)
	}
	st, err := ledger.Open(context.Background(), env["DATABASE_URL"], env["TOOLQ_DATA_DIR"])
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(st.Close)
	return st
}

// purgeEnv is a purge's surroundings: a NATS server with toolq's streams
// (a purge reads their ages) and a migrated SQLite ledger in dir, named in
// env as the consumer reads them.
func purgeEnv(t *testing.T) (dir string, env map[string]string) {
	t.Helper()
	n, _ := withStreams(t)
	dir = t.TempDir()
	env = map[string]string{"TOOLQ_DATA_DIR": dir, "NATS_URL": n.URL}
	if _, err := runConsumer(t, env, "migrate"); err != nil {
		t.Fatal(err)
	}
	return dir, env
}

// TestLedgerShowByFieldsFindsTheRowTheWorkerAnswersFrom: a call whose
// args have member names sharing a high surrogate (👎, 👍) had another key
// before the member-order fix; its row, indeterminate, is under that key,
// and the worker (and replay) answer the call from it. `ledger show` and
// `ledger resolve` by the call's fields (the runbook's way to find an
// indeterminate call) find and settle that row, as the worker would.
func TestLedgerShowByFieldsFindsTheRowTheWorkerAnswersFrom(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dir := t.TempDir()
	env := map[string]string{"TOOLQ_DATA_DIR": dir}
	st := migratedLedger(t, env)
	args := `{"votes":{"👎":3,"👍":12}}`
	legacy := indeterminateUnderLegacyKey(t, st, args)
	out, err := runConsumer(t, env, "ledger", "show", "--conversation", "c", "--turn", "1", "--tool", "cast_vote", "--args", args, "--json")
	var row ledger.Row
	if err != nil || json.Unmarshal([]byte(out), &row) != nil || row.Key != legacy.Key() {
		t.Fatalf("ledger show by the call's fields: %q %v; want the indeterminate row under %s, which the worker answers the call from", out, err, legacy.Key())
	}
	if out, err := runConsumer(t, env, "ledger", "resolve", "--conversation", "c", "--turn", "1", "--tool", "cast_vote", "--args", args,
		"--attempt", "1", "--output", `{"counted":true}`, "--reason", "the vote is in"); err != nil || !strings.Contains(out, legacy.Key()) {
		t.Fatalf("ledger resolve by the call's fields: %q %v; want the row under %s resolved", out, err, legacy.Key())
	}
	if row, err := st.Get(ctx, legacy.Key()); err != nil || row.State != ledger.Completed {
		t.Fatalf("the row under the key before the fix: %+v %v; want completed", row, err)
	}
}

// TestLedgerShowEscapesAToolsControlCharacters: an indeterminate row's
// error is the tool's text (a downstream's error body), and its approval
// args and history are the agent's; `ledger show`, the runbook's first
// step for an indeterminate call, prints them escaped, as `dlq show` does,
// and says which attempt a resolution names.
func TestLedgerShowEscapesAToolsControlCharacters(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dir := t.TempDir()
	env := map[string]string{"TOOLQ_DATA_DIR": dir}
	if _, err := runConsumer(t, env, "migrate"); err != nil {
		t.Fatal(err)
	}
	st, err := ledger.Open(ctx, "", dir)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	res, err := st.Claim(ctx, []ledger.Claim{{Key: "k-esc", ConversationID: "c", TurnIndex: 1, Tool: "t",
		ArgsDigest: "d", ToolUseID: "toolu_0", Owner: "w", Lease: time.Hour}})
	if err != nil || !res[0].Claimed {
		t.Fatalf("claim: %v %+v", err, res)
	}
	if err := st.MarkIndeterminate(ctx, res[0].Row.Fence(), ledger.ErrorInfo{Code: "reset", Message: "upstream said \x1b]0;owned\x07\x1b[2J"}); err != nil {
		t.Fatal(err)
	}
	out, err := runConsumer(t, env, "ledger", "show", "k-esc")
	if err != nil {
		t.Fatal(err)
	}
	if strings.ContainsAny(out, "\x1b\x07") {
		t.Fatalf("ledger show printed the tool's escape sequences raw: %q", out)
	}
	if !strings.Contains(out, `upstream said \x1b]0;owned\a\x1b[2J`) || !strings.Contains(out, "resolve with --attempt 1") {
		t.Fatalf("ledger show: %q; want the error escaped and the attempt to resolve", out)
	}
}

// TestAResolutionByFieldsRepeatedOnALegacyRowChangesNothing: the
// runbook's resolution by the call's fields, of a row under the key from
// before the member-order fix, releases that row. The same command again
// finds the released row and changes nothing ("was already resolved this
// way"), where Get, which does not see it, would have found no row.
func TestAResolutionByFieldsRepeatedOnALegacyRowChangesNothing(t *testing.T) {
	t.Parallel()
	env := map[string]string{"TOOLQ_DATA_DIR": t.TempDir()}
	st := migratedLedger(t, env)
	args := `{"votes":{"👎":3,"👍":12}}`
	indeterminateUnderLegacyKey(t, st, args)
	resolve := []string{"ledger", "resolve", "--conversation", "c", "--turn", "1", "--tool", "cast_vote", "--args", args,
		"--attempt", "1", "--not-run", "--reason", "no vote in the tally"}
	if _, err := runConsumer(t, env, resolve...); err != nil {
		t.Fatal(err)
	}
	if out, err := runConsumer(t, env, resolve...); err != nil || !strings.Contains(out, "already resolved this way") {
		t.Fatalf("the same resolution by the call's fields again: %q %v; want \"already resolved this way: nothing changed\"", out, err)
	}
}

// indeterminateUnderLegacyKey leaves the call of args (conversation c, turn
// 1, cast_vote) indeterminate under the key it had before the member-order
// fix, as a consumer of that release would have, and returns that key's
// material.
func indeterminateUnderLegacyKey(t *testing.T, st *ledger.Store, args string) jobs.Material {
	t.Helper()
	ctx := context.Background()
	m, err := jobs.Call{ConversationID: "c", TurnIndex: 1, Tool: "cast_vote", Args: []byte(args)}.Material()
	if err != nil {
		t.Fatal(err)
	}
	legacy, ok := m.Legacy()
	if !ok {
		t.Fatal("no legacy key")
	}
	res, err := st.Claim(ctx, []ledger.Claim{{Key: legacy.Key(), ConversationID: "c", TurnIndex: 1, Tool: "cast_vote",
		ArgsDigest: legacy.ArgsDigest(), ToolUseID: "toolu_0", Owner: "before-the-fix", Lease: time.Hour}})
	if err != nil || !res[0].Claimed {
		t.Fatalf("claim: %v %+v", err, res)
	}
	if err := st.MarkIndeterminate(ctx, res[0].Row.Fence(), ledger.ErrorInfo{Code: "reset", Message: "reset"}); err != nil {
		t.Fatal(err)
	}
	return legacy
}
