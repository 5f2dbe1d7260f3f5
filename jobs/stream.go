package jobs

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// Streams configures the three streams. Zero fields take the defaults.
type Streams struct {
	Replicas        int           // 1 (embedded) or 3 (a cluster)
	JobsMaxAge      time.Duration // how long jobs stay replayable (default 7 days); the ledger's retention must exceed it
	DuplicateWindow time.Duration // exact re-publications inside it are dropped (default 2 minutes)
	ResultsMaxAge   time.Duration // default 7 days
	DLQMaxAge       time.Duration // default 30 days
	Storage         jetstream.StorageType
}

func (s Streams) withDefaults() Streams {
	if s.Replicas == 0 {
		s.Replicas = 1
	}
	if s.JobsMaxAge == 0 {
		s.JobsMaxAge = 7 * 24 * time.Hour
	}
	if s.DuplicateWindow == 0 {
		s.DuplicateWindow = 2 * time.Minute
	}
	if s.ResultsMaxAge == 0 {
		s.ResultsMaxAge = 7 * 24 * time.Hour
	}
	if s.DLQMaxAge == 0 {
		s.DLQMaxAge = 30 * 24 * time.Hour
	}
	return s
}

// configs returns the configurations of TOOLQ_JOBS, TOOLQ_RESULTS and
// TOOLQ_DLQ. The jobs stream keeps history (limits retention) so that it can
// be replayed.
func (s Streams) configs() []jetstream.StreamConfig {
	s = s.withDefaults()
	return []jetstream.StreamConfig{
		{Name: JobsStream, Subjects: []string{JobsSubjects}, Retention: jetstream.LimitsPolicy, Storage: s.Storage,
			MaxAge: s.JobsMaxAge, Duplicates: s.DuplicateWindow, Replicas: s.Replicas,
			Description: "toolq jobs: one message per completed tool call"},
		{Name: ResultsStream, Subjects: []string{ResultsSubjects}, Retention: jetstream.LimitsPolicy, Storage: s.Storage,
			MaxAge: s.ResultsMaxAge, Duplicates: s.DuplicateWindow, Replicas: s.Replicas,
			Description: "toolq results, by conversation"},
		{Name: DLQStream, Subjects: []string{DLQSubjects}, Retention: jetstream.LimitsPolicy, Storage: s.Storage,
			MaxAge: s.DLQMaxAge, Duplicates: s.DuplicateWindow, Replicas: s.Replicas,
			Description: "toolq dead letters: the original message, its headers and the reason"},
	}
}

// ProvisionStreams creates the streams, or updates them when they exist. An
// existing stream whose configuration toolq cannot work with (another
// retention, subjects that do not cover toolq's) is an error naming the
// stream and the setting; toolq never deletes or recreates a stream.
func ProvisionStreams(ctx context.Context, js jetstream.JetStream, s Streams) error {
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

// Consumer configures the durable pull consumer the workers share.
type Consumer struct {
	Durable       string          // default "toolq"
	FilterSubject string          // default toolq.jobs.>
	AckWait       time.Duration   // default 30s; workers send InProgress while a tool runs
	MaxDeliver    int             // deliveries before a job goes to the DLQ (default 10)
	BackOff       []time.Duration // redelivery delays after an unacknowledged delivery (optional)
	MaxAckPending int             // default 1000
}

func (c Consumer) withDefaults() Consumer {
	if c.Durable == "" {
		c.Durable = "toolq"
	}
	if c.FilterSubject == "" {
		c.FilterSubject = JobsSubjects
	}
	if c.AckWait == 0 {
		c.AckWait = 30 * time.Second
	}
	if c.MaxDeliver == 0 {
		c.MaxDeliver = 10
	}
	if c.MaxAckPending == 0 {
		c.MaxAckPending = 1000
	}
	return c
}

// Config returns the JetStream configuration of the consumer. JetStream's
// own MaxDeliver is unlimited: the worker enforces c.MaxDeliver itself and
// dead-letters the job, so JetStream never gives up on a job silently (not
// even when publishing the dead letter fails: the job is then redelivered).
func (c Consumer) Config() jetstream.ConsumerConfig {
	c = c.withDefaults()
	return jetstream.ConsumerConfig{
		Durable:       c.Durable,
		Description:   "toolq workers",
		FilterSubject: c.FilterSubject,
		AckPolicy:     jetstream.AckExplicitPolicy,
		AckWait:       c.AckWait,
		MaxDeliver:    -1,
		BackOff:       c.BackOff,
		MaxAckPending: c.MaxAckPending,
		DeliverPolicy: jetstream.DeliverAllPolicy,
		ReplayPolicy:  jetstream.ReplayInstantPolicy,
	}
}

// Limit is the number of deliveries after which a job is dead-lettered.
func (c Consumer) Limit() int { return c.withDefaults().MaxDeliver }

// ProvisionConsumer creates or updates the durable consumer.
func ProvisionConsumer(ctx context.Context, js jetstream.JetStream, c Consumer) (jetstream.Consumer, error) {
	cons, err := js.CreateOrUpdateConsumer(ctx, JobsStream, c.Config())
	if err != nil {
		return nil, fmt.Errorf("jobs: consumer %s on %s: %w", c.withDefaults().Durable, JobsStream, err)
	}
	return cons, nil
}
