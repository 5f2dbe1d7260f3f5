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

	"github.com/toolq/toolq/internal/pull"
	"github.com/toolq/toolq/jobs"
)

// NaiveConfig is the naive dispatcher's: the system a user has without
// toolq, a dispatcher with no memory. It takes the same settings as the
// consumer it is compared with: Workers jobs in flight (the consumer's
// --workers and --max-ack-pending), Concurrency tool calls at once (the
// tool's concurrency).
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
func (n *naive) stop() { n.it.Stop(); n.wg.Wait() }

func (n *naive) one(ctx context.Context, msg jetstream.Msg) {
	j, err := jobs.DecodeJob(msg.Data())
	if err != nil {
		msg.Term()
		return
	}
	n.slots <- struct{}{}
	body, err := n.call(ctx, j.Args)
	<-n.slots
	if err != nil {
		msg.Nak()
		return
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
