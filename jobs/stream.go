package jobs

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// The defaults of Streams.
const (
	DefaultJobsMaxAge      = 7 * 24 * time.Hour
	DefaultDuplicateWindow = 2 * time.Minute
	DefaultResultsMaxAge   = 7 * 24 * time.Hour
	DefaultDLQMaxAge       = 30 * 24 * time.Hour
)

// Streams configures the four streams. Zero fields take the defaults.
type Streams struct {
	Replicas        int           // 1 (embedded) or 3 (a cluster)
	JobsMaxAge      time.Duration // how long jobs stay replayable (default 7 days); the ledger's retention must exceed it and DLQMaxAge
	DuplicateWindow time.Duration // exact re-publications inside it are dropped (default 2 minutes)
	ResultsMaxAge   time.Duration // default 7 days
	DLQMaxAge       time.Duration // how long dead letters stay requeueable (default 30 days)
	ApprovalsMaxAge time.Duration // how long approval events stay, to rebuild an inbox from (default 31 days)
	Storage         jetstream.StorageType
	// Tenants are the tenants besides the default one (docs/tenants.md):
	// TOOLQ_JOBS takes their jobs too (toolq.<t>.jobs.>), and each has its
	// own results, dead-letter and approvals streams (TenantStream).
	Tenants []string
}

func (s Streams) withDefaults() Streams {
	if s.Replicas == 0 {
		s.Replicas = 1
	}
	if s.JobsMaxAge == 0 {
		s.JobsMaxAge = DefaultJobsMaxAge
	}
	if s.DuplicateWindow == 0 {
		s.DuplicateWindow = DefaultDuplicateWindow
	}
	if s.ResultsMaxAge == 0 {
		s.ResultsMaxAge = DefaultResultsMaxAge
	}
	if s.DLQMaxAge == 0 {
		s.DLQMaxAge = DefaultDLQMaxAge
	}
	if s.ApprovalsMaxAge == 0 {
		s.ApprovalsMaxAge = DefaultApprovalsMaxAge
	}
	return s
}

// configs returns the configurations of TOOLQ_JOBS, TOOLQ_RESULTS,
// TOOLQ_DLQ and TOOLQ_APPROVALS. The jobs stream keeps history (limits retention) so that it can
// be replayed.
func (s Streams) configs() []jetstream.StreamConfig {
	s = s.withDefaults()
	jobsSubjects := []string{JobsSubjects}
	for _, t := range s.Tenants {
		jobsSubjects = append(jobsSubjects, TenantJobsPrefix(t)+">")
	}
	configs := []jetstream.StreamConfig{
		{Name: JobsStream, Subjects: jobsSubjects, Retention: jetstream.LimitsPolicy, Storage: s.Storage,
			MaxAge: s.JobsMaxAge, Duplicates: s.DuplicateWindow, Replicas: s.Replicas,
			Description: "toolq jobs: one message per completed tool call"},
		{Name: ResultsStream, Subjects: []string{ResultsSubjects}, Retention: jetstream.LimitsPolicy, Storage: s.Storage,
			MaxAge: s.ResultsMaxAge, Duplicates: s.DuplicateWindow, Replicas: s.Replicas,
			Description: "toolq results, by conversation"},
		{Name: DLQStream, Subjects: []string{DLQSubjects}, Retention: jetstream.LimitsPolicy, Storage: s.Storage,
			MaxAge: s.DLQMaxAge, Duplicates: s.DuplicateWindow, Replicas: s.Replicas,
			Description: "toolq dead letters: the original message, its headers and the reason"},
		{Name: ApprovalsStream, Subjects: []string{ApprovalsSubjects}, Retention: jetstream.LimitsPolicy, Storage: s.Storage,
			MaxAge: s.ApprovalsMaxAge, Duplicates: s.DuplicateWindow, Replicas: s.Replicas,
			Description: "toolq approvals: calls that asked for a person's approval, and the decisions, by conversation"},
	}
	for _, t := range s.Tenants {
		for _, c := range configs[1:4] {
			c.Description = "tenant " + t + ": " + c.Description
			c.Subjects = []string{tenantPrefix(t) + c.Subjects[0][len("toolq."):]}
			c.Name = TenantStream(t, c.Name)
			configs = append(configs, c)
		}
	}
	return configs
}

// ProvisionStreams creates the streams, or updates them when they exist. An
// existing stream whose configuration toolq cannot work with (another
// retention, subjects that do not cover toolq's) is an error naming the
// stream and the setting; toolq never deletes or recreates a stream.
//
// The tenants' job subjects are added to an existing TOOLQ_JOBS.
func ProvisionStreams(ctx context.Context, js jetstream.JetStream, s Streams) error {
	for _, t := range s.Tenants {
		if t == "" || !ValidTenant(t) {
			return fmt.Errorf("jobs: tenant %q: %s", t, tenantRule)
		}
	}
	for _, want := range s.configs() {
		stream, err := js.Stream(ctx, want.Name)
		switch {
		case errors.Is(err, jetstream.ErrStreamNotFound):
			if _, err := js.CreateStream(ctx, want); err != nil {
				return fmt.Errorf("jobs: create stream %s: %w", want.Name, err)
			}
			continue
		case err != nil:
			return fmt.Errorf("jobs: stream %s: %w", want.Name, err)
		}
		have := stream.CachedInfo().Config
		if have.Retention != want.Retention {
			return fmt.Errorf("jobs: stream %s exists with %s retention; toolq needs limits retention so that history can be replayed (migrate it by hand: toolq will not delete a stream)", want.Name, have.Retention)
		}
		if !covers(have.Subjects, want.Subjects[0]) {
			return fmt.Errorf("jobs: stream %s exists with subjects %v, which do not include %s", want.Name, have.Subjects, want.Subjects[0])
		}
		update := have
		update.MaxAge, update.Duplicates, update.Description = want.MaxAge, want.Duplicates, want.Description
		for _, subj := range want.Subjects[1:] {
			if !covers(update.Subjects, subj) {
				update.Subjects = append(update.Subjects[:len(update.Subjects):len(update.Subjects)], subj)
			}
		}
		if _, err := js.UpdateStream(ctx, update); err != nil {
			return fmt.Errorf("jobs: update stream %s: %w", want.Name, err)
		}
	}
	return nil
}

func covers(subjects []string, want string) bool {
	for _, s := range subjects {
		if s == want || s == ">" {
			return true
		}
	}
	return false
}
