package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/toolq/toolq/internal/cli"
	"github.com/toolq/toolq/internal/progress"
	"github.com/toolq/toolq/jobs"
	"github.com/toolq/toolq/ledger"
	"github.com/toolq/toolq/operate"
)

// runDLQ returns the dlq subcommand sub; they share their flags.
func runDLQ(sub string) cli.Func {
	return func(ctx context.Context, args []string, stdio cli.IO, getenv func(string) string) error {
		return dlq(ctx, sub, args, stdio, getenv)
	}
}

func dlq(ctx context.Context, sub string, args []string, stdio cli.IO, getenv func(string) string) error {
	fs := cli.NewFlagSet("dlq "+sub, map[string]string{
		"ls":      "publisher dlq ls [--reason R] [--json]",
		"show":    "publisher dlq show SEQ [--json]",
		"requeue": requeueSynopsis,
		"purge":   "publisher dlq purge [--reason R] --yes\n\nCounts the dead letters (of --reason), then deletes exactly those: one that arrives\nafter the count stays in the DLQ.",
	}[sub], stdio)
	var nf cli.NATSFlags
	nf.Register(fs, getenv, "nats://127.0.0.1:4222", "NATS server URL")
	reason := fs.String("reason", "", "only dead letters of this reason (invalid, too_large, max_deliver)")
	asJSON := fs.Bool("json", false, "print JSON")
	all := fs.Bool("all", false, "requeue: every dead letter (of --reason)")
	yes := fs.Bool("yes", false, "purge: yes, delete them")
	databaseURL := fs.String("database-url", cli.Env(getenv, "DATABASE_URL", ""), "requeue: the ledger (env DATABASE_URL); empty: the SQLite ledger under --data-dir")
	dataDir := fs.String("data-dir", cli.Env(getenv, "TOOLQ_DATA_DIR", "./toolq-data"), "requeue: data directory of an embedded consumer (env TOOLQ_DATA_DIR)")
	logFormat := fs.String("log-format", cli.Env(getenv, "TOOLQ_LOG_FORMAT", "text"), "requeue, purge: the lines that record what was done, on standard error: text or json (env TOOLQ_LOG_FORMAT)")
	pos, help, err := cli.Parse(fs, args)
	if help {
		return cli.ErrHelp
	}
	if err != nil {
		return err
	}
	logger, err := cli.NewLogger(stdio.Err, *logFormat, "info")
	if err != nil {
		return err
	}
	by := osUser(getenv)
	var seqs []uint64
	for _, p := range pos {
		n, err := strconv.ParseUint(p, 10, 64)
		if err != nil || n == 0 {
			return fmt.Errorf("%q is not a sequence number", p)
		}
		seqs = append(seqs, n)
	}
	switch sub {
	case "ls", "purge":
		if len(seqs) > 0 {
			return fmt.Errorf("dlq %s takes no sequence numbers", sub)
		}
	case "show":
		if len(seqs) != 1 {
			return cli.Usagef("dlq show: want exactly one SEQ")
		}
	case "requeue":
		if (len(seqs) > 0) == *all {
			return errors.New("dlq requeue: give SEQ… or --all")
		}
	}
	if sub == "purge" && !*yes {
		return errors.New("dlq purge deletes dead letters for good: add --yes")
	}
	nc, js, err := nf.JetStream("toolq dlq")
	if err != nil {
		return err
	}
	defer nc.Close()
	switch sub {
	case "ls":
		dls, err := operate.ListDeadLetters(ctx, js, *reason)
		if err != nil {
			return err
		}
		if *asJSON {
			if dls == nil {
				dls = []operate.DeadLetter{}
			}
			for i := range dls {
				dls[i].Header, dls[i].Body = nil, "" // show has them
			}
			return cli.PrintJSON(stdio.Out, dls)
		}
		w := cli.NewTable(stdio.Out)
		fmt.Fprintln(w, "SEQ\tTIME\tREASON\tSUBJECT\tJOB SEQ\tDELIVERIES\tTOOL_USE_ID\tDETAIL")
		// What a dead letter says is the agent's or its job's: printed as
		// cli.Printable makes it.
		p := cli.Printable
		for _, d := range dls {
			fmt.Fprintf(w, "%d\t%s\t%s\t%s\t%d\t%d\t%s\t%s\n", d.Seq, d.Time.UTC().Format(time.RFC3339), p(d.Reason), p(d.Subject),
				d.JobSeq, d.Deliveries, p(d.ToolUseID), p(truncate(d.Detail, 100)))
		}
		return w.Flush()
	case "show":
		d, err := operate.GetDeadLetter(ctx, js, seqs[0])
		if err != nil {
			return err
		}
		if *asJSON {
			return cli.PrintJSON(stdio.Out, d)
		}
		w := cli.NewTable(stdio.Out)
		p := cli.Printable // as in ls
		fmt.Fprintf(w, "seq:\t%d\ntime:\t%s\nreason:\t%s\ndetail:\t%s\nsubject:\t%s\njob seq:\t%d\ndeliveries:\t%d\nconsumer:\t%s\nhistory:\t%s\n",
			d.Seq, d.Time.UTC().Format(time.RFC3339Nano), p(d.Reason), p(d.Detail), p(d.Subject), d.JobSeq, d.Deliveries, p(d.Consumer), p(d.History))
		for k, v := range d.Header {
			fmt.Fprintf(w, "header %s:\t%s\n", p(k), p(strings.Join(v, ", ")))
		}
		if d.HeadersOmitted != "" {
			fmt.Fprintf(w, "headers omitted:\t%s (kept by the original, job %d in %s, until it ages out)\n", p(d.HeadersOmitted), d.JobSeq, jobs.JobsStream)
		}
		if d.BodyOmitted == 0 {
			fmt.Fprintf(w, "body:\t%s\n", p(d.Body))
			return w.Flush()
		}
		where := fmt.Sprintf("the original is job %d in %s (requeue reads it from there)", d.JobSeq, jobs.JobsStream)
		if _, err := operate.Original(ctx, js, d); errors.Is(err, operate.ErrOriginalGone) {
			where = fmt.Sprintf("the original was job %d, no longer in %s: it cannot be requeued", d.JobSeq, jobs.JobsStream)
		} else if err != nil {
			return err
		}
		fmt.Fprintf(w, "body:\tomitted (%d bytes): %s\n", d.BodyOmitted, where)
		return w.Flush()
	case "requeue":
		if *all {
			dls, err := operate.ListDeadLetters(ctx, js, *reason)
			if err != nil {
				return err
			}
			for _, d := range dls {
				seqs = append(seqs, d.Seq)
			}
		}
		guard, err := purgeGuard(ctx, *databaseURL, *dataDir, stdio)
		if err != nil {
			return err
		}
		var bar *progress.Reporter
		if *all {
			bar = progress.New(stdio.Err, "requeue", int64(len(seqs)))
		}
		defer bar.Finish()
		for i, seq := range seqs {
			d, err := operate.GetDeadLetter(ctx, js, seq)
			if err != nil {
				return err
			}
			n, err := operate.Requeue(ctx, js, seq, guard.opt)
			if errors.Is(err, operate.ErrRowMayBePurged) {
				return fmt.Errorf("refused: %w (the last purge ran --older-than %s at %s)", err, guard.olderThan, guard.at)
			}
			if err != nil {
				if n > 0 {
					logger.Error("dead letter requeued but not removed", "dlq_seq", seq, "job_seq", n, "by", by, "error", err)
				}
				return err
			}
			logger.Info("dead letter requeued", "dlq_seq", seq, "job_seq", n, "reason", d.Reason, "subject", d.Subject,
				"conversation_id", d.Conversation, "tool_use_id", d.ToolUseID, "by", by)
			bar.Set(int64(i+1), 0)
			fmt.Fprintf(stdio.Out, "dead letter %d requeued as job %d\n", seq, n)
		}
		return nil
	default: // purge
		c, err := operate.CountDeadLetters(ctx, js, *reason)
		if err != nil {
			return err
		}
		if err := operate.PurgeDeadLetters(ctx, js, c); err != nil {
			return err
		}
		logger.Info("dead letters purged", "reason", c.Reason, "count", c.N, "through_seq", c.Through, "by", by)
		fmt.Fprintf(stdio.Out, "purged %d dead letter(s), through sequence %d\n", c.N, c.Through)
		return nil
	}
}

