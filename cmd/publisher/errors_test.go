package main

import (
	"bytes"
	"context"
	"encoding/json"
	"net"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolq/toolq/internal/testenv"
	"github.com/toolq/toolq/jobs"
)

// TestCommandsFailCleanly: every operator command on a missing stream,
// sequence or ledger, or with bad flags, returns one line of error and
// changes nothing: no stream created, no message added or removed, no
// durable consumer left behind.
func TestCommandsFailCleanly(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	bare := testenv.StartNATS(t) // JetStream without toolq's streams
	full := testenv.StartNATS(t)
	js, _ := jetstream.New(full.Connect())
	if err := jobs.ProvisionStreams(ctx, js, jobs.Streams{}); err != nil {
		t.Fatal(err)
	}
	if _, err := jobs.NewClient(js).Publish(ctx, &jobs.Job{ConversationID: "c", Tool: "send_payment", ToolUseID: "toolu_1", Args: json.RawMessage(`{}`)}); err != nil {
		t.Fatal(err)
	}
	bareJS, _ := jetstream.New(bare.Connect())
	snapshot := func() string {
		var b strings.Builder
		for _, name := range []string{jobs.JobsStream, jobs.ResultsStream, jobs.DLQStream} {
			s, err := js.Stream(ctx, name)
			if err != nil {
				t.Fatal(err)
			}
			info, _ := s.Info(ctx)
			b.WriteString(name + ":" + itoa(info.State.Msgs) + ":" + itoa(info.State.LastSeq) + ";")
			for c := range s.ConsumerNames(ctx).Name() {
				if ci, err := s.Consumer(ctx, c); err == nil && ci.CachedInfo().Config.Durable != "" {
					b.WriteString("durable " + c + ";")
				}
			}
		}
		for n := range bareJS.StreamNames(ctx).Name() {
			b.WriteString("bare stream " + n + ";")
		}
		return b.String()
	}
	before := snapshot()
	missingLedger := t.TempDir()
	for _, c := range []struct {
		args []string
		nats string
		want string // in the error
	}{
		{[]string{"status"}, bare.URL, "stream TOOLQ_JOBS does not exist"},
		{[]string{"replay", "--subject", "toolq.jobs.>", "--from-seq", "1"}, bare.URL, "stream"},
		{[]string{"replay", "--subject", "toolq.jobs.>", "--since", "1h", "--dry-run"}, bare.URL, "TOOLQ_JOBS"},
		{[]string{"dlq", "ls"}, bare.URL, "TOOLQ_DLQ"},
		{[]string{"dlq", "show", "1"}, bare.URL, "TOOLQ_DLQ"},
		{[]string{"dlq", "requeue", "1", "--data-dir", missingLedger}, bare.URL, "TOOLQ_DLQ"},
		{[]string{"dlq", "purge", "--yes"}, bare.URL, "TOOLQ_DLQ"},
		{[]string{"dlq", "show", "99"}, full.URL, "no dead letter at sequence 99"},
		{[]string{"dlq", "requeue", "99", "--data-dir", missingLedger}, full.URL, "no dead letter at sequence 99"},
		{[]string{"replay", "--subject", "toolq.jobs.>", "--from-seq", "99"}, full.URL, "from-seq 99 is after the last sequence of TOOLQ_JOBS, 1"},
		{[]string{"replay", "--subject", "toolq.jobs.>", "--from-seq", "1", "--data-dir", missingLedger}, full.URL, "no ledger at"},
		{[]string{"replay", "--subject", "toolq.jobs.>", "--from-seq", "1", "--bogus"}, full.URL, "bogus"},
		{[]string{"replay", "--subject", "toolq.jobs.>", "--from-seq", "x"}, full.URL, "from-seq"},
		{[]string{"replay", "--subject", "toolq.jobs.>", "--from-seq", "3", "--to-seq", "2"}, full.URL, "before from-seq"},
		{[]string{"replay", "--subject", "toolq.jobs.>", "--until", "1h"}, full.URL, "--until needs --since"},
		{[]string{"replay", "--subject", "other", "--since", "1h"}, full.URL, "want one under toolq.jobs."},
		{[]string{"status", "--bogus"}, full.URL, "bogus"},
		{[]string{"status", "extra"}, full.URL, "unexpected argument"},
		{[]string{"dlq", "ls", "1"}, full.URL, "takes no sequence numbers"},
		{[]string{"dlq", "show", "1", "2"}, full.URL, "exactly one SEQ"},
		{[]string{"dlq", "requeue", "0"}, full.URL, "not a sequence number"},
		{[]string{"dlq", "requeue", "1", "--all"}, full.URL, "SEQ… or --all"},
		{[]string{"dlq", "requeue", "1", "--log-format", "xml"}, full.URL, "--log-format"},
		{[]string{"dlq", "purge"}, full.URL, "--yes"},
		{[]string{"dlq"}, full.URL, "dlq: unknown command"},
		{[]string{"frob"}, full.URL, "unknown command"},
	} {
		out, err := runPublisher(t, "", append(c.args, "--nats-url", c.nats)...)
		if err == nil || !strings.Contains(err.Error(), c.want) || strings.Contains(err.Error(), "\n") {
			t.Errorf("%v: %q %v, want one line with %q", c.args, out, err, c.want)
		}
	}
	if after := snapshot(); after != before {
		t.Fatalf("a failed command changed the streams:\nbefore %s\nafter  %s", before, after)
	}
}

