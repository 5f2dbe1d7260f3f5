package operate

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolq/toolq/jobs"
)

// Comeback is one way a job whose call the ledger settled can reach the
// consumer again, and for how long: the ledger must keep the rows of
// finished calls longer than the longest, or such a job runs its call again.
type Comeback struct {
	Stream  string        `json:"stream,omitempty"` // TOOLQ_JOBS or TOOLQ_DLQ; empty for a horizon an operator stated
	Setting string        `json:"setting"`          // "max age", "duplicate window", or how the horizon was stated
	Age     time.Duration `json:"age"`              // 0: forever (a stream without a max age)
	Risk    string        `json:"risk"`             // what would run its call again
}

// String names the setting and its value: "TOOLQ_DLQ's max age 30d".
func (c Comeback) String() string {
	v := age(c.Age)
	if c.Age == 0 {
		v = "(none: it keeps messages until they are deleted)"
	}
	if c.Stream == "" {
		return c.Setting + " " + v
	}
	return c.Stream + "'s " + c.Setting + " " + v
}

const (
	riskReplay    = "a replay of an older job would run its call again"
	riskRequeue   = "a dead letter requeued after the purge would run its call again"
	riskDuplicate = "a job published again that the stream no longer drops would run its call again"
)

// Comebacks reads them from the live streams: the max age of TOOLQ_JOBS (a
// replay), that of TOOLQ_DLQ (a requeue) and the duplicate window of
// TOOLQ_JOBS (a re-publication). A stream that does not exist is an error
// that wraps jetstream.ErrStreamNotFound; others are JetStream's, wrapped.
func Comebacks(ctx context.Context, js jetstream.JetStream) ([]Comeback, error) {
	var out []Comeback
	for _, name := range []string{jobs.JobsStream, jobs.DLQStream} {
		s, err := streamOf(ctx, js, name)
		if err != nil {
			return nil, fmt.Errorf("operate: stream %s: %w", name, err)
		}
		cfg := s.CachedInfo().Config
		if name == jobs.JobsStream {
			out = append(out, Comeback{Stream: name, Setting: "max age", Age: cfg.MaxAge, Risk: riskReplay})
			if cfg.Duplicates > 0 {
				out = append(out, Comeback{Stream: name, Setting: "duplicate window", Age: cfg.Duplicates, Risk: riskDuplicate})
			}
			continue
		}
		out = append(out, Comeback{Stream: name, Setting: "max age", Age: cfg.MaxAge, Risk: riskRequeue})
	}
	return out, nil
}

// DefaultComebacks are those of streams provisioned with the defaults of
// jobs.Streams.
func DefaultComebacks() []Comeback {
	return []Comeback{
		{Stream: jobs.JobsStream, Setting: "default max age", Age: jobs.DefaultJobsMaxAge, Risk: riskReplay},
		{Stream: jobs.JobsStream, Setting: "default duplicate window", Age: jobs.DefaultDuplicateWindow, Risk: riskDuplicate},
		{Stream: jobs.DLQStream, Setting: "default max age", Age: jobs.DefaultDLQMaxAge, Risk: riskRequeue},
	}
}

// RetentionError is CheckRetention's refusal: Retention does not outlive
// Comeback.
type RetentionError struct {
	Retention time.Duration
	Comeback  Comeback
}

func (e *RetentionError) Error() string {
	return fmt.Sprintf("operate: a retention of %s is not longer than %s: %s", age(e.Retention), e.Comeback, e.Comeback.Risk)
}

// CheckRetention returns nil when a ledger that keeps the rows of finished
// calls for retention outlives every comeback in cs, or else a
// *RetentionError with the longest one it does not outlive.
func CheckRetention(retention time.Duration, cs []Comeback) error {
	var worst *Comeback
	for i, c := range cs {
		if c.Age != 0 && retention > c.Age {
			continue
		}
		if worst == nil || worst.Age != 0 && (c.Age == 0 || c.Age > worst.Age) {
			worst = &cs[i]
		}
	}
	if worst == nil {
		return nil
	}
	return &RetentionError{Retention: retention, Comeback: *worst}
}

// ErrRowMayBePurged is Requeue's refusal of a dead letter older than what
// the ledger may have purged (see PurgedBefore): if its call completed, the
// row that says so may be gone, and requeued it would run again.
var ErrRowMayBePurged = errors.New("operate: the ledger may have purged the row of this call")

// RequeueOption is a knob of one Requeue call.
type RequeueOption func(*requeueOptions)

type requeueOptions struct {
	purgedBefore time.Time
}

// PurgedBefore makes Requeue refuse, with ErrRowMayBePurged, a dead letter
// dead-lettered before t. Give it the ledger's ledger.PurgeRecord.PurgedBefore:
// a call dead-lettered before it and completed later (by a retried turn) may
// have lost its row to a purge, and only that row keeps it from running
// twice. The zero time refuses nothing.
func PurgedBefore(t time.Time) RequeueOption {
	return func(o *requeueOptions) { o.purgedBefore = t }
}

// age writes d the way the command line reads it: 30d, 36h, 1d12h, 90s.
func age(d time.Duration) string {
	const day = 24 * time.Hour
	days, rest := d/day, d%day
	var b strings.Builder
	if days > 0 {
		fmt.Fprintf(&b, "%dd", days)
	}
	if rest > 0 || days == 0 {
		r := rest.String()
		if strings.HasSuffix(r, "m0s") {
			r = r[:len(r)-2]
		}
		if strings.HasSuffix(r, "h0m") {
			r = r[:len(r)-2]
		}
		b.WriteString(r)
	}
	return b.String()
}