const requeueSynopsis = `publisher dlq requeue SEQ… | --all [--reason R] [--database-url URL | --data-dir DIR]

Publishes each dead letter again on its original subject (with Toolq-Replay-Of: dlq:SEQ)
and removes it from the DLQ. The ledger keeps a requeued call from running twice, as long
as it still has the call's row. A dead letter whose body was omitted (too large for the
DLQ) is requeued from its original in TOOLQ_JOBS; once that has aged out, it cannot be.

'consumer ledger purge' records in the ledger up to when it may have deleted finished
calls. Requeue reads that record (--database-url, or the SQLite ledger under --data-dir)
and refuses a dead letter from before it: if its call completed since (a retried turn),
the row that says so may be gone, and requeued it would run again. Without a ledger to
read it requeues with a warning.`

// requeueGuard is what requeue learned of the ledger's purges.
type requeueGuard struct {
	opt           operate.RequeueOption
	olderThan, at string
}

// purgeGuard reads the ledger's purge record without changing the ledger:
// no migration, and no SQLite file created where there is none. Without a
// ledger it warns and guards nothing.
func purgeGuard(ctx context.Context, databaseURL, dataDir string, stdio cli.IO) (requeueGuard, error) {
	if databaseURL == "" {
		path := filepath.Join(dataDir, "ledger.db")
		if _, err := os.Stat(path); err != nil {
			fmt.Fprintf(stdio.Err, "warning: no ledger at %s (give --database-url or the consumer's --data-dir): "+
				"requeue cannot check that a purge left the rows of these calls\n", path)
			return requeueGuard{opt: operate.PurgedBefore(time.Time{})}, nil
		}
	}
	st, err := ledger.Open(ctx, databaseURL, dataDir)
	if err != nil {
		return requeueGuard{}, err
	}
	defer st.Close()
	r, err := st.LastPurge(ctx)
	if err != nil {
		return requeueGuard{}, fmt.Errorf("cannot read the ledger's purge record ('consumer migrate' adds it): %w", err)
	}
	return requeueGuard{opt: operate.PurgedBefore(r.PurgedBefore), olderThan: days(r.OlderThan),
		at: r.At.Format(time.RFC3339)}, nil
}

