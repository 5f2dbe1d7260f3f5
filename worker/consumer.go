package worker

import (
	"context"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolq/toolq/jobs"
)

// Consumer configures the durable pull consumer the workers share.
type Consumer struct {
	Durable       string          // default "toolq"
	FilterSubject string          // default toolq.jobs.>
	AckWait       time.Duration   // default 30s; workers send InProgress while a tool runs
	MaxDeliver    int             // counted deliveries before a job goes to the DLQ (default 10)
	BackOff       []time.Duration // redelivery delays after an unacknowledged delivery (optional)
	MaxAckPending int             // default 1000
	// Tenants are the tenants whose jobs the durable takes besides the
	// default tenant's (docs/tenants.md); default: Config.Streams.Tenants.
	// With the default FilterSubject its filters are toolq.jobs.> and each
	// tenant's toolq.<tenant>.jobs.>; another FilterSubject is kept as is.
	Tenants []string
}

func (c Consumer) withDefaults() Consumer {
	if c.Durable == "" {
		c.Durable = "toolq"
	}
	if c.FilterSubject == "" {
		c.FilterSubject = jobs.JobsSubjects
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
	cfg := jetstream.ConsumerConfig{
		Durable:        c.Durable,
		Description:    "toolq workers",
		FilterSubject:  c.FilterSubject,
		FilterSubjects: c.filterSubjects(),
		AckPolicy:      jetstream.AckExplicitPolicy,
		AckWait:        c.AckWait,
		MaxDeliver:     -1,
		BackOff:        c.BackOff,
		MaxAckPending:  c.MaxAckPending,
		DeliverPolicy:  jetstream.DeliverAllPolicy,
		ReplayPolicy:   jetstream.ReplayInstantPolicy,
	}
	if len(cfg.FilterSubjects) > 0 {
		cfg.FilterSubject = ""
	}
	return cfg
}

// filterSubjects are the durable's filters when it takes tenants' jobs
// with the default filter, or nil.
func (c Consumer) filterSubjects() []string {
	if len(c.Tenants) == 0 || c.FilterSubject != jobs.JobsSubjects {
		return nil
	}
	subjects := []string{jobs.JobsSubjects}
	for _, t := range c.Tenants {
		subjects = append(subjects, jobs.TenantJobsPrefix(t)+">")
	}
	return subjects
}

// provision creates or updates the durable consumer.
func (c Consumer) provision(ctx context.Context, js jetstream.JetStream) (jetstream.Consumer, error) {
	cons, err := js.CreateOrUpdateConsumer(ctx, jobs.JobsStream, c.Config())
	if err != nil {
		return nil, fmt.Errorf("worker: consumer %s on %s: %w", c.withDefaults().Durable, jobs.JobsStream, err)
	}
	return cons, nil
}
