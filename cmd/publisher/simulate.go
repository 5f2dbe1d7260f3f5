package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolq/toolq/demo/sandbox"
	"github.com/toolq/toolq/demo/simulate"
	"github.com/toolq/toolq/embedded"
	"github.com/toolq/toolq/internal/cli"
	"github.com/toolq/toolq/jobs"
	"github.com/toolq/toolq/worker"
)

// The deployment in docs/design.md: 0.6% of streamed responses fail, 11% of
// those after a tool_use block was dispatched.
const (
	chapterFailureRate   = 0.006
	chapterAfterDispatch = 0.11
)

func runSimulate(ctx context.Context, args []string, stdio cli.IO, getenv func(string) string) error {
	fs := cli.NewFlagSet("simulate", "publisher simulate [--turns N] [--failure-rate P] [--after-dispatch Q] [--resend-rate R] [--seed S] [--json]\n"+
		"publisher simulate --tool-latency D --provider-gap D --turns-per-month N [--failure-rate P] [--after-dispatch Q]\n\n"+
		"Plays the streaming-agent scenario twice with the same failures: a model streams each turn's\n"+
		"payment call, the call is dispatched as soon as its tool_use block completes, and the stream\n"+
		"may still fail. A failure before the dispatch abandons the call (not run); one after it makes\n"+
		"the agent retry the turn once, and the model sends the same call with a new tool_use_id; a\n"+
		"user may press send again after a failed turn. A naive dispatcher posts every dispatched call\n"+
		"to a payments API; toolq runs it through JetStream, the ledger, a worker and the sandbox,\n"+
		"and keeps each conversation's record through jobs.Conversation, checked at the end.\n"+
		"Everything runs in-process unless --nats-url or --database-url is given. The rates default to\n"+
		"the deployment of docs/design.md.\n\n"+
		"With --tool-latency, --provider-gap or --turns-per-month it prints the arithmetic instead:\n"+
		"the exposure window of a turn and the duplicates a month brings without toolq.", stdio)
	var cfg simulate.Config
	var nf cli.NATSFlags
	nf.Register(fs, getenv, "", "NATS server URL; empty: an embedded server (serve it with no other consumer: the simulation runs its own worker)")
	databaseURL := fs.String("database-url", "", "Postgres ledger; empty: SQLite in a temporary directory")
	fs.IntVar(&cfg.Turns, "turns", 2000, "turns, each with one payment call")
	fs.Float64Var(&cfg.FailureRate, "failure-rate", chapterFailureRate, "probability that a streamed response fails")
	fs.Float64Var(&cfg.AfterDispatch, "after-dispatch", chapterAfterDispatch, "probability that a failure lands after the call was dispatched")
	fs.Float64Var(&cfg.ResendRate, "resend-rate", 0, "probability that the user presses send again after a failed turn")
	fs.Uint64Var(&cfg.Seed, "seed", 1, "random seed: the same seed plays the same failures")
	fs.IntVar(&cfg.Concurrency, "concurrency", 32, "conversations played at once")
	toolLatency := fs.Duration("tool-latency", 0, "arithmetic: how long the tool call takes")
	providerGap := fs.Duration("provider-gap", 0, "arithmetic: from the tool result to the provider's next response")
	turnsPerMonth := fs.Int("turns-per-month", 0, "arithmetic: turns with a side-effecting call in a month")
	asJSON := fs.Bool("json", false, "print one JSON object as the last line")
	if err := cli.ParseNone(fs, args); err != nil {
		return err
	}
	arithmetic := false
	fs.Visit(func(f *flag.Flag) {
		arithmetic = arithmetic || f.Name == "tool-latency" || f.Name == "provider-gap" || f.Name == "turns-per-month"
	})
	for _, p := range []struct {
		name string
		v    float64
	}{{"failure-rate", cfg.FailureRate}, {"after-dispatch", cfg.AfterDispatch}, {"resend-rate", cfg.ResendRate}} {
		if p.v < 0 || p.v > 1 {
			return cli.Usagef("--%s %v: want a probability from 0 to 1", p.name, p.v)
		}
	}
	if arithmetic {
		return printArithmetic(stdio.Out, *asJSON, *toolLatency, *providerGap, *turnsPerMonth, cfg)
	}
	if cfg.Turns <= 0 || cfg.Turns > 1_000_000 {
		return cli.Usagef("--turns %d: want 1 to 1000000", cfg.Turns)
	}
	natsOpts, err := nf.Options("toolq simulate")
	if err != nil {
		return err
	}
	env, err := startSimulation(ctx, embedded.Config{NATSURL: nf.URL, NATSOptions: natsOpts, DatabaseURL: *databaseURL})
	if err != nil {
		return err
	}
	defer env.close()
	// Runs against shared services must not meet: every id starts with the run's.
	cfg.Prefix = "sim" + strconv.FormatInt(time.Now().UnixNano()%1e12, 36)

	naiveCfg := cfg
	naive, err := simulate.Run(ctx, naiveCfg, naiveSide{url: env.naiveURL + "/v1/payments"})
	if err != nil {
		return fmt.Errorf("naive dispatcher: %w", err)
	}
	rs, err := jobs.NewClient(env.JS).Results(ctx, "")
	if err != nil {
		return err
	}
	defer rs.Close()
	side := &toolqSide{results: rs}
	viaToolq, err := simulate.Run(ctx, cfg, side)
	if err != nil {
		return fmt.Errorf("toolq: %w", err)
	}
	// Late dispatches of abandoned attempts may still be running: let toolq settle them.
	wctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	for !env.settled(wctx) {
		if wctx.Err() != nil {
			return fmt.Errorf("toolq did not settle every job: %w", wctx.Err())
		}
		time.Sleep(50 * time.Millisecond)
	}
	report := simReport{
		Turns:              cfg.Turns,
		FailureRate:        cfg.FailureRate,
		AfterDispatch:      cfg.AfterDispatch,
		ResendRate:         cfg.ResendRate,
		Seed:               cfg.Seed,
		ExpectedDuplicates: float64(cfg.Turns) * cfg.FailureRate * cfg.AfterDispatch,
		Naive:              tally(naive, env.naive.Payments(), cfg.Prefix),
		Toolq:              tally(viaToolq, env.Sandbox.Payments(), cfg.Prefix),
		Record:             side.record.snapshot(),
	}
	if *asJSON {
		line, err := json.Marshal(report)
		if err != nil {
			return err
		}
		fmt.Fprintf(stdio.Out, "%s\n", line)
	} else {
		printSimTable(stdio.Out, report)
	}
	if report.Record.Error != "" {
		return errors.New("the conversation record check failed: " + report.Record.Error)
	}
	return nil
}

