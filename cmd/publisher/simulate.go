package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolq/toolq/demo/sandbox"
	"github.com/toolq/toolq/demo/simulate"
	"github.com/toolq/toolq/embedded"
	"github.com/toolq/toolq/internal/cli"
	"github.com/toolq/toolq/jobs"
	"github.com/toolq/toolq/worker"
)

func runSimulate(ctx context.Context, args []string, stdio cli.IO, getenv func(string) string) error {
	fs := cli.NewFlagSet("simulate", "publisher simulate [--turns N] [--failure-rate P] [--after-dispatch Q] [--seed S] [--json]\n\n"+
		"Plays the streaming-agent scenario twice with the same failures: a model streams each turn's\n"+
		"payment call, the call is dispatched as soon as its tool_use block completes, and the stream\n"+
		"may still fail; the agent retries the turn and the model sends the same call with a new\n"+
		"tool_use_id. A naive dispatcher posts every dispatched call to a payments API; toolq runs it\n"+
		"through JetStream and the ledger. Everything runs in-process (NATS, SQLite, two sandbox APIs).\n"+
		"The deployment in docs/design.md measured a failure rate of 0.006 with 0.11 after dispatch; the\n"+
		"defaults are higher so that a short run shows the difference.", stdio)
	var cfg simulate.Config
	fs.IntVar(&cfg.Turns, "turns", 200, "turns, each with one payment call")
	fs.Float64Var(&cfg.FailureRate, "failure-rate", 0.2, "probability that a streamed response fails")
	fs.Float64Var(&cfg.AfterDispatch, "after-dispatch", 0.5, "probability that a failure lands after the call was dispatched")
	fs.Uint64Var(&cfg.Seed, "seed", 1, "random seed: the same seed plays the same failures")
	asJSON := fs.Bool("json", false, "print JSON")
	if err := cli.ParseNone(fs, args); err != nil {
		return err
	}
	if cfg.Turns <= 0 || cfg.Turns > 100000 {
		return fmt.Errorf("--turns %d: want 1 to 100000", cfg.Turns)
	}
	env, err := startSimulation(ctx)
	if err != nil {
		return err
	}
	defer env.close()

	naive, err := simulate.Run(ctx, cfg, "naive", naiveDispatcher{url: env.naiveURL + "/v1/payments"})
	if err != nil {
		return err
	}
	viaToolq, err := simulate.Run(ctx, cfg, "toolq", toolqDispatcher{client: jobs.NewClient(env.JS)})
	if err != nil {
		return err
	}
	// Late dispatches of abandoned attempts may still be running: let toolq settle them.
	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	for !env.settled(wctx) {
		if wctx.Err() != nil {
			return fmt.Errorf("toolq did not settle every job: %w", wctx.Err())
		}
		time.Sleep(50 * time.Millisecond)
	}
	rows := []simRow{
		tally("naive dispatcher", naive, env.naive.Payments()),
		tally("toolq", viaToolq, env.Sandbox.Payments()),
	}
	if *asJSON {
		return cli.PrintJSON(stdio.Out, rows)
	}
	w := cli.NewTable(stdio.Out)
	fmt.Fprintln(w, "DISPATCHER\tTURNS\tSTREAM FAILURES\tAFTER DISPATCH\tDISPATCHES\tPAYMENTS\tTURNS PAID TWICE OR MORE\tEXTRA PAYMENTS")
	for _, r := range rows {
		fmt.Fprintf(w, "%s\t%d\t%d\t%d\t%d\t%d\t%d\t%d\n", r.Dispatcher, r.Turns, r.StreamFailures, r.AfterDispatch, r.Dispatches, r.Payments, r.DuplicatedTurns, r.ExtraPayments)
	}
	return w.Flush()
}

type simRow struct {
	Dispatcher string `json:"dispatcher"`
	simulate.Stats
	Payments        int `json:"payments"`
	DuplicatedTurns int `json:"turns_paid_more_than_once"`
	ExtraPayments   int `json:"extra_payments"`
}

func tally(name string, st simulate.Stats, payments []sandbox.Payment) simRow {
	perInvoice := map[string]int{}
	for _, p := range payments {
		perInvoice[p.InvoiceID]++
	}
	r := simRow{Dispatcher: name, Stats: st, Payments: len(payments)}
	for _, n := range perInvoice {
		if n > 1 {
			r.DuplicatedTurns++
			r.ExtraPayments += n - 1
		}
	}
	return r
}

// naiveDispatcher posts the call straight to the payments API, as a
// dispatcher without memory does.
type naiveDispatcher struct{ url string }

func (n naiveDispatcher) Dispatch(ctx context.Context, c simulate.Call, wait bool) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, n.url, strings.NewReader(string(c.Args)))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return nil
}

// toolqDispatcher publishes the call as a job; for the attempt whose stream
// completed it also waits for the result.
type toolqDispatcher struct{ client *jobs.Client }

func (d toolqDispatcher) Dispatch(ctx context.Context, c simulate.Call, wait bool) error {
	j := &jobs.Job{ConversationID: c.ConversationID, TurnIndex: c.TurnIndex, Tool: c.Tool, ToolUseID: c.ToolUseID, Args: c.Args}
	if !wait {
		_, err := d.client.Publish(ctx, j)
		return err
	}
	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	_, err := d.client.PublishAndAwait(wctx, j)
	return err
}

// simulation is the in-process stack (NATS, a SQLite ledger, a worker and
// toolq's sandbox) and the naive dispatcher's own sandbox.
type simulation struct {
	*embedded.Stack
	naive    *sandbox.Server
	naiveURL string
	cons     jetstream.Consumer
	stop     func(context.Context) error
}

func startSimulation(ctx context.Context) (*simulation, error) {
	st, err := embedded.Start(ctx, embedded.Config{})
	if err != nil {
		return nil, err
	}
	s := &simulation{Stack: st}
	fail := func(err error) (*simulation, error) { s.close(); return nil, err }
	s.naive, _ = sandbox.New(sandbox.Config{})
	if s.naiveURL, s.stop, err = s.naive.Listen("127.0.0.1:0"); err != nil {
		return fail(err)
	}
	if _, err := st.StartWorker(ctx, worker.Config{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}); err != nil {
		return fail(err)
	}
	if s.cons, err = st.JS.Consumer(ctx, jobs.JobsStream, "toolq"); err != nil {
		return fail(err)
	}
	return s, nil
}

// settled reports whether every published job has been acknowledged.
func (s *simulation) settled(ctx context.Context) bool {
	info, err := s.cons.Info(ctx)
	return err == nil && info.NumPending == 0 && info.NumAckPending == 0
}

func (s *simulation) close() {
	s.Stack.Close()
	if s.stop != nil {
		s.stop(context.Background())
	}
}
