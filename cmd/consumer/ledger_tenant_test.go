package main

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolq/toolq/internal/cli"
	"github.com/toolq/toolq/internal/testenv"
	"github.com/toolq/toolq/jobs"
	"github.com/toolq/toolq/ledger"
)

// TestApproveTakesNoTenantFlag: approve and deny take a tenant's call by
// its key, and have no --tenant: it is one letter from approve's --tenants
// (the tenants the consumers serve), and an operator who means "--tenants
// acme" while naming the default tenant's call by its fields must be
// refused, not have acme's identical call approved.
func TestApproveTakesNoTenantFlag(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	n := testenv.StartNATS(t)
	js, _ := jetstream.New(n.Connect())
	if err := jobs.ProvisionStreams(ctx, js, jobs.Streams{Tenants: []string{"acme"}}); err != nil {
		t.Fatal(err)
	}
	env := map[string]string{"TOOLQ_DATA_DIR": t.TempDir(), "NATS_URL": n.URL}
	st := migratedLedger(t, env)
	args := `{"amount_cents":90000}`
	await := func(tenant string) string {
		key, err := jobs.Call{Tenant: tenant, ConversationID: "c", Tool: "send_payment", Args: json.RawMessage(args)}.Key()
		if err != nil {
			t.Fatal(err)
		}
		res, err := st.Claim(ctx, []ledger.Claim{{Key: key, ConversationID: "c", Tool: "send_payment", ArgsDigest: "d",
			ToolUseID: "toolu_" + tenant, Owner: "o", Lease: time.Hour, Token: "t-" + tenant, Tenant: tenant}})
		if err != nil || !res[0].Claimed {
			t.Fatalf("claim %q: %v", tenant, err)
		}
		if _, err := st.AwaitApproval(ctx, res[0].Row.Fence(), ledger.ApprovalInfo{Args: json.RawMessage(args), Group: "finance", TTL: time.Hour}, "toolu_"+tenant); err != nil {
			t.Fatal(err)
		}
		return key
	}
	await("")
	acme := await("acme")
	// Meant: --tenants acme (the consumers serve acme), the default tenant's call by its fields.
	out, err := runConsumer(t, env, "approve", "--tenant", "acme", "--conversation", "c", "--turn", "0", "--tool", "send_payment", "--args", args,
		"--reason", "invoice 42", "--by", "alice")
	row, _ := st.GetOrApproved(ctx, acme)
	if err == nil || row.ApprovalStatus != ledger.ApprovalAwaiting {
		t.Fatalf("approve --tenant acme (approve's synopsis has no --tenant; a tenant's call is given by its key): %q %v; acme's row now %s", out, err, row.ApprovalStatus)
	}
}

// claimTicket claims tenant's call (the default tenant's for "") of
// create_ticket {"a":1} at turn 2 of conversation c9, and returns its key
// and row.
func claimTicket(t *testing.T, st *ledger.Store, tenant string) (string, ledger.Row) {
	t.Helper()
	key, err := jobs.Call{Tenant: tenant, ConversationID: "c9", TurnIndex: 2, Tool: "create_ticket", Args: []byte(`{"a":1}`)}.Key()
	if err != nil {
		t.Fatal(err)
	}
	res, err := st.Claim(context.Background(), []ledger.Claim{{Key: key, ConversationID: "c9", TurnIndex: 2, Tool: "create_ticket", ArgsDigest: "d",
		ToolUseID: "toolu_" + tenant + "x", Owner: "o", Lease: time.Hour, Tenant: tenant}})
	if err != nil || !res[0].Claimed {
		t.Fatalf("claim %q's call: %v", tenant, err)
	}
	return key, res[0].Row
}

// TestLedgerShowPrintsWhoseCallARowIs: the tenant is one of the fields
// that name a call, so `ledger show` prints it with the others: an
// operator who copies them to name the call gives --tenant too.
func TestLedgerShowPrintsWhoseCallARowIs(t *testing.T) {
	t.Parallel()
	env := map[string]string{"TOOLQ_DATA_DIR": t.TempDir()}
	st := migratedLedger(t, env)
	key, _ := claimTicket(t, st, "acme")
	out, err := runConsumer(t, env, "ledger", "show", key)
	if err != nil || !strings.Contains(out, "tenant:") || !strings.Contains(out, "acme") {
		t.Fatalf("ledger show of acme's row does not say it is acme's:\n%s %v", out, err)
	}
	other, _ := claimTicket(t, st, "")
	if out, err := runConsumer(t, env, "ledger", "show", other); err != nil || !strings.Contains(out, "(default)") {
		t.Fatalf("ledger show of the default tenant's row does not say so:\n%s %v", out, err)
	}
}