type simReport struct {
	Turns              int          `json:"turns"`
	FailureRate        float64      `json:"failure_rate"`
	AfterDispatch      float64      `json:"after_dispatch"`
	ResendRate         float64      `json:"resend_rate"`
	Seed               uint64       `json:"seed"`
	ExpectedDuplicates float64      `json:"expected_duplicates"`
	Naive              simSide      `json:"naive"`
	Toolq              simSide      `json:"toolq"`
	Record             recordReport `json:"conversation_record"`
}

type simSide struct {
	simulate.Stats
	PaymentsIntended int `json:"payments_intended"`
	Payments         int `json:"payments_made"`
	DuplicatedTurns  int `json:"turns_paid_twice_or_more"`
	Duplicates       int `json:"duplicates"` // extra payments
}

// tally counts the side's payments per invoice; every turn intends one.
func tally(st simulate.Stats, payments []sandbox.Payment, prefix string) simSide {
	perInvoice := map[string]int{}
	for _, p := range payments {
		if strings.HasPrefix(p.InvoiceID, "inv_"+prefix+"_") {
			perInvoice[p.InvoiceID]++
		}
	}
	r := simSide{Stats: st, PaymentsIntended: st.Turns}
	for _, n := range perInvoice {
		r.Payments += n
		if n > 1 {
			r.DuplicatedTurns++
			r.Duplicates += n - 1
		}
	}
	return r
}

