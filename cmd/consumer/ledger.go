package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"time"

	"github.com/toolq/toolq/internal/cli"
	"github.com/toolq/toolq/ledger"
	"github.com/toolq/toolq/operate"
)

// storeFlags are the flags that name the ledger.
type storeFlags struct {
	databaseURL string
	dataDir     string
}

func (s *storeFlags) register(fs *flag.FlagSet, getenv func(string) string) {
	fs.StringVar(&s.databaseURL, "database-url", cli.Env(getenv, "DATABASE_URL", ""),
		"Postgres URL of the ledger (env DATABASE_URL); empty: SQLite under --data-dir")
	fs.StringVar(&s.dataDir, "data-dir", cli.Env(getenv, "TOOLQ_DATA_DIR", "./toolq-data"),
		"directory of the embedded server's store and the SQLite ledger (env TOOLQ_DATA_DIR)")
}

// open opens and migrates the ledger.
func (s *storeFlags) open(ctx context.Context) (*ledger.Store, error) {
	st, err := ledger.Open(ctx, s.databaseURL, s.dataDir)
	if err != nil {
		return nil, err
	}
	if err := st.Migrate(ctx); err != nil {
		st.Close()
		return nil, err
	}
	return st, nil
}

func runMigrate(ctx context.Context, args []string, stdio cli.IO, getenv func(string) string) error {
	fs := cli.NewFlagSet("migrate", "consumer migrate [--database-url URL | --data-dir DIR]", stdio)
	var sf storeFlags
	sf.register(fs, getenv)
	if err := cli.ParseNone(fs, args); err != nil {
		return err
	}
	st, err := sf.open(ctx)
	if err != nil {
		return err
	}
	defer st.Close()
	fmt.Fprintf(stdio.Out, "ledger schema is up to date (%s)\n", st.Backend())
	return nil
}

func ledgerLs(ctx context.Context, args []string, stdio cli.IO, getenv func(string) string) error {
	fs := cli.NewFlagSet("ls", "consumer ledger ls [--state in_flight|completed|failed|indeterminate] [--stale] [--limit N] [--json]", stdio)
	var sf storeFlags
	sf.register(fs, getenv)
	state := fs.String("state", "", "only rows in this state")
	stale := fs.Bool("stale", false, "only in-flight rows whose lease has expired (their holder died)")
	limit := fs.Int("limit", 100, "at most this many rows, most recently updated first")
	asJSON := fs.Bool("json", false, "print a JSON array")
	if err := cli.ParseNone(fs, args); err != nil {
		return err
	}
	if *state != "" && !ledger.State(*state).Valid() {
		return fmt.Errorf("--state %q: want in_flight, completed, failed or indeterminate", *state)
	}
	st, err := sf.open(ctx)
	if err != nil {
		return err
	}
	defer st.Close()
	rows, err := st.List(ctx, ledger.Filter{State: ledger.State(*state), Stale: *stale, Limit: *limit})
	if err != nil {
		return err
	}
	if *asJSON {
		return cli.PrintJSON(stdio.Out, rows)
	}
	w := cli.NewTable(stdio.Out)
	fmt.Fprintln(w, "KEY\tSTATE\tATTEMPT\tTOOL\tCONVERSATION\tTURN\tORDINAL\tLEASE\tUPDATED")
	for _, r := range rows {
		fmt.Fprintf(w, "%s\t%s\t%d\t%s\t%s\t%d\t%d\t%s\t%s\n", r.Key, r.State, r.Attempt, r.Tool, r.ConversationID,
			r.TurnIndex, r.Ordinal, leaseText(r), r.UpdatedAt.Format(time.RFC3339))
	}
	return w.Flush()
}

func leaseText(r ledger.Row) string {
	switch {
	case r.State != ledger.InFlight:
		return "-"
	case r.LeaseExpired():
		return "expired"
	default:
		return r.LeaseRemaining.Round(time.Second).String()
	}
}

