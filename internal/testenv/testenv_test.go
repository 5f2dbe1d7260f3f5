package testenv_test

import (
	"context"
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