func printSimTable(out io.Writer, r simReport) {
	fmt.Fprintf(out, "%d turns, failure rate %v, %v of failures after dispatch, resend rate %v, seed %d\n\n",
		r.Turns, r.FailureRate, r.AfterDispatch, r.ResendRate, r.Seed)
	w := cli.NewTable(out)
	row := func(name string, f func(simSide) int) {
		fmt.Fprintf(w, "%s\t%d\t%d\n", name, f(r.Naive), f(r.Toolq))
	}
	fmt.Fprintln(w, "\tNAIVE DISPATCHER\tTOOLQ")
	row("turns", func(s simSide) int { return s.Turns })
	row("stream failures", func(s simSide) int { return s.StreamFailures })
	row("failures after dispatch", func(s simSide) int { return s.AfterDispatch })
	row("abandoned (not run)", func(s simSide) int { return s.NotRun })
	row("jobs published", func(s simSide) int { return s.Dispatches })
	row("payments intended", func(s simSide) int { return s.PaymentsIntended })
	row("payments made", func(s simSide) int { return s.Payments })
	row("turns paid twice or more", func(s simSide) int { return s.DuplicatedTurns })
	row("extra payments", func(s simSide) int { return s.Duplicates })
	fmt.Fprintf(w, "expected duplicates (turns × failure rate × after dispatch)\t%.1f\t\n", r.ExpectedDuplicates)
	w.Flush()
	rec := r.Record
	verdict := "every committed turn has one tool_result per tool_use, no abandoned call has a result"
	if rec.Error != "" {
		verdict = "FAILED: " + rec.Error
	}
	fmt.Fprintf(out, "\nconversation record (toolq): %d conversations, %d turns committed, %d calls recorded not run (connection lost): %s\n",
		rec.Conversations, rec.TurnsCommitted, rec.NotRun, verdict)
}

// printArithmetic is the chapter's arithmetic: the window in which a stream
// failure leaves a call that ran but is not on the record, and the
// duplicates a month of turns brings without toolq.
func printArithmetic(out io.Writer, asJSON bool, toolLatency, providerGap time.Duration, turnsPerMonth int, cfg simulate.Config) error {
	if toolLatency < 0 || providerGap < 0 || turnsPerMonth < 0 {
		return cli.Usagef("--tool-latency, --provider-gap and --turns-per-month must not be negative")
	}
	window := toolLatency + providerGap
	perMonth := float64(turnsPerMonth) * cfg.FailureRate * cfg.AfterDispatch
	if asJSON {
		return cli.PrintJSON(out, map[string]any{
			"tool_latency_ms": toolLatency.Milliseconds(), "provider_gap_ms": providerGap.Milliseconds(),
			"exposure_window_ms": window.Milliseconds(), "turns_per_month": turnsPerMonth,
			"failure_rate": cfg.FailureRate, "after_dispatch": cfg.AfterDispatch,
			"expected_duplicates_per_month": perMonth,
		})
	}
	fmt.Fprintf(out, "exposure window per turn: %v = tool latency %v + provider gap %v\n", window, toolLatency, providerGap)
	fmt.Fprintf(out, "  A call is exposed from its dispatch until its turn is on the record. The stream must first\n"+
		"  reach message_stop (the provider gap), and the turn is committed only with the tool's result,\n"+
		"  which the agent awaits once the stream has stopped; so the tool latency follows the gap\n"+
		"  instead of overlapping it, and the window is their sum (at most: a tool that already runs\n"+
		"  during the gap shortens it). A stream failure or a lost connection inside it leaves a call\n"+
		"  that ran and a turn the model emits again with a new tool_use_id.\n")
	fmt.Fprintf(out, "expected duplicate side effects per month without toolq: %d turns × %v failure rate × %v after dispatch = %.1f\n",
		turnsPerMonth, cfg.FailureRate, cfg.AfterDispatch, perMonth)
	fmt.Fprintf(out, "with toolq: 0 (the retry's call has the same key; the ledger answers it with the first result)\n")
	return nil
}

// naiveSide posts each dispatched call straight to the payments API, as a
// dispatcher without memory does; it keeps no record.
type naiveSide struct{ url string }

func (n naiveSide) Conversation(context.Context, string) (simulate.Conversation, error) {
	return &naiveConversation{url: n.url}, nil
}

type naiveConversation struct {
	url   string
	index int64
}

func (c *naiveConversation) NextTurn() simulate.Turn     { return &naiveTurn{c: c} }
func (c *naiveConversation) Close(context.Context) error { return nil }
func (t *naiveTurn) Index() int64                        { return t.c.index }
func (t *naiveTurn) Attempt()                            {}
func (t *naiveTurn) Cut(simulate.Call)                   {}
func (t *naiveTurn) Complete(context.Context) error      { t.c.index++; return nil }
func (t *naiveTurn) Dispatch(ctx context.Context, c simulate.Call) error {
	return post(ctx, t.c.url, c.Args)
}

type naiveTurn struct{ c *naiveConversation }

var httpClient = &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}, Timeout: 30 * time.Second}

func post(ctx context.Context, url string, body []byte) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(string(body)))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := httpClient.Do(req)
	if err != nil {
		return err
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode >= 300 {
		return fmt.Errorf("naive dispatcher: POST %s: %s", url, resp.Status)
	}
	return nil
}

