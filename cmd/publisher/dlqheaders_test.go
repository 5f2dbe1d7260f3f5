package main

import (
	"context"
	"strings"
	"testing"

	"github.com/nats-io/nats.go"

	"github.com/toolq/toolq/jobs"
)

// TestShowOfOmittedHeaders: dlq show names the original headers a dead
// letter could not carry, and says the original has them.
func TestShowOfOmittedHeaders(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	n, js := withStreams(t)
	dl := nats.NewMsg(jobs.DLQSubject(jobs.DLQInvalid))
	dl.Data = []byte(`not a job`)
	dl.Header.Set(jobs.HeaderDLQReason, jobs.DLQInvalid)
	dl.Header.Set(jobs.HeaderDLQSubject, "toolq.jobs.send_payment")
	dl.Header.Set(jobs.HeaderDLQStreamSeq, "7")
	dl.Header.Set(jobs.HeaderDLQHeadersOmitted, "X-Big, X-Other")
	if _, err := js.PublishMsg(ctx, dl); err != nil {
		t.Fatal(err)
	}
	out, err := runPublisher(t, "", "dlq", "show", "1", "--nats-url", n.URL)
	if err != nil || !strings.Contains(out, "headers omitted:") || !strings.Contains(out, "X-Big, X-Other (kept by the original, job 7 in TOOLQ_JOBS, until it ages out)") {
		t.Fatalf("dlq show: %q %v", out, err)
	}
}