// TestLedgerCommandsRefuseAnEmptyTenant: `--tenant ""` (--tenant
// "$TENANT" with TENANT unset) is refused rather than taken as the default
// tenant's call: a resolution meant for a tenant's call must not release
// the default tenant's identical one.
func TestLedgerCommandsRefuseAnEmptyTenant(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	env := map[string]string{"TOOLQ_DATA_DIR": t.TempDir()}
	st := migratedLedger(t, env)
	key, row := claimTicket(t, st, "")
	if err := st.MarkIndeterminate(ctx, row.Fence(), ledger.ErrorInfo{Code: "reset"}); err != nil {
		t.Fatal(err)
	}
	out, err := runConsumer(t, env, "ledger", "resolve", "--tenant", "", "--conversation", "c9", "--turn", "2", "--tool", "create_ticket", "--args", `{"a":1}`,
		"--not-run", "--reason", "no ticket for acme")
	if err == nil || !strings.Contains(err.Error(), "--tenant is empty") {
		t.Fatalf("--tenant \"\" resolved the default tenant's row: %q %v", out, err)
	}
	if got, err := st.Get(ctx, key); err != nil || got.State != ledger.Indeterminate {
		t.Fatalf("after the refusal: %+v %v", got, err)
	}
}

// TestLedgerLsShowsWhoseCallEachRowIs: two tenants' identical calls differ
// in nothing but the key and the tenant, so `ledger ls` prints a TENANT
// column when a row listed is a tenant's (and none when no row is), and
// --tenant lists one tenant's rows.
func TestLedgerLsShowsWhoseCallEachRowIs(t *testing.T) {
	t.Parallel()
	env := map[string]string{"TOOLQ_DATA_DIR": t.TempDir()}
	st := migratedLedger(t, env)
	for _, tenant := range []string{"", "acme"} {
		claimTicket(t, st, tenant)
		if tenant == "" {
			if out, err := runConsumer(t, env, "ledger", "ls"); err != nil || strings.Contains(out, "TENANT") {
				t.Fatalf("ledger ls of the default tenant's rows alone: %q %v", out, err)
			}
		}
	}
	out, err := runConsumer(t, env, "ledger", "ls")
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 3 || !strings.HasPrefix(lines[0], "TENANT") {
		t.Fatalf("ledger ls of two tenants' rows:\n%s", out)
	}
	got := map[string]bool{strings.Fields(lines[1])[0]: true, strings.Fields(lines[2])[0]: true}
	if !got["acme"] || !got["(default)"] {
		t.Fatalf("ledger ls does not say whose call each row is:\n%s", out)
	}
	out, err = runConsumer(t, env, "ledger", "ls", "--tenant", "acme")
	if lines := strings.Split(strings.TrimSpace(out), "\n"); err != nil || len(lines) != 2 || strings.Fields(lines[1])[0] != "acme" {
		t.Fatalf("ledger ls --tenant acme: %q %v", out, err)
	}
	for _, bad := range []string{"", "Not A Tenant", "jobs"} {
		if out, err := runConsumer(t, env, "ledger", "ls", "--tenant", bad); err == nil || !strings.Contains(err.Error(), "--tenant") {
			t.Errorf("ledger ls --tenant %q: %q %v", bad, out, err)
		}
	}
}

// TestApproveRefusesKeyAndFieldsWithoutOfferingTenant: approve's refusal
// of a KEY given with the call's fields is a usage error (exit 2) that
// names the flags approve takes, and --tenant is not one of them.
func TestApproveRefusesKeyAndFieldsWithoutOfferingTenant(t *testing.T) {
	t.Parallel()
	env := map[string]string{"TOOLQ_DATA_DIR": t.TempDir()}
	_, err := runConsumer(t, env, "approve", "0123456789abcdef0123456789abcdef", "--conversation", "c", "--turn", "0",
		"--tool", "t", "--args", "{}", "--reason", "r", "--by", "b")
	var exit *cli.ExitError
	if err == nil || !strings.Contains(err.Error(), "not both") || strings.Contains(err.Error(), "--tenant") ||
		!errors.As(err, &exit) || exit.Code != cli.ExitUsage {
		t.Fatalf("approve's error: %v", err)
	}
	_, err = runConsumer(t, env, "ledger", "show", "0123456789abcdef0123456789abcdef", "--tenant", "acme")
	if err == nil || !strings.Contains(err.Error(), "[--tenant]") || !errors.As(err, &exit) || exit.Code != cli.ExitUsage {
		t.Fatalf("ledger show's error: %v", err)
	}
}
