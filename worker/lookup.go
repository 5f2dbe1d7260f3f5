package worker

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"regexp"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"

	"github.com/toolq/toolq/approvals"
	"github.com/toolq/toolq/internal/version"
	"github.com/toolq/toolq/jobs"
	"github.com/toolq/toolq/ledger"
)

var keyPattern = regexp.MustCompile(`^[0-9a-f]{32}$`)

// ServeLookup answers jobs.LookupSubject from the ledger: a NATS micro
// service (toolq-ledger) whose requests are keys and whose answers are
// jobs.Lookup, so that an agent that restarted can ask whether a call
// already happened without access to the database. Every consumer serves
// it, in one queue group. With tenants, it answers their lookups on
// toolq.<tenant>.ledger.get too. Stop the service when done.
func ServeLookup(nc *nats.Conn, store *ledger.Store, log *slog.Logger, tenants ...string) (micro.Service, error) {
	if log == nil {
		log = slog.Default()
	}
	handler := micro.HandlerFunc(func(req micro.Request) {
		key := strings.TrimSpace(string(req.Data()))
		if !keyPattern.MatchString(key) {
			req.Error("400", "want a key: 32 lowercase hexadecimal characters", nil)
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		// A tenant asks on toolq.<tenant>.ledger.get, the default on
		// jobs.LookupSubject: each is answered of its own calls only, a
		// key of another tenant's as unknown.
		tenant := ""
		if subj := req.Subject(); subj != jobs.LookupSubject {
			tenant = strings.TrimSuffix(strings.TrimPrefix(subj, "toolq."), ".ledger.get")
		}
		l, err := lookup(ctx, store, key, tenant)
		if err != nil {
			log.Warn("ledger lookup failed", "key", key, "error", err)
			req.Error("503", "the ledger did not answer: "+err.Error(), nil)
			return
		}
		req.RespondJSON(l)
	})
	svc, err := micro.AddService(nc, micro.Config{
		Name:        "toolq-ledger",
		Version:     semver(version.Get().Version),
		Description: "what toolq's ledger knows of a call's key: did it already happen, and how did it end",
		Endpoint:    &micro.EndpointConfig{Subject: jobs.LookupSubject, Handler: handler},
	})
	if err != nil || len(tenants) == 0 {
		return svc, err
	}
	// The tenants' lookups, toolq.<tenant>.ledger.get: each tenant's
	// permissions let it ask on its own subject only.
	if err := svc.AddEndpoint("tenant-get", handler, micro.WithEndpointSubject("toolq.*.ledger.get")); err != nil {
		_ = svc.Stop()
		return nil, err
	}
	return svc, nil
}

func lookup(ctx context.Context, store *ledger.Store, key, tenant string) (*jobs.Lookup, error) {
	row, err := store.GetOrApproved(ctx, key)
	if err == nil && row.Tenant != tenant {
		err = ledger.ErrNotFound
	}
	switch {
	case errors.Is(err, ledger.ErrNotFound):
		return &jobs.Lookup{Key: key, State: jobs.LookupUnknown}, nil
	case err != nil:
		return nil, err
	case row.State == ledger.Released: // approved, not run yet
		return &jobs.Lookup{Key: key, State: jobs.LookupApproved, Attempt: row.Attempt, FirstToolUseID: row.FirstToolUseID,
			UpdatedAt: row.UpdatedAt, Approval: approvals.Result(row)}, nil
	}
	l := &jobs.Lookup{Key: key, State: string(row.State), Attempt: row.Attempt, FirstToolUseID: row.FirstToolUseID, UpdatedAt: row.UpdatedAt}
	if row.State == ledger.Completed && len(row.Result) > 0 {
		l.Output = json.RawMessage(row.Result)
	}
	if row.Error != nil {
		l.Error = &jobs.ResultError{Code: row.Error.Code, Message: row.Error.Message}
	}
	if row.State == ledger.InFlight {
		l.LeaseRemainingMS = max(row.LeaseRemaining.Milliseconds(), 0)
	}
	l.Approval = approvals.Result(row)
	return l, nil
}

// semver is a build's version as micro wants it: no leading v, and a
// work-tree build 0.0.0-devel.
func semver(v string) string {
	v = strings.TrimPrefix(v, "v")
	if v == "" || v == "devel" {
		return "0.0.0-devel"
	}
	return v
}
