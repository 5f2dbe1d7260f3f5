package jobs

import (
	"regexp"
	"strings"
)

// A tenant is one of several parties sharing a deployment, kept apart by
// NATS's own permissions (docs/tenants.md). The default tenant, the empty
// string, is a single-tenant deployment: its subjects, streams and keys are
// exactly those toolq had before tenants. A tenant T has its own subjects,
// all under toolq.T. (so that one permission, toolq.T.>, takes in all of
// them), its own results, dead-letter and approvals streams (so that a
// permission on the JetStream API can name them), and keys whose material
// starts with "T|", so that two tenants' identical calls never share a row.
var tenantPattern = idPattern{regexp.MustCompile(`^[A-Za-z0-9_-]{1,64}$`), "_-", 64}

// reservedTenants are the names a tenant may not take: the second tokens of
// the default tenant's subjects, so that toolq.T.> never overlaps them.
var reservedTenants = map[string]bool{
	"jobs": true, "results": true, "dlq": true, "approvals": true, "decide": true, "ledger": true, "tools": true,
}

// ValidTenant reports whether t may name a tenant: the empty string (the
// default tenant), or ^[A-Za-z0-9_-]{1,64}$ and none of jobs, results, dlq,
// approvals, decide, ledger and tools.
func ValidTenant(t string) bool {
	return t == "" || tenantPattern.MatchString(t) && !reservedTenants[t]
}

const tenantRule = "must match ^[A-Za-z0-9_-]{1,64}$ and not be jobs, results, dlq, approvals, decide, ledger or tools"

// TenantError is the *FieldError for an invalid tenant.
func tenantError() error { return &FieldError{Field: "tenant", Rule: tenantRule} }

// CheckTenant returns a *FieldError when t cannot name a tenant.
func CheckTenant(t string) error {
	if !ValidTenant(t) {
		return tenantError()
	}
	return nil
}

func tenantPrefix(t string) string {
	if t == "" {
		return "toolq."
	}
	return "toolq." + t + "."
}

// TenantJobsPrefix is the prefix of tenant t's job subjects: toolq.jobs. for
// the default tenant, toolq.<t>.jobs. for another.
func TenantJobsPrefix(t string) string { return tenantPrefix(t) + "jobs." }

// TenantJobSubject is the subject a job of tenant t for tool is published on.
func TenantJobSubject(t, tool string) string { return TenantJobsPrefix(t) + tool }

// TenantResultSubject is the subject tenant t's results of a conversation
// are published on.
func TenantResultSubject(t, conversationID string) string {
	return tenantPrefix(t) + "results." + conversationID
}

// TenantDLQSubject is the subject tenant t's dead letters with reason go to.
func TenantDLQSubject(t, reason string) string { return tenantPrefix(t) + "dlq." + reason }

// TenantApprovalSubject is the subject tenant t's approval events of a
// conversation are published on.
func TenantApprovalSubject(t, conversationID string) string {
	return tenantPrefix(t) + "approvals." + conversationID
}

// TenantDecideSubject is the subject decisions on tenant t's calls for an
// approver group are requested on.
func TenantDecideSubject(t, group string) string { return tenantPrefix(t) + "decide." + group }

// TenantLookupSubject is the subject of tenant t's ledger lookups.
func TenantLookupSubject(t string) string { return tenantPrefix(t) + "ledger.get" }

// TenantStream is the name of tenant t's stream of the given kind
// (ResultsStream, DLQStream or ApprovalsStream): the default tenant's is
// that stream; tenant t's is TOOLQ_<t>_RESULTS, TOOLQ_<t>_DLQ,
// TOOLQ_<t>_APPROVALS. Tenants share TOOLQ_JOBS, which only the consumer
// reads.
func TenantStream(t, stream string) string {
	if t == "" || stream == JobsStream {
		return stream
	}
	return "TOOLQ_" + t + "_" + stream[len("TOOLQ_"):]
}

// SubjectTenant returns the tenant whose job subjects a subject is under,
// and true: "" for toolq.jobs.>, t for toolq.<t>.jobs.>, whatever the
// number of tokens after jobs. (a subject there that is not
// toolq.<t>.jobs.<tool> is still t's: its permissions let t publish it);
// false for a subject under neither.
func SubjectTenant(subject string) (string, bool) {
	rest, ok := strings.CutPrefix(subject, "toolq.")
	if !ok {
		return "", false
	}
	if tool, ok := strings.CutPrefix(rest, "jobs."); ok {
		return "", tool != ""
	}
	t, tool, ok := strings.Cut(rest, ".")
	if !ok || t == "" || !ValidTenant(t) {
		return "", false
	}
	tool, ok = strings.CutPrefix(tool, "jobs.")
	return t, ok && tool != ""
}
