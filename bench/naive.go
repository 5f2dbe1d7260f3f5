package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"expvar"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/toolq/toolq/internal/pull"
	"github.com/toolq/toolq/jobs"
)

// NaiveConfig is the naive dispatcher's: the system a user has without
// toolq, a dispatcher with no memory. It takes the same settings as the
// consumer it is compared with: Workers jobs in flight (the consumer's
// --workers and --max-ack-pending), Concurrency tool calls at once (the
// tool's concurrency). With LedgerURL it is the plain ledger dispatcher.
type NaiveConfig struct {
	NATSURL     string
	ToolURL     string // the sandbox payments API: POST ToolURL
	Tool        string // it takes toolq.jobs.<Tool>
	Durable     string
	Workers     int
	Concurrency int
	// DebugAddr, when set, serves Go's profiles (/debug/pprof/) and memory
	// statistics (/debug/vars) of the process RunNaive runs in, as the
	// consumer's --debug-pprof does.
	DebugAddr string
	// LedgerURL, when set, makes it the plain ledger dispatcher: the
	// naive dispatcher keeping a row per call in this Postgres database
	// (plainLedger).
	LedgerURL string
}

// Flags defines on fs the flags of the naive dispatcher's process (the
// ones startNaiveProc passes), each setting c.
func (c *NaiveConfig) Flags(fs *flag.FlagSet) {
	fs.StringVar(&c.NATSURL, "nats-url", "", "")
	fs.StringVar(&c.ToolURL, "tool-url", "", "")
	fs.StringVar(&c.Tool, "tool", "", "")
	fs.StringVar(&c.Durable, "durable", "", "")
	fs.IntVar(&c.Workers, "workers", 256, "")
	fs.IntVar(&c.Concurrency, "concurrency", 64, "")
	fs.StringVar(&c.DebugAddr, "debug-addr", "", "")
	fs.StringVar(&c.LedgerURL, "ledger-url", "", "")
}

// naive is a running naive dispatcher.
type naive struct {
	cfg    NaiveConfig
	js     jetstream.JetStream
	client *http.Client
	slots  chan struct{} // tool calls at once
	it     *pull.Iter
	wg     sync.WaitGroup
	log    *slog.Logger
	ledger *pgxpool.Pool // the plain ledger's (nil: none)
}

// startNaive starts the dispatcher on js: pull, POST the sandbox, publish
// the result, wait for its PubAck, ack. It returns once it is pulling.
func startNaive(ctx context.Context, js jetstream.JetStream, client *http.Client, cfg NaiveConfig, log *slog.Logger) (*naive, error) {
	cons, err := js.CreateOrUpdateConsumer(ctx, jobs.JobsStream, jetstream.ConsumerConfig{Durable: cfg.Durable,
		FilterSubject: jobs.JobSubject(cfg.Tool), AckPolicy: jetstream.AckExplicitPolicy, MaxAckPending: cfg.Workers})
	if err != nil {
		return nil, err
	}
	iter, err := cons.Messages(jetstream.PullMaxMessages(32), jetstream.PullExpiry(5*time.Second)) // as toolq pulls
	if err != nil {
		return nil, err
	}
	n := &naive{cfg: cfg, js: js, client: client, slots: make(chan struct{}, cfg.Concurrency), it: pull.New(iter, js.Conn()), log: log}
	if cfg.LedgerURL != "" {
		if n.ledger, err = openPlainLedger(ctx, cfg.LedgerURL, cfg.Workers); err != nil {
			iter.Stop()
			return nil, err
		}
	}
	workers := make(chan struct{}, cfg.Workers)
	n.wg.Add(1)
	go func() {
		defer n.wg.Done()
		for {
			msg, err := n.it.Next()
			if errors.Is(err, jetstream.ErrMsgIteratorClosed) {
				return // stopped
			}
			if err != nil { // a missed heartbeat, say: the pull goes on
				log.Warn("naive dispatcher: pull", "error", err)
				continue
			}
			workers <- struct{}{}
			n.wg.Add(1)
			go func() {
				defer func() { <-workers; n.wg.Done() }()
				n.one(ctx, msg)
			}()
		}
	}()
	return n, nil
}

// stop stops pulling and waits for the jobs in hand.
func (n *naive) stop() {
	n.it.Stop()
	n.wg.Wait()
	if n.ledger != nil {
		n.ledger.Close()
	}
}

func (n *naive) one(ctx context.Context, msg jetstream.Msg) {
	j, material, err := jobs.DecodeJobMaterial(msg.Data())
	if err != nil {
		msg.Term()
		return
	}
	var body []byte
	var key string
	answered := false // from the plain ledger's row
	if n.ledger != nil {
		key = material.Key()
		claimed, stored, err := plainClaim(ctx, n.ledger, key)
		switch {
		case err != nil:
			n.log.Warn("plain ledger dispatcher: claim", "error", err)
			msg.Nak()
			return
		case !claimed && stored == nil: // another delivery has the call in flight
			msg.NakWithDelay(time.Second)
			return
		case !claimed: // a duplicate: answered from its row
			body, answered = stored, true
		}
	}
	if !answered {
		n.slots <- struct{}{}
		body, err = n.call(ctx, j.Args)
		<-n.slots
		if err != nil {
			if n.ledger != nil { // let the job's next delivery claim the call again
				n.ledger.Exec(ctx, plainReleaseStatement, key)
			}
			msg.Nak()
			return
		}
		if n.ledger != nil {
			if _, err := n.ledger.Exec(ctx, plainCompleteStatement, key, string(body)); err != nil {
				n.log.Warn("plain ledger dispatcher: complete", "error", err)
				msg.Nak()
				return
			}
		}
	}
	r := jobs.NewResult(j, "", jobs.StatusOK)
	r.Output = body
	out, _ := json.Marshal(r)
	if _, err := n.js.Publish(ctx, jobs.ResultSubject(j.ConversationID), out); err != nil {
		msg.Nak()
		return
	}
	msg.Ack()
}