func ledgerShow(ctx context.Context, args []string, stdio cli.IO, getenv func(string) string) error {
	fs := cli.NewFlagSet("show", "consumer ledger show KEY [--json]", stdio)
	var sf storeFlags
	sf.register(fs, getenv)
	asJSON := fs.Bool("json", false, "print the row as JSON")
	pos, err := cli.ParseN(fs, args, 1, "KEY")
	if err != nil {
		return err
	}
	key := pos[0]
	st, err := sf.open(ctx)
	if err != nil {
		return err
	}
	defer st.Close()
	r, err := st.Get(ctx, key)
	if err != nil {
		return err
	}
	if *asJSON {
		return cli.PrintJSON(stdio.Out, r)
	}
	w := cli.NewTable(stdio.Out)
	for _, kv := range [][2]string{
		{"key", r.Key}, {"state", string(r.State)}, {"attempt", fmt.Sprint(r.Attempt)}, {"tool", r.Tool},
		{"conversation_id", r.ConversationID}, {"turn_index", fmt.Sprint(r.TurnIndex)}, {"ordinal", fmt.Sprint(r.Ordinal)},
		{"args_digest", r.ArgsDigest}, {"first_tool_use_id", r.FirstToolUseID}, {"owner", r.Owner},
		{"lease", leaseText(r) + " (until " + r.LeaseUntil.Format(time.RFC3339Nano) + ")"},
		{"trace", r.TraceID + " span " + r.SpanID}, {"result", string(r.Result)}, {"error", errorText(r.Error)},
		{"created_at", r.CreatedAt.Format(time.RFC3339Nano)}, {"updated_at", r.UpdatedAt.Format(time.RFC3339Nano)},
	} {
		fmt.Fprintf(w, "%s:\t%s\n", kv[0], kv[1])
	}
	return w.Flush()
}

func errorText(e *ledger.ErrorInfo) string {
	if e == nil {
		return ""
	}
	return e.Code + ": " + e.Message
}

func ledgerResolve(ctx context.Context, args []string, stdio cli.IO, getenv func(string) string) error {
	fs := cli.NewFlagSet("resolve", "consumer ledger resolve KEY (--output JSON | --not-run)\n\n"+
		"Settles an indeterminate row. --output: the call did happen, and this JSON is its\n"+
		"output (duplicates get it from now on). --not-run: it did not happen; the row is\n"+
		"released so that a redelivery or a replay runs the call.", stdio)
	var sf storeFlags
	sf.register(fs, getenv)
	output := fs.String("output", "", "the call's output, as JSON")
	notRun := fs.Bool("not-run", false, "the call did not take effect: release the row")
	pos, err := cli.ParseN(fs, args, 1, "KEY")
	if err != nil {
		return err
	}
	key := pos[0]
	var res ledger.Resolution
	switch {
	case (*output != "") == *notRun:
		return errors.New("give exactly one of --output JSON and --not-run")
	case *notRun:
		res.NotRun = true
	default:
		if !json.Valid([]byte(*output)) {
			return errors.New("--output is not valid JSON")
		}
		res.Output = json.RawMessage(*output)
	}
	st, err := sf.open(ctx)
	if err != nil {
		return err
	}
	defer st.Close()
	if err := st.Resolve(ctx, key, res); err != nil {
		return err
	}
	if res.NotRun {
		fmt.Fprintf(stdio.Out, "%s released: the next delivery of the call runs it\n", key)
	} else {
		fmt.Fprintf(stdio.Out, "%s completed with the given output\n", key)
	}
	return nil
}

const purgeSynopsis = `consumer ledger purge --older-than D [--dry-run] [--batch N] [NATS flags] [--horizon H]

Deletes completed, failed and released rows last updated more than D ago (e.g. 31d,
36h); a released row is a claim given up because its call was not sent. In-flight and
indeterminate rows are kept.

A finished call's row is what keeps a job that comes back from running it again, so D
must be longer than every way a job can come back: TOOLQ_JOBS's max age (a replay),
TOOLQ_DLQ's max age (a requeued dead letter) and the duplicate window. purge reads them
from the live streams (the NATS flags, default the embedded server's address) and
refuses a shorter D, naming the setting. When the streams cannot be read, give
--horizon H, the longest they keep a job (at least 30d, the DLQ's default); streams
that can be read still count. Each purge is recorded in the ledger, so that
'publisher dlq requeue' refuses a dead letter older than what it may have deleted.`