// days writes a retention as purge was given it when it was whole days.
func days(d time.Duration) string {
	if d > 0 && d%(24*time.Hour) == 0 {
		return fmt.Sprintf("%dd", d/(24*time.Hour))
	}
	return d.String()
}

func runReplay(ctx context.Context, args []string, stdio cli.IO, getenv func(string) string) error {
	fs := cli.NewFlagSet("replay", "publisher replay --subject S (--since T [--until T] | --from-seq N [--to-seq M]) [--dry-run] [--json]\n"+
		"                 [--database-url URL | --data-dir DIR]\n\n"+
		"Re-publishes jobs from TOOLQ_JOBS through the normal path, with Toolq-Replay-Of. Calls the\n"+
		"ledger has settled are answered from it: a replay runs only what never settled. T is\n"+
		"RFC 3339 or a duration ago (90m, 2h, 3d). Given the ledger, it says for each job what the\n"+
		"ledger knows of its key (completed, failed, in_flight, indeterminate, none) and so what\n"+
		"happens (answered from the ledger, runs now, waits, needs an operator), with a summary.", stdio)
	var nf cli.NATSFlags
	nf.Register(fs, getenv, "nats://127.0.0.1:4222", "NATS server URL")
	subject := fs.String("subject", "", "the jobs to replay, e.g. toolq.jobs.send_payment or toolq.jobs.>")
	since := fs.String("since", "", "from this time")
	until := fs.String("until", "", "up to this time")
	fromSeq := fs.Uint64("from-seq", 0, "from this stream sequence")
	toSeq := fs.Uint64("to-seq", 0, "up to this stream sequence")
	dry := fs.Bool("dry-run", false, "list what would be replayed and what would happen, publish nothing")
	asJSON := fs.Bool("json", false, "print JSON")
	databaseURL := fs.String("database-url", cli.Env(getenv, "DATABASE_URL", ""), "the ledger to consult (env DATABASE_URL)")
	dataDir := fs.String("data-dir", cli.Env(getenv, "TOOLQ_DATA_DIR", ""), "or the data directory of an embedded consumer, whose SQLite ledger to consult (env TOOLQ_DATA_DIR)")
	if err := cli.ParseNone(fs, args); err != nil {
		return err
	}
	r := operate.ReplayRange{Subject: *subject, FromSeq: *fromSeq, ToSeq: *toSeq}
	var err error
	if r.Since, err = parseTime(*since); err != nil {
		return cli.Usagef("--since: %w", err)
	}
	if r.Until, err = parseTime(*until); err != nil {
		return cli.Usagef("--until: %w", err)
	}
	if (*since != "" || *until != "") && (*fromSeq > 0 || *toSeq > 0) {
		return errors.New("give a time range (--since/--until) or a sequence range (--from-seq/--to-seq), not both")
	}
	if *until != "" && *since == "" {
		return cli.Usagef("--until needs --since")
	}
	if err := r.Validate(); err != nil {
		return err
	}
	var opts []operate.ReplayOption
	consulted := *databaseURL != "" || *dataDir != ""
	if consulted {
		st, err := openLedger(ctx, *databaseURL, *dataDir)
		if err != nil {
			return err
		}
		defer st.Close()
		opts = append(opts, operate.WithLedger(st))
	}
	nc, js, err := nf.JetStream("toolq replay")
	if err != nil {
		return err
	}
	defer nc.Close()
	verb := "replay"
	if *dry {
		verb = "replay (dry run)"
	}
	bar := progress.New(stdio.Err, verb, 0)
	opts = append(opts, operate.WithProgress(func(done, total uint64) { bar.Set(int64(done), int64(total)) }))
	replayed, failed := operate.Replay(ctx, js, r, *dry, opts...)
	bar.Finish()
	if failed != nil && len(replayed) == 0 {
		return failed
	}
	// A replay that failed part way shows what it did before the error:
	// those jobs are published again, and a second replay of the range
	// would publish them once more.
	summary := operate.Summary(replayed)
	if *asJSON {
		if replayed == nil {
			replayed = []operate.Replayed{}
		}
		errText := ""
		if failed != nil {
			errText = failed.Error()
		}
		if err := cli.PrintJSON(stdio.Out, struct {
			DryRun          bool                    `json:"dry_run"`
			LedgerConsulted bool                    `json:"ledger_consulted"`
			Jobs            []operate.Replayed      `json:"jobs"`
			Summary         map[operate.Outcome]int `json:"summary"`
			Error           string                  `json:"error,omitempty"`
		}{*dry, consulted, replayed, summary, errText}); err != nil {
			return err
		}
		return failed
	}
	w := cli.NewTable(stdio.Out)
	fmt.Fprintln(w, "SEQ\tNEW SEQ\tSUBJECT\tKEY\tTOOL_USE_ID\tLEDGER\tOUTCOME")
	for _, rep := range replayed {
		newSeq := "-"
		if rep.NewSeq > 0 {
			newSeq = strconv.FormatUint(rep.NewSeq, 10)
		}
		state := rep.Ledger
		if state == "" {
			state = "-"
		}
		p := cli.Printable // the key and tool_use_id are the agent's text
		fmt.Fprintf(w, "%d\t%s\t%s\t%s\t%s\t%s\t%s\n", rep.Seq, newSeq, p(rep.Subject), p(rep.Key), p(rep.ToolUseID), state, rep.Outcome)
	}
	w.Flush()
	printSummary(stdio.Out, *dry, consulted, len(replayed), summary)
	if failed != nil {
		return fmt.Errorf("the replay stopped after the jobs above: %w", failed)
	}
	return nil
}