func itoa(n uint64) string { return strconv.FormatUint(n, 10) }

// blackHole forwards a NATS connection's handshake (INFO, CONNECT, PING,
// PONG) and then nothing, either way: the server looks alive and never
// answers.
func blackHole(t *testing.T, target string) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	var mu sync.Mutex
	var conns []net.Conn
	t.Cleanup(func() {
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			c.Close()
		}
	})
	pipe := func(dst, src net.Conn, until []byte) {
		buf := make([]byte, 32<<10)
		var seen []byte
		open := true
		for {
			n, err := src.Read(buf)
			if n > 0 && open {
				dst.Write(buf[:n])
				seen = append(seen, buf[:n]...)
				if bytes.Contains(seen, until) {
					open = false
				}
			}
			if err != nil {
				return
			}
		}
	}
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			s, err := net.Dial("tcp", target)
			if err != nil {
				c.Close()
				continue
			}
			mu.Lock()
			conns = append(conns, c, s)
			mu.Unlock()
			go pipe(s, c, []byte("PING\r\n"))
			go pipe(c, s, []byte("PONG\r\n"))
		}
	}()
	return "nats://" + l.Addr().String()
}

// TestOperatorCommandsEndAgainstAServerThatAnswersNothing: every operator
// command against a server that completed the handshake and then answers
// nothing ends, with an error, in bounded time.
func TestOperatorCommandsEndAgainstAServerThatAnswersNothing(t *testing.T) {
	t.Parallel()
	n := testenv.StartNATS(t)
	url := blackHole(t, n.URL[len("nats://"):])
	dir := t.TempDir()
	env := map[string]string{"NATS_URL": url, "TOOLQ_DATA_DIR": dir}
	cmds := [][]string{
		{"status", "--no-ledger"},
		{"dlq", "ls"},
		{"dlq", "show", "1"},
		{"dlq", "requeue", "1"},
		{"dlq", "requeue", "--all"},
		{"dlq", "purge", "--yes"},
		{"replay", "--subject", "toolq.jobs.>", "--from-seq", "1", "--dry-run"},
		{"replay", "--subject", "toolq.jobs.>", "--since", "1h"},
	}
	var wg sync.WaitGroup
	for _, args := range cmds {
		wg.Add(1)
		go func() {
			defer wg.Done()
			done := make(chan error, 1)
			began := time.Now()
			go func() {
				e := env
				if args[0] == "replay" {
					e = map[string]string{"NATS_URL": url}
				}
				_, _, err := runPublisherEnv(t, e, args...)
				done <- err
			}()
			select {
			case err := <-done:
				t.Logf("%v: ended after %v: %v", args, time.Since(began).Round(time.Millisecond), err)
				if err == nil {
					t.Errorf("%v: no error against a black-holed server", args)
				}
			case <-time.After(2 * time.Minute):
				t.Errorf("%v: still running after 2 minutes against a black-holed server", args)
			}
		}()
	}
	wg.Wait()
}
