package jobs_test

import (
	"context"
	"strings"
	"testing"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolq/toolq/internal/testenv"
	"github.com/toolq/toolq/jobs"
)

func TestProvisionIsIdempotentAndRefusesWorkQueues(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	n := testenv.StartNATS(t)
	js, _ := jetstream.New(n.Connect())
	for range 2 {
		if err := jobs.ProvisionStreams(ctx, js, jobs.Streams{}); err != nil {
			t.Fatal(err)
		}
	}
	s, err := js.Stream(ctx, jobs.JobsStream)
	if err != nil {
		t.Fatal(err)
	}
	if cfg := s.CachedInfo().Config; cfg.Retention != jetstream.LimitsPolicy || cfg.Duplicates == 0 || cfg.Storage != jetstream.FileStorage {
		t.Fatalf("jobs stream %+v", cfg)
	}

	other := testenv.StartNATS(t)
	js2, _ := jetstream.New(other.Connect())
	if _, err := js2.CreateStream(ctx, jetstream.StreamConfig{Name: jobs.JobsStream, Subjects: []string{jobs.JobsSubjects}, Retention: jetstream.WorkQueuePolicy}); err != nil {
		t.Fatal(err)
	}
	err = jobs.ProvisionStreams(ctx, js2, jobs.Streams{})
	if err == nil || !strings.Contains(err.Error(), "WorkQueue") || !strings.Contains(err.Error(), "replay") {
		t.Fatalf("work-queue stream: %v", err)
	}
}
