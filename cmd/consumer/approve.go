package main

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolq/toolq/approvals"
	"github.com/toolq/toolq/internal/cli"
	"github.com/toolq/toolq/jobs"
	"github.com/toolq/toolq/ledger"
)

func runApprove(ctx context.Context, args []string, stdio cli.IO, getenv func(string) string) error {
	return decide(ctx, args, stdio, getenv, true)
}

func runDeny(ctx context.Context, args []string, stdio cli.IO, getenv func(string) string) error {
	return decide(ctx, args, stdio, getenv, false)
}

// decide records an operator's decision on a call awaiting approval, in
// the ledger, and announces it through NATS (the approval event, the
// call's job again) when NATS answers; otherwise a running consumer's sweep
// announces it within its Unanswered period.
func decide(ctx context.Context, args []string, stdio cli.IO, getenv func(string) string, approve bool) error {
	verb, effect := "deny", "the call never runs; every tool_use_id that asked gets the result denied"
	if approve {
		verb, effect = "approve", "the call runs once, under its key; every tool_use_id that asked gets its result"
	}
	fs := cli.NewFlagSet(verb, "consumer "+verb+" (KEY | --conversation C --turn N --tool T [--ordinal K] --args JSON)\n"+
		"                --reason TEXT [--by NAME] [--digest HEX]\n\n"+
		"Decides a call awaiting approval: "+effect+".\n"+
		"Who, when, why and the args digest are recorded in the row's history ('ledger show').\n"+
		"A call no longer waiting (decided, expired) is refused, naming the decision that stands.", stdio)
	var sf storeFlags
	sf.register(fs, getenv)
	var nf cli.NATSFlags
	nf.Register(fs, getenv, "nats://127.0.0.1:4222", "NATS server to announce the decision on; when it does not answer, a running consumer announces it")
	reason := fs.String("reason", "", "why (required; recorded with the decision)")
	by := fs.String("by", osUser(getenv), "who decided (default: the OS user)")
	digest := fs.String("digest", "", "the args digest you reviewed ('ledger show'): refused if the call's differs")
	tenantsFlag := fs.String("tenants", "", "the tenants the consumers serve (consumer run --tenants; docs/tenants.md), so that a tenant's call is announced on its tenant's subjects (give a tenant's call by its KEY); default: those whose results streams NATS has")
	var cf callFlags
	cf.register(fs, false)
	pos, help, err := cli.Parse(fs, args)
	if help {
		return cli.ErrHelp
	}
	if err != nil {
		return err
	}
	key, err := cf.key(fs, pos)
	if err != nil {
		return err
	}
	switch {
	case strings.TrimSpace(*reason) == "":
		return cli.Usagef("--reason is required: it is recorded with the decision")
	case strings.TrimSpace(*by) == "":
		return cli.Usagef("--by is required: no OS user to record as who decided")
	}
	if err := (ledger.Decision{By: *by, Reason: *reason}).Check(); err != nil {
		return cli.Usagef("%w", err)
	}
	st, err := sf.open(ctx)
	if err != nil {
		return err
	}
	defer st.Close()
	tenants, err := parseTenants(*tenantsFlag)
	if err != nil {
		return err
	}
	cfg := approvals.Config{Ledger: st, Tenants: tenants}
	nc, js, nerr := nf.JetStream("toolq-consumer-" + verb)
	if nerr == nil {
		defer nc.Close()
		cfg.JS = js
		if len(cfg.Tenants) == 0 {
			if cfg.Tenants, err = tenantsOf(ctx, js); err != nil {
				return err
			}
		}
	}
	svc, err := approvals.New(cfg)
	if err != nil {
		return err
	}
	row, err := svc.Decide(ctx, key, ledger.Decision{Approve: approve, By: *by, Reason: *reason, Digest: *digest})
	if err != nil {
		if errors.Is(err, ledger.ErrNotAwaiting) || errors.Is(err, ledger.ErrDecisionRefused) {
			return fmt.Errorf("%s refused: %w", verb, err)
		}
		return err
	}
	fmt.Fprintf(stdio.Out, "%s %s by %s at %s (%s): %s\n", key, row.ApprovalStatus, *by, time.Now().UTC().Format(time.RFC3339), *reason, effect)
	if nerr != nil {
		fmt.Fprintf(stdio.Err, "NATS did not answer (%v): a running consumer announces the decision within a minute\n", nerr)
	}
	return nil
}

// tenantsOf returns the tenants whose results streams (TOOLQ_<tenant>_RESULTS)
// the server has: those the consumers serve, when --tenants is not given.
// When the streams cannot be listed, the error: without the tenants, a
// tenant's call could not be announced on its subjects.
func tenantsOf(ctx context.Context, js jetstream.JetStream) ([]string, error) {
	var tenants []string
	names := js.StreamNames(ctx)
	for name := range names.Name() {
		if t, ok := strings.CutPrefix(name, "TOOLQ_"); ok {
			if t, ok = strings.CutSuffix(t, "_RESULTS"); ok && t != "" && jobs.ValidTenant(t) {
				tenants = append(tenants, t)
			}
		}
	}
	if err := names.Err(); err != nil {
		return nil, fmt.Errorf("cannot list the streams to find the tenants (%w): give --tenants", err)
	}
	return tenants, nil
}
