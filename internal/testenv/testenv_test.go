package testenv_test

import (
	"context"
	"fmt"
	"runtime"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolq/toolq/internal/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

func TestJetStreamSmoke(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	n := testenv.StartNATS(t)
	js, err := jetstream.New(n.Connect())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "SMOKE", Subjects: []string{"smoke.>"}, Storage: jetstream.FileStorage}); err != nil {
		t.Fatal(err)
	}
	if _, err := js.Publish(ctx, "smoke.a", []byte("hello")); err != nil {
		t.Fatal(err)
	}
	// The stream survives a broker restart on the same store.
	n.Restart()
	if _, err := js.Publish(ctx, "smoke.b", []byte("again")); err != nil {
		t.Fatalf("publish after restart: %v", err)
	}
	cons, err := js.CreateOrUpdateConsumer(ctx, "SMOKE", jetstream.ConsumerConfig{Durable: "d", AckPolicy: jetstream.AckExplicitPolicy})
	if err != nil {
		t.Fatal(err)
	}
	batch, err := cons.Fetch(2, jetstream.FetchMaxWait(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for msg := range batch.Messages() {
		got = append(got, string(msg.Data()))
		if err := msg.Ack(); err != nil {
			t.Fatal(err)
		}
	}
	if len(got) != 2 || got[0] != "hello" || got[1] != "again" {
		t.Fatalf("consumed %q", got)
	}
}

func TestPostgresSmoke(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := testenv.Postgres(t)
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, "CREATE TABLE t (v text)"); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, "INSERT INTO t VALUES ($1)", "round trip"); err != nil {
		t.Fatal(err)
	}
	var v string
	if err := conn.QueryRow(ctx, "SELECT v FROM t").Scan(&v); err != nil || v != "round trip" {
		t.Fatalf("got %q, %v", v, err)
	}
	// Each test has its own database.
	other := testenv.Postgres(t)
	if other == url {
		t.Fatal("two tests share a database")
	}
}

func TestEventually(t *testing.T) {
	t.Parallel()
	start := time.Now()
	testenv.Eventually(t, 5*time.Second, "a tenth of a second", func() bool { return time.Since(start) > 100*time.Millisecond })
	ft := &fatalT{TB: t}
	done := make(chan struct{})
	go func() { // Fatalf ends the goroutine, as it ends a test
		defer close(done)
		testenv.Eventually(ft, 50*time.Millisecond, "nothing", func() bool { return false })
	}()
	<-done
	if ft.msg != "timed out after 50ms waiting for nothing" {
		t.Fatalf("message %q", ft.msg)
	}
}

type fatalT struct {
	testing.TB
	msg string
}

func (f *fatalT) Helper() {}

func (f *fatalT) Fatalf(format string, args ...any) {
	f.msg = fmt.Sprintf(format, args...)
	runtime.Goexit()
}