// printSummary ends a replay's table: how many jobs, and how many of each
// outcome.
func printSummary(out io.Writer, dry, consulted bool, n int, summary map[operate.Outcome]int) {
	verb := "replayed"
	if dry {
		verb = "would replay"
	}
	fmt.Fprintf(out, "%s %d job(s)\n", verb, n)
	if !consulted {
		fmt.Fprintln(out, "the ledger was not consulted (give --database-url or --data-dir): what each job does is unknown")
		return
	}
	w := cli.NewTable(out)
	for _, o := range []operate.Outcome{operate.Answered, operate.RunsNow, operate.Waits, operate.NeedOperator, operate.Invalid} {
		if summary[o] > 0 {
			fmt.Fprintf(w, "  %s:\t%d\n", o, summary[o])
		}
	}
	w.Flush()
}

// osUser is the name of the user running the command, or $USER.
func osUser(getenv func(string) string) string {
	if u, err := user.Current(); err == nil && u.Username != "" {
		return u.Username
	}
	return getenv("USER")
}

// parseTime reads RFC 3339 or a duration before now; empty is zero.
func parseTime(s string) (time.Time, error) {
	if s == "" {
		return time.Time{}, nil
	}
	if t, err := time.Parse(time.RFC3339Nano, s); err == nil {
		return t, nil
	}
	d, err := cli.ParseDuration(s)
	if err != nil || d <= 0 {
		return time.Time{}, fmt.Errorf("%q is neither an RFC 3339 time nor a duration ago", s)
	}
	return time.Now().Add(-d), nil
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}
