package approvals

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"regexp"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"

	"github.com/toolq/toolq/internal/version"
	"github.com/toolq/toolq/jobs"
	"github.com/toolq/toolq/ledger"
)

var keyPattern = regexp.MustCompile(`^[0-9a-f]{32}$`)

// Serve answers decisions on toolq.decide.<group>: a NATS micro service
// (toolq-approvals) in one queue group across consumers. The group is the
// subject's last token, and a decision is taken only for a call of that
// group: who may decide is who may publish on the subject, which NATS
// permissions grant per approver group (docs/approvals.md). Replies are a
// jobs.DecisionReply; a refusal also carries a micro error code: 400 (a
// bad request), 403 (another group's call, another digest), 404 (no such
// call), 409 (no longer awaiting: the reply says what stands), 503 (the
// ledger did not answer). Stop the service when done.
func (s *Service) Serve(nc *nats.Conn) (micro.Service, error) {
	svc, err := micro.AddService(nc, micro.Config{
		Name:        "toolq-approvals",
		Version:     semver(version.Get().Version),
		Description: "decisions on toolq calls awaiting a person's approval, on toolq.decide.<group>",
		QueueGroup:  "toolq-approvals",
		Endpoint: &micro.EndpointConfig{Subject: jobs.DecidePrefix + "*", Handler: micro.HandlerFunc(func(req micro.Request) {
			s.serveDecision(req, "", strings.TrimPrefix(req.Subject(), jobs.DecidePrefix))
		})},
	})
	if err != nil || len(s.cfg.Tenants) == 0 {
		return svc, err
	}
	// A tenant's decisions: toolq.<tenant>.decide.<group>.
	err = svc.AddEndpoint("tenant-decide", micro.HandlerFunc(func(req micro.Request) {
		tokens := strings.Split(req.Subject(), ".")
		if len(tokens) != 4 {
			refuse(req, "400", jobs.DecisionReply{Error: &jobs.ResultError{Code: "bad_request", Message: "want toolq.<tenant>.decide.<group>"}})
			return
		}
		s.serveDecision(req, tokens[1], tokens[3])
	}), micro.WithEndpointSubject("toolq.*.decide.*"), micro.WithEndpointQueueGroup("toolq-approvals"))
	if err != nil {
		_ = svc.Stop()
		return nil, err
	}
	return svc, nil
}

// serveDecision answers one decision request on tenant's subject for group.
func (s *Service) serveDecision(req micro.Request, tenant, group string) {
	var d jobs.DecisionRequest
	dec := json.NewDecoder(strings.NewReader(string(req.Data())))
	dec.DisallowUnknownFields()
	err := dec.Decode(&d)
	if err == nil && dec.Decode(new(json.RawMessage)) != io.EOF {
		err = errors.New("data after the request") // two requests are no request
	}
	if err != nil {
		refuse(req, "400", jobs.DecisionReply{Error: &jobs.ResultError{Code: "bad_request", Message: "want a DecisionRequest: " + err.Error()}})
		return
	}
	reply := jobs.DecisionReply{Key: d.Key}
	decision := ledger.Decision{Approve: d.Decision == "approve", By: d.By, Reason: d.Reason, Group: group, Digest: d.Digest}
	switch {
	case !keyPattern.MatchString(d.Key):
		reply.Error = &jobs.ResultError{Code: "bad_request", Message: "key: want 32 lowercase hexadecimal characters"}
	case d.Decision != "approve" && d.Decision != "deny":
		reply.Error = &jobs.ResultError{Code: "bad_request", Message: `decision: want "approve" or "deny"`}
	default:
		if err := decision.Check(); err != nil {
			reply.Error = &jobs.ResultError{Code: "bad_request", Message: err.Error()}
		}
	}
	if reply.Error != nil {
		refuse(req, "400", reply)
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	var row ledger.Row
	err = s.tenantsCall(ctx, d.Key, tenant)
	if err == nil {
		row, err = s.Decide(ctx, d.Key, decision)
	}
	code, errCode := "", ""
	switch {
	case err == nil:
		reply.Status = string(row.ApprovalStatus)
		req.RespondJSON(reply)
		return
	case errors.Is(err, ledger.ErrInvalidDecision):
		code, errCode = "400", "bad_request"
	case errors.Is(err, ledger.ErrNotFound):
		code, errCode = "404", "not_found"
	case errors.Is(err, ledger.ErrNotAwaiting):
		code, errCode = "409", "not_awaiting"
		if st, gerr := s.cfg.Ledger.ApprovalStatusOf(ctx, d.Key); gerr == nil {
			reply.Status = string(st)
		}
	case errors.Is(err, ledger.ErrDecisionRefused):
		code, errCode = "403", "refused"
	case errors.Is(err, ledger.ErrUnavailable):
		code, errCode = "503", "unavailable"
	default:
		code, errCode = "500", "error"
	}
	reply.Error = &jobs.ResultError{Code: errCode, Message: err.Error()}
	refuse(req, code, reply)
}

// tenantsCall returns ledger.ErrNotFound unless key is the key of a call
// of tenant that asked for approval: only its tenant's subject decides a
// call, and a consumer without tenants configured knows the default
// tenant's calls only. An approved call that has not run yet is one (its
// row is released, which GetOrApproved returns): a decision on it is refused
// as no longer awaiting, naming the approval.
func (s *Service) tenantsCall(ctx context.Context, key, tenant string) error {
	row, err := s.cfg.Ledger.GetOrApproved(ctx, key)
	if err != nil {
		return err
	}
	if t, err := s.TenantOf(row); err != nil || t != tenant {
		return fmt.Errorf("%w: no call of this tenant asked for approval under %s", ledger.ErrNotFound, key)
	}
	return nil
}

func refuse(req micro.Request, code string, reply jobs.DecisionReply) {
	body, _ := json.Marshal(reply)
	req.Error(code, reply.Error.Message, body)
}

// semver is a build's version as micro wants it.
func semver(v string) string {
	v = strings.TrimPrefix(v, "v")
	if v == "" || v == "devel" {
		return "0.0.0-devel"
	}
	return v
}