func ledgerPurge(ctx context.Context, args []string, stdio cli.IO, getenv func(string) string) error {
	fs := cli.NewFlagSet("purge", purgeSynopsis, stdio)
	var sf storeFlags
	sf.register(fs, getenv)
	var nf cli.NATSFlags
	nf.Register(fs, getenv, "nats://127.0.0.1:4222", "NATS server whose streams bound the retention")
	olderThan := fs.String("older-than", "", "retention, e.g. 31d")
	horizon := fs.String("horizon", "", "when the streams cannot be read: the longest they keep a job, at least 30d")
	dry := fs.Bool("dry-run", false, "count the rows a purge would delete, delete nothing")
	batch := fs.Int("batch", 1000, "rows deleted per statement")
	if err := cli.ParseNone(fs, args); err != nil {
		return err
	}
	if *olderThan == "" {
		return errors.New("--older-than is required (e.g. --older-than 31d)")
	}
	d, err := cli.ParseDuration(*olderThan)
	if err != nil {
		return fmt.Errorf("--older-than: %w", err)
	}
	if d <= 0 {
		return errors.New("--older-than must be positive")
	}
	comebacks, err := purgeComebacks(ctx, &nf, *horizon)
	if err != nil {
		return err
	}
	var re *operate.RetentionError
	if err := operate.CheckRetention(d, comebacks); errors.As(err, &re) {
		return fmt.Errorf("refused: --older-than %s is not longer than %s: %s", *olderThan, re.Comeback, re.Comeback.Risk)
	}
	st, err := sf.open(ctx)
	if err != nil {
		return err
	}
	defer st.Close()
	before := time.Now().Add(-d).UTC().Format(time.RFC3339)
	if *dry {
		n, err := st.PurgeCount(ctx, d)
		if err != nil {
			return err
		}
		fmt.Fprintf(stdio.Out, "would purge %d row(s) finished before %s\n", n, before)
		return nil
	}
	n, err := st.Purge(ctx, d, *batch)
	if err != nil {
		return err
	}
	fmt.Fprintf(stdio.Out, "purged %d row(s) finished before %s\n", n, before)
	return nil
}

// purgeComebacks returns the ways a job can come back that a purge must
// outlive: those of the live streams, and the --horizon when given. Without
// the streams and without a horizon it refuses.
func purgeComebacks(ctx context.Context, nf *cli.NATSFlags, horizonFlag string) ([]operate.Comeback, error) {
	var cs []operate.Comeback
	if horizonFlag != "" {
		h, err := cli.ParseDuration(horizonFlag)
		if err != nil {
			return nil, fmt.Errorf("--horizon: %w", err)
		}
		for _, def := range operate.DefaultComebacks() {
			if h < def.Age {
				return nil, fmt.Errorf("refused: --horizon %s is shorter than %s: state at least the longest max age of the streams", horizonFlag, def)
			}
		}
		cs = append(cs, operate.Comeback{Setting: "--horizon", Age: h, Risk: "a job that comes back within it would run its call again"})
	}
	live, err := liveComebacks(ctx, nf)
	if err != nil {
		if horizonFlag != "" {
			return cs, nil
		}
		return nil, fmt.Errorf("refused: cannot read the streams at %s (%v), whose max ages the retention must outlive; "+
			"give the NATS flags of toolq's server, or --horizon H (at least 30d), the longest the streams keep a job", nf.URL, err)
	}
	return append(cs, live...), nil
}

func liveComebacks(ctx context.Context, nf *cli.NATSFlags) ([]operate.Comeback, error) {
	nc, js, err := nf.JetStream("toolq ledger purge")
	if err != nil {
		return nil, err
	}
	defer nc.Close()
	return operate.Comebacks(ctx, js)
}