// toolqSide publishes each dispatched call as a job and keeps each
// conversation's record through jobs.Conversation, checked when it ends.
type toolqSide struct {
	results *jobs.Results
	record  recordTally
}

func (s *toolqSide) Conversation(_ context.Context, id string) (simulate.Conversation, error) {
	return &toolqConversation{side: s, conv: s.results.NewConversation(id)}, nil
}

type toolqConversation struct {
	side *toolqSide
	conv *jobs.Conversation
	open *toolqTurn // the turn being played, abandoned if it never commits
}

func (c *toolqConversation) NextTurn() simulate.Turn {
	c.giveUp()
	c.open = &toolqTurn{turn: c.conv.NextTurn()}
	return c.open
}

func (c *toolqConversation) giveUp() {
	if c.open != nil && c.open.attempt != nil {
		c.open.attempt.Abandon()
	}
	c.open = nil
}

func (c *toolqConversation) Close(context.Context) error {
	c.giveUp()
	c.side.record.add(c.conv)
	return nil
}

type toolqTurn struct {
	turn    *jobs.Turn
	attempt *jobs.Attempt
}

func (t *toolqTurn) Index() int64 { return t.turn.Index }
func (t *toolqTurn) Attempt()     { t.attempt = t.turn.Attempt() }
func (t *toolqTurn) Cut(c simulate.Call) {
	t.attempt.Cut(jobs.ToolCall{ToolUseID: c.ToolUseID, Tool: c.Tool, Args: c.Args})
}

func (t *toolqTurn) Dispatch(ctx context.Context, c simulate.Call) error {
	_, err := t.attempt.Dispatch(ctx, jobs.ToolCall{ToolUseID: c.ToolUseID, Tool: c.Tool, Args: c.Args})
	return err
}

func (t *toolqTurn) Complete(ctx context.Context) error {
	wctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	ct, err := t.turn.Commit(wctx, t.attempt)
	if err != nil {
		return err
	}
	for _, tr := range ct.ToolResults {
		if tr.IsError {
			return fmt.Errorf("turn %d: %s: %s", ct.Index, tr.ToolUseID, tr.Content)
		}
	}
	t.attempt = nil // committed: nothing to abandon
	return nil
}

// recordTally gathers the checks of the conversation records as the
// conversations end, so that nothing of them is kept.
type recordTally struct {
	mu sync.Mutex
	r  recordReport
}

type recordReport struct {
	Conversations  int    `json:"conversations"`
	TurnsCommitted int    `json:"turns_committed"`
	NotRun         int    `json:"calls_not_run"`
	OK             bool   `json:"ok"`
	Error          string `json:"error,omitempty"`
}

func (t *recordTally) add(c *jobs.Conversation) {
	err := c.Check()
	t.mu.Lock()
	defer t.mu.Unlock()
	t.r.Conversations++
	t.r.TurnsCommitted += len(c.Turns())
	t.r.NotRun += c.NotRunCalls()
	if err != nil && t.r.Error == "" {
		t.r.Error = err.Error()
	}
}

func (t *recordTally) snapshot() recordReport {
	t.mu.Lock()
	defer t.mu.Unlock()
	r := t.r
	r.OK = r.Error == ""
	return r
}

// simulation is the stack (NATS, a ledger, a worker and toolq's sandbox)
// and the naive dispatcher's own sandbox.
type simulation struct {
	*embedded.Stack
	naive    *sandbox.Server
	naiveURL string
	cons     jetstream.Consumer
	stop     func(context.Context) error
}

func startSimulation(ctx context.Context, cfg embedded.Config) (*simulation, error) {
	st, err := embedded.Start(ctx, cfg)
	if err != nil {
		return nil, err
	}
	s := &simulation{Stack: st}
	fail := func(err error) (*simulation, error) { s.close(); return nil, err }
	s.naive, _ = sandbox.New(sandbox.Config{})
	if s.naiveURL, s.stop, err = s.naive.Listen("127.0.0.1:0"); err != nil {
		return fail(err)
	}
	durable := "toolq"
	if cfg.NATSURL != "" { // a server of the caller's: a durable of the simulation's own
		durable = "toolq-simulate"
	}
	if _, err := st.StartWorker(ctx, worker.Config{Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
		Consumer: worker.Consumer{Durable: durable}, MaxInFlight: 256, BatchSize: 64}); err != nil {
		return fail(err)
	}
	if s.cons, err = st.JS.Consumer(ctx, jobs.JobsStream, durable); err != nil {
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