func (n *naive) call(ctx context.Context, args []byte) ([]byte, error) {
	req, err := http.NewRequestWithContext(ctx, "POST", n.cfg.ToolURL, bytes.NewReader(args))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := n.client.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	return io.ReadAll(resp.Body)
}

// The plain ledger dispatcher is the naive dispatcher keeping a row per
// call, keyed as toolq keys it, in a Postgres table of its own: the
// plainest design that records its calls, one statement a call and no
// more. Before its call a job claims the key (an insert that commits
// without waiting for the disk, as toolq's claim of a keyed write does);
// after it, it completes the row with the call's answer (an update that
// waits for the disk, as toolq's completion does); a job whose key is
// completed is answered from its row, with no call. It has none of toolq's
// leases, fences or uncertain outcomes (a call that failed is released and
// runs again; one in flight when its dispatcher dies stays claimed, and its
// job is retried forever): it measures what the same two writes cost made
// one statement a call.
const (
	plainTableStatement = `CREATE TABLE IF NOT EXISTS bench_plain_ledger (key text PRIMARY KEY, result text)`
	// plainClaimStatement inserts the key's row, unless there is one, and
	// says whether it did, and the result of the row that was there (its
	// snapshot is before the insert: null for a row it inserted).
	plainClaimStatement = `WITH claimed AS (INSERT INTO bench_plain_ledger (key) VALUES ($1) ON CONFLICT (key) DO NOTHING RETURNING key)
		SELECT EXISTS (SELECT 1 FROM claimed), (SELECT result FROM bench_plain_ledger WHERE key = $1)`
	plainCompleteStatement = `UPDATE bench_plain_ledger SET result = $2 WHERE key = $1`
	plainReleaseStatement  = `DELETE FROM bench_plain_ledger WHERE key = $1 AND result IS NULL`
	plainAsyncCommit       = `SELECT set_config('synchronous_commit', 'off', true)`
)

// openPlainLedger opens the plain ledger dispatcher's pool, a connection
// for each job in flight, and makes its table.
func openPlainLedger(ctx context.Context, url string, conns int) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, fmt.Errorf("plain ledger dispatcher: %w", err)
	}
	cfg.MaxConns = int32(conns)
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("plain ledger dispatcher: %w", err)
	}
	if _, err := pool.Exec(ctx, plainTableStatement); err != nil {
		pool.Close()
		return nil, fmt.Errorf("plain ledger dispatcher: %w", err)
	}
	return pool, nil
}

// plainClaim claims key in one round trip: claimed, or the result of its
// completed row (nil: another delivery has it in flight).
func plainClaim(ctx context.Context, pool *pgxpool.Pool, key string) (claimed bool, stored []byte, err error) {
	var batch pgx.Batch
	batch.Queue(plainAsyncCommit)
	batch.Queue(plainClaimStatement, key).QueryRow(func(row pgx.Row) error { return row.Scan(&claimed, &stored) })
	return claimed, stored, pool.SendBatch(ctx, &batch).Close()
}

// RunNaive runs the naive dispatcher in this process until ctx ends: the
// bench's naive dispatcher as a process of its own, as a user runs one. It
// writes "ready" to ready once it is pulling.
func RunNaive(ctx context.Context, cfg NaiveConfig, ready io.Writer) error {
	nc, err := nats.Connect(cfg.NATSURL)
	if err != nil {
		return fmt.Errorf("naive dispatcher: nats: %w", err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	n, err := startNaive(ctx, js, toolClient(cfg.Concurrency), cfg, slog.Default())
	if err != nil {
		return err
	}
	if cfg.DebugAddr != "" { // Go's profiles, as the consumer's --debug-pprof serves them
		ln, err := net.Listen("tcp", cfg.DebugAddr)
		if err != nil {
			return err
		}
		mux := http.NewServeMux()
		mux.HandleFunc("/debug/pprof/", pprof.Index)
		mux.Handle("/debug/vars", expvar.Handler())
		srv := &http.Server{Handler: mux}
		go srv.Serve(ln)
		defer srv.Close()
	}
	fmt.Fprintln(ready, "ready")
	<-ctx.Done()
	n.stop()
	return nil
}

// toolClient is the HTTP client of the tool calls: as many idle
// connections to the sandbox as calls at once, for toolq and the naive
// dispatcher alike.
func toolClient(concurrency int) *http.Client {
	transport := http.DefaultTransport.(*http.Transport).Clone()
	transport.MaxIdleConnsPerHost = concurrency
	return &http.Client{Transport: transport}
}
