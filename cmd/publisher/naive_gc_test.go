package main

import (
	"bufio"
	"context"
	"io"
	"runtime/debug"
	"runtime/metrics"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolq/toolq/internal/cli"
	"github.com/toolq/toolq/internal/testenv"
	"github.com/toolq/toolq/jobs"
)

// TestNaiveDispatcherRunsAtTheConsumersGCTarget: `publisher bench`
// compares the consumer with the naive dispatcher with the same settings;
// with no GOGC in the environment the consumer runs at the service GC
// target, and so must the naive dispatcher's process (`publisher
// __bench-naive`, run here as the bench runs it), or its figures carry a
// collector that runs four times as often.
func TestNaiveDispatcherRunsAtTheConsumersGCTarget(t *testing.T) {
	defer debug.SetGCPercent(debug.SetGCPercent(100))
	srv := testenv.StartNATS(t)
	nc, err := nats.Connect(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := jobs.ProvisionStreams(ctx, js, jobs.Streams{}); err != nil {
		t.Fatal(err)
	}
	pr, pw := io.Pipe()
	done := make(chan error, 1)
	runCtx, stop := context.WithCancel(ctx)
	go func() {
		done <- run(runCtx, []string{naiveCommand, "--nats-url", srv.URL, "--tool-url", "http://127.0.0.1:1/v1/payments",
			"--tool", "pay", "--durable", "gc-naive", "--workers", "32", "--concurrency", "8"},
			cli.IO{In: strings.NewReader(""), Out: pw, Err: io.Discard}, func(string) string { return "" })
		pw.Close()
	}()
	line, err := bufio.NewReader(pr).ReadString('\n')
	if strings.TrimSpace(line) != "ready" {
		t.Fatalf("naive dispatcher: %q %v", line, err)
	}
	s := []metrics.Sample{{Name: "/gc/gogc:percent"}}
	metrics.Read(s)
	stop()
	go io.Copy(io.Discard, pr)
	<-done
	if got := s[0].Value.Uint64(); got != cli.ServiceGCPercent {
		t.Fatalf("the naive dispatcher process runs at GOGC %d, the consumer it is compared with at %d", got, cli.ServiceGCPercent)
	}
}
