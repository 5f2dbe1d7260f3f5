package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/user"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/toolq/toolq/embedded"
	"github.com/toolq/toolq/internal/cli"
	"github.com/toolq/toolq/internal/progress"
	"github.com/toolq/toolq/jobs"
	"github.com/toolq/toolq/ledger"
	"github.com/toolq/toolq/operate"
	"github.com/toolq/toolq/tools"
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

// open opens and migrates an existing ledger: a SQLite file that is not there
// is an error, not a new ledger (migrate makes one).
func (s *storeFlags) open(ctx context.Context) (*ledger.Store, error) {
	if s.databaseURL == "" {
		path := filepath.Join(s.dataDir, "ledger.db")
		if _, err := os.Stat(path); err != nil {
			return nil, fmt.Errorf("no ledger at %s (give --database-url or the consumer's --data-dir; 'consumer migrate' makes a new one)", path)
		}
	}
	return s.openOrCreate(ctx)
}

// openOrCreate opens and migrates the ledger, making a SQLite file where
// there is none.
func (s *storeFlags) openOrCreate(ctx context.Context) (*ledger.Store, error) {
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
	st, err := sf.openOrCreate(ctx)
	if err != nil {
		return err
	}
	defer st.Close()
	fmt.Fprintf(stdio.Out, "ledger schema is up to date (%s)\n", st.Backend())
	return nil
}

func ledgerLs(ctx context.Context, args []string, stdio cli.IO, getenv func(string) string) error {
	fs := cli.NewFlagSet("ls", "consumer ledger ls [--state in_flight|completed|failed|indeterminate|awaiting_approval] [--stale] [--tool T] "+
		"[--conversation C] [--tenant T] [--older-than D] [--newer-than D] [--limit N] [--json]", stdio)
	var sf storeFlags
	sf.register(fs, getenv)
	state := fs.String("state", "", "only rows in this state")
	stale := fs.Bool("stale", false, "only in-flight rows whose lease has expired (their holder died)")
	tool := fs.String("tool", "", "only rows of this tool")
	conversation := fs.String("conversation", "", "only rows of this conversation")
	tenant := fs.String("tenant", "", "only rows of this tenant's calls")
	olderThan := fs.String("older-than", "", "only rows last updated more than D ago (90m, 36h, 30d)")
	newerThan := fs.String("newer-than", "", "only rows last updated at most D ago")
	limit := fs.Int("limit", 100, "at most this many rows, most recently updated first")
	asJSON := fs.Bool("json", false, "print a JSON array")
	if err := cli.ParseNone(fs, args); err != nil {
		return err
	}
	if *state != "" && !ledger.State(*state).Valid() {
		return cli.Usagef("--state %q: want in_flight, completed, failed, indeterminate or awaiting_approval", *state)
	}
	if err := cli.RefuseEmpty(fs, "tenant", "to list every tenant's rows"); err != nil {
		return err
	}
	if !jobs.ValidTenant(*tenant) {
		return cli.Usagef("--tenant %q: not a tenant's name", *tenant)
	}
	f := ledger.Filter{State: ledger.State(*state), Stale: *stale, Tool: *tool, ConversationID: *conversation, Tenant: *tenant, Limit: *limit}
	for _, a := range []struct {
		name, v string
		d       *time.Duration
	}{{"older-than", *olderThan, &f.OlderThan}, {"newer-than", *newerThan, &f.NewerThan}} {
		if a.v == "" {
			continue
		}
		d, err := cli.ParseDuration(a.v)
		if err != nil || d <= 0 {
			return cli.Usagef("--%s %q: want a positive duration (90m, 36h, 30d)", a.name, a.v)
		}
		*a.d = d
	}
	if *limit <= 0 {
		return cli.Usagef("--limit %d: want a positive number", *limit)
	}
	st, err := sf.open(ctx)
	if err != nil {
		return err
	}
	defer st.Close()
	rows, err := st.List(ctx, f)
	if err != nil {
		return err
	}
	if *asJSON {
		return cli.PrintJSON(stdio.Out, rows)
	}
	// A TENANT column when a row listed is a tenant's: two tenants'
	// identical calls differ in nothing else but the key.
	tenants := slices.ContainsFunc(rows, func(r ledger.Row) bool { return r.Tenant != "" })
	w := cli.NewTable(stdio.Out)
	if tenants {
		fmt.Fprint(w, "TENANT\t")
	}
	fmt.Fprintln(w, "KEY\tSTATE\tATTEMPT\tTOOL\tCONVERSATION\tTURN\tORDINAL\tLEASE\tUPDATED")
	for _, r := range rows {
		if tenants {
			fmt.Fprintf(w, "%s\t", tenantText(r.Tenant))
		}
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

// callFlags name a tool call by its fields instead of its key.
type callFlags struct {
	call     jobs.Call
	args     string
	byFields bool // the key was derived from the fields
}

// register adds the call's fields to fs; withTenant adds --tenant, for the
// ledger commands (approve and deny, whose --tenants names the tenants the
// consumers serve, take a tenant's call by its key).
func (c *callFlags) register(fs *flag.FlagSet, withTenant bool) {
	if withTenant {
		fs.StringVar(&c.call.Tenant, "tenant", "", "instead of KEY: the call's tenant (leave it out for the default tenant's call)")
	}
	fs.StringVar(&c.call.ConversationID, "conversation", "", "instead of KEY: the call's conversation id")
	fs.Int64Var(&c.call.TurnIndex, "turn", 0, "instead of KEY: its turn index")
	fs.StringVar(&c.call.Tool, "tool", "", "instead of KEY: its tool")
	fs.Int64Var(&c.call.Ordinal, "ordinal", 0, "instead of KEY: its ordinal among identical calls of the turn")
	fs.StringVar(&c.args, "args", "", "instead of KEY: its arguments, a JSON object")
}

// key returns the key given as the one positional argument, or derived from
// the call's fields; not both.
func (c *callFlags) key(fs *flag.FlagSet, pos []string) (string, error) {
	if err := cli.RefuseEmpty(fs, "tenant", "to name the default tenant's call"); err != nil {
		return "", err
	}
	given := false
	fs.Visit(func(f *flag.Flag) {
		switch f.Name {
		case "tenant", "conversation", "turn", "tool", "ordinal", "args":
			given = true
		}
	})
	switch {
	case given && len(pos) > 0:
		tenant := ""
		if fs.Lookup("tenant") != nil {
			tenant = "[--tenant] "
		}
		return "", cli.Usagef("give KEY or the call's fields (%s--conversation --turn --tool [--ordinal] --args), not both", tenant)
	case given:
		if c.args == "" {
			return "", cli.Usagef("--args is required with the call's fields")
		}
		c.call.Args = []byte(c.args)
		key, err := c.call.Key()
		if err != nil {
			return "", fmt.Errorf("the call's fields: %w", err)
		}
		c.byFields = true
		return key, nil
	case len(pos) != 1:
		return "", cli.Usagef("want exactly one KEY (or the call's fields), got %d arguments", len(pos))
	}
	return pos[0], nil
}

// rowKey is the key of the row the worker acts on for the call: key, or,
// for a call named by its fields, the key it had before member names were
// ordered by all their UTF-16 code units when the ledger has a row under
// that one (worker/legacykey.go). A legacy row released as not run (which
// Get does not see) is the row when the call has none under key yet: a
// resolution repeated finds it, and once the call ran again under key,
// that row is the one. An error is the ledger's.
func (c *callFlags) rowKey(ctx context.Context, st *ledger.Store, key string) (string, error) {
	if !c.byFields {
		return key, nil
	}
	m, err := c.call.Material()
	if err != nil {
		return key, nil
	}
	legacy, ok := m.Legacy()
	if !ok {
		return key, nil
	}
	_, err = st.Get(ctx, legacy.Key())
	switch {
	case err == nil:
		return legacy.Key(), nil
	case !errors.Is(err, ledger.ErrNotFound):
		return "", err
	}
	// ApprovalStatusOf sees released rows too.
	for _, k := range []string{key, legacy.Key()} {
		_, err := st.ApprovalStatusOf(ctx, k)
		switch {
		case err == nil:
			return k, nil
		case !errors.Is(err, ledger.ErrNotFound):
			return "", err
		}
	}
	return key, nil
}

func ledgerShow(ctx context.Context, args []string, stdio cli.IO, getenv func(string) string) error {
	fs := cli.NewFlagSet("show", "consumer ledger show (KEY | [--tenant T] --conversation C --turn N --tool T [--ordinal K] --args JSON) [--json]", stdio)
	var sf storeFlags
	sf.register(fs, getenv)
	var cf callFlags
	cf.register(fs, true)
	asJSON := fs.Bool("json", false, "print the row as JSON")
	pos, help, err := cli.Parse(fs, args)
	if help {
		return cli.ErrHelp
	}
	if err != nil {
		return err
	}
	key, err := cf.key(fs, pos)
	if err != nil {
		return err
	}
	st, err := sf.open(ctx)
	if err != nil {
		return err
	}
	defer st.Close()
	if key, err = cf.rowKey(ctx, st, key); err != nil {
		return err
	}
	r, err := st.Get(ctx, key)
	if err != nil {
		return err
	}
	if *asJSON {
		return cli.PrintJSON(stdio.Out, r)
	}
	// What a row holds is the agent's (its call, the approval's args) or
	// the tool's (its result, its error): printed as cli.Printable makes it.
	p := cli.Printable
	w := cli.NewTable(stdio.Out)
	for _, kv := range [][2]string{
		{"key", r.Key}, {"tenant", tenantText(r.Tenant)}, {"state", string(r.State)}, {"attempt", attemptText(r)}, {"tool", r.Tool},
		{"conversation_id", r.ConversationID}, {"turn_index", fmt.Sprint(r.TurnIndex)}, {"ordinal", fmt.Sprint(r.Ordinal)},
		{"args_digest", r.ArgsDigest}, {"first_tool_use_id", r.FirstToolUseID}, {"owner", r.Owner},
		{"lease", leaseText(r) + " (until " + r.LeaseUntil.Format(time.RFC3339Nano) + ")"},
		{"trace", r.TraceID + " span " + r.SpanID}, {"result", string(r.Result)}, {"error", errorText(r.Error)},
		{"created_at", r.CreatedAt.Format(time.RFC3339Nano)}, {"updated_at", r.UpdatedAt.Format(time.RFC3339Nano)},
		{"answered_at", answeredText(r)},
	} {
		fmt.Fprintf(w, "%s:\t%s\n", kv[0], p(kv[1]))
	}
	if r.ApprovalStatus != "" && r.Approval != nil {
		for _, kv := range [][2]string{
			{"approval", string(r.ApprovalStatus) + ", group " + r.Approval.Group + ", asked " + r.Approval.RequestedAt.Format(time.RFC3339) +
				", expires " + r.ApprovalExpiresAt.Format(time.RFC3339)},
			{"approval_args", string(r.Approval.Args)},
			{"waiters", strings.Join(r.Waiters, ", ")},
		} {
			fmt.Fprintf(w, "%s:\t%s\n", kv[0], p(kv[1]))
		}
	}
	if len(r.History) == 0 {
		fmt.Fprintf(w, "history:\t(no operator decision)\n")
	}
	for i, e := range r.History {
		label := ""
		if i == 0 {
			label = "history:"
		}
		fmt.Fprintf(w, "%s\t%s\n", label, p(eventText(e)))
	}
	return w.Flush()
}

// tenantText is whose call a row is: a tenant, or the default tenant.
func tenantText(tenant string) string {
	if tenant == "" {
		return "(default)"
	}
	return tenant
}

// attemptText is the row's attempt, and for an indeterminate row the
// attempt a resolution names: the row's, whatever its error says (a holder
// lost during attempt 1 is indeterminate at attempt 2, its takeover).
func attemptText(r ledger.Row) string {
	if r.State == ledger.Indeterminate {
		return fmt.Sprintf("%d (resolve with --attempt %d)", r.Attempt, r.Attempt)
	}
	return fmt.Sprint(r.Attempt)
}

// eventText is one line of a row's history.
func eventText(e ledger.Event) string {
	s := fmt.Sprintf("%s by %s: %s %s (%s); was %s", e.At.Format(time.RFC3339), e.By, e.Action, e.Decision, e.Reason, e.From)
	if e.Error != nil {
		s += ", " + errorText(e.Error)
	}
	if len(e.Output) > 0 {
		s += ", output " + string(e.Output)
	}
	if e.Digest != "" {
		s += ", group " + e.Group + ", args digest " + e.Digest
	}
	if e.Attempt > 0 {
		s += fmt.Sprintf(", attempt %d", e.Attempt)
	}
	return s
}

func errorText(e *ledger.ErrorInfo) string {
	if e == nil {
		return ""
	}
	return e.Code + ": " + e.Message
}

func ledgerResolve(ctx context.Context, args []string, stdio cli.IO, getenv func(string) string) error {
	fs := cli.NewFlagSet("resolve", "consumer ledger resolve (KEY | [--tenant T] --conversation C --turn N --tool T [--ordinal K] --args JSON)\n"+
		"                        --attempt N (--output JSON | --not-run) --reason TEXT [--by NAME]\n\n"+
		"Settles an indeterminate row. --output: the call did happen, and this JSON is its\n"+
		"output (duplicates get it from now on). --not-run: it did not happen; the row is\n"+
		"released so that a redelivery or a replay runs the call. --attempt: the row's\n"+
		"attempt as 'ledger show' prints it (\"resolve with --attempt N\"), once you checked\n"+
		"the outcome the row's error names (a worker lost during attempt N-1 leaves the row\n"+
		"at N); another attempt (the call ran again) is refused. The decision, who took it\n"+
		"and why are recorded in the row's history ('ledger show'). Resolving a resolved\n"+
		"row the same way again changes nothing; another way is refused.", stdio)
	var sf storeFlags
	sf.register(fs, getenv)
	output := fs.String("output", "", "the call's output, as JSON")
	notRun := fs.Bool("not-run", false, "the call did not take effect: release the row")
	reason := fs.String("reason", "", "why: what you checked (required; recorded in the row's history)")
	by := fs.String("by", osUser(getenv), "who decided (default: the OS user)")
	attempt := fs.Int64("attempt", 0, "the row's attempt, as 'ledger show' prints it; without it, the row's, refused once the row was resolved before")
	logFormat := fs.String("log-format", cli.Env(getenv, "TOOLQ_LOG_FORMAT", "text"), "the line that records the decision on standard error: text or json (env TOOLQ_LOG_FORMAT)")
	var cf callFlags
	cf.register(fs, true)
	pos, help, err := cli.Parse(fs, args)
	if help {
		return cli.ErrHelp
	}
	if err != nil {
		return err
	}
	key, err := cf.key(fs, pos)
	if err != nil {
		return err
	}
	logger, err := cli.NewLogger(stdio.Err, *logFormat, "info")
	if err != nil {
		return err
	}
	res := ledger.Resolution{By: *by, Reason: *reason, Attempt: *attempt}
	switch {
	case *attempt < 0:
		return cli.Usagef("--attempt must be positive")
	case (*output != "") == *notRun:
		return errors.New("give exactly one of --output JSON and --not-run")
	case strings.TrimSpace(*reason) == "":
		return cli.Usagef("--reason is required: say what you checked, it is recorded with the decision")
	case strings.TrimSpace(*by) == "":
		return cli.Usagef("--by is required: no OS user to record as who decided")
	case *notRun:
		res.NotRun = true
	default:
		if !json.Valid([]byte(*output)) {
			return cli.Usagef("--output is not valid JSON")
		}
		res.Output = json.RawMessage(*output)
	}
	st, err := sf.open(ctx)
	if err != nil {
		return err
	}
	defer st.Close()
	if key, err = cf.rowKey(ctx, st, key); err != nil {
		return err
	}
	changed, err := st.Resolve(ctx, key, res)
	if err == nil {
		logger.Info("ledger row resolved", "key", key, "attempt", res.Attempt, "decision", res.Decision(), "reason", res.Reason, "by", res.By, "changed", changed)
	}
	switch {
	case err != nil:
		return err
	case !changed:
		fmt.Fprintf(stdio.Out, "%s was already resolved this way: nothing changed\n", key)
	case res.NotRun:
		fmt.Fprintf(stdio.Out, "%s released: the next delivery of the call runs it\n", key)
	default:
		fmt.Fprintf(stdio.Out, "%s completed with the given output\n", key)
	}
	return nil
}

// osUser is the name of the user running the command, or "".
func osUser(getenv func(string) string) string {
	if u, err := user.Current(); err == nil && u.Username != "" {
		return u.Username
	}
	return getenv("USER")
}

const purgeSynopsis = `consumer ledger purge (--older-than D | --tools FILE) [--dry-run] [--batch N] [NATS flags] [--horizon H]

Deletes completed, failed and released rows neither updated nor answering a duplicate
for more than D (e.g. 31d, 36h) and the hour a row's record of its answers may lag
(answered_at in 'ledger show'); a released row is a claim given up because its call was
not sent.
In-flight and indeterminate rows are kept.

A finished call's row is what keeps a job that comes back from running it again, so D
must be longer than every way a job can come back: TOOLQ_JOBS's max age (a replay),
TOOLQ_DLQ's max age (a requeued dead letter) and the duplicate window. purge reads them
from the live streams (the NATS flags, default the embedded server's address) and
refuses a shorter D, naming the setting. When the streams cannot be read, give
--horizon H, the longest they keep a job (at least 30d, the DLQ's default); streams
that can be read still count. Each purge is recorded in the ledger, so that
'publisher dlq requeue' refuses a dead letter older than what it may have deleted.

A tool whose calls can come back later (an agent that resends old conversations)
states its retention in the registry (retention: 90d; the top-level retention is
the default of every tool). With --tools FILE, --older-than is refused when a tool
states a longer one; without --older-than, each tool is purged at its own retention
and the others at the top-level one, each checked against the streams.`

func ledgerPurge(ctx context.Context, args []string, stdio cli.IO, getenv func(string) string) error {
	fs := cli.NewFlagSet("purge", purgeSynopsis, stdio)
	var sf storeFlags
	sf.register(fs, getenv)
	var nf cli.NATSFlags
	nf.Register(fs, getenv, "nats://127.0.0.1:4222", "NATS server whose streams bound the retention")
	olderThan := fs.String("older-than", "", "retention, e.g. 31d (default with --tools: each tool's own)")
	toolsFile := fs.String("tools", cli.Env(getenv, "TOOLQ_TOOLS", ""), "tool registry file whose retentions to keep (env TOOLQ_TOOLS)")
	horizon := fs.String("horizon", "", "when the streams cannot be read: the longest they keep a job, at least 30d")
	dry := fs.Bool("dry-run", false, "count the rows a purge would delete, delete nothing")
	batch := fs.Int("batch", 1000, "rows deleted per statement")
	logFormat := fs.String("log-format", cli.Env(getenv, "TOOLQ_LOG_FORMAT", "text"), "the line that records the purge on standard error: text or json (env TOOLQ_LOG_FORMAT)")
	if err := cli.ParseNone(fs, args); err != nil {
		return err
	}
	logger, err := cli.NewLogger(stdio.Err, *logFormat, "info")
	if err != nil {
		return err
	}
	if *batch <= 0 {
		return cli.Usagef("--batch %d: want a positive number", *batch)
	}
	var retention tools.Retention
	if *toolsFile != "" {
		if retention, err = tools.LoadRetention(*toolsFile); err != nil {
			return err
		}
	}
	passes, err := purgePasses(*olderThan, *toolsFile, retention)
	if err != nil {
		return err
	}
	comebacks, err := purgeComebacks(ctx, &nf, *horizon)
	if err != nil {
		return err
	}
	var re *operate.RetentionError
	for _, p := range passes {
		if err := operate.CheckRetention(p.age, comebacks); errors.As(err, &re) {
			return fmt.Errorf("refused: %s is not longer than %s: %s", p.label, re.Comeback, re.Comeback.Risk)
		}
	}
	st, err := sf.open(ctx)
	if err != nil {
		return err
	}
	defer st.Close()
	var total int64
	counts := make([]int64, len(passes))
	for i, p := range passes {
		if counts[i], err = st.PurgeCount(ctx, p.age, p.opts...); err != nil {
			return err
		}
		total += counts[i]
	}
	verb := "purged"
	if *dry {
		verb = "would purge"
	}
	if *dry {
		for i, p := range passes {
			p.report(stdio.Out, verb, counts[i], len(passes))
		}
		return nil
	}
	bar := progress.New(stdio.Err, "purge", total)
	var done int64
	deleted := make([]int64, len(passes))
	for i, p := range passes {
		n, err := st.Purge(ctx, p.age, *batch, append(p.opts, ledger.PurgeProgress(func(n int64) { bar.Set(done+n, 0) }))...)
		done += n
		if err != nil {
			bar.Finish()
			logger.Error("ledger purge failed", "rows", p.rows, "older_than", days(p.age), "rows_deleted", n, "by", osUser(getenv), "error", err)
			return err
		}
		logger.Info("ledger purged", "rows", p.rows, "older_than", days(p.age), "cutoff", p.before(), "rows_deleted", n,
			"backend", st.Backend(), "by", osUser(getenv))
		deleted[i] = n
	}
	bar.Finish()
	for i, p := range passes {
		p.report(stdio.Out, verb, deleted[i], len(passes))
	}
	return nil
}

// purgePass is one statement of a purge: the rows of one tool at its own
// retention, or those of every other tool.
type purgePass struct {
	label string // what the retention is, for a refusal: "--older-than 31d", "send_payment's retention 90d in tools.yaml"
	rows  string // whose rows: "every tool", "send_payment", "every other tool"
	age   time.Duration
	opts  []ledger.PurgeOption
}

// before is the purge's cutoff less the hour a row's record of its answers
// may lag: the rows purged finished before it (by this machine's clock; the
// purge goes by the database's).
func (p purgePass) before() string {
	return time.Now().Add(-p.age - time.Hour).UTC().Format(time.RFC3339)
}

func (p purgePass) report(w io.Writer, verb string, n int64, passes int) {
	if passes == 1 {
		fmt.Fprintf(w, "%s %d row(s) finished before %s\n", verb, n, p.before())
		return
	}
	fmt.Fprintf(w, "%s %d row(s) of %s finished before %s (%s)\n", verb, n, p.rows, p.before(), days(p.age))
}

// purgePasses splits a purge by the registry's retentions. --older-than,
// when given, applies to every tool, and is refused when a tool states a
// longer retention; without it, each tool that states its own is purged at
// it, and the others at the registry's default.
func purgePasses(olderThan, file string, r tools.Retention) ([]purgePass, error) {
	var d time.Duration
	if olderThan != "" {
		var err error
		if d, err = cli.ParseDuration(olderThan); err != nil {
			return nil, cli.Usagef("--older-than: %w", err)
		}
		if d <= 0 {
			return nil, cli.Usagef("--older-than must be positive")
		}
		for _, tool := range sortedTools(r) {
			if r.Tools[tool] > d {
				return nil, fmt.Errorf("refused: --older-than %s is shorter than %s's retention %s in %s: its calls can come back for that long "+
					"(omit --older-than to purge each tool at its own retention)", olderThan, tool, days(r.Tools[tool]), file)
			}
		}
		if r.Default > d {
			return nil, fmt.Errorf("refused: --older-than %s is shorter than the retention %s in %s (omit --older-than to purge each tool at its own retention)",
				olderThan, days(r.Default), file)
		}
		return []purgePass{{label: "--older-than " + olderThan, rows: "every tool", age: d}}, nil
	}
	if file == "" {
		return nil, cli.Usagef("--older-than is required (e.g. --older-than 31d), or --tools with retentions")
	}
	if r.Default == 0 {
		return nil, cli.Usagef("--older-than is required: %s states no top-level retention for the tools without their own", file)
	}
	var passes []purgePass
	var own []string
	for _, tool := range sortedTools(r) {
		if r.Tools[tool] == r.Default {
			continue
		}
		own = append(own, tool)
		passes = append(passes, purgePass{label: fmt.Sprintf("%s's retention %s in %s", tool, days(r.Tools[tool]), file), rows: tool,
			age: r.Tools[tool], opts: []ledger.PurgeOption{ledger.PurgeOnly(tool)}})
	}
	rows := "every tool"
	if len(own) > 0 {
		rows = "every other tool"
	}
	return append(passes, purgePass{label: fmt.Sprintf("the retention %s in %s", days(r.Default), file), rows: rows,
		age: r.Default, opts: []ledger.PurgeOption{ledger.PurgeExcept(own...)}}), nil
}

func sortedTools(r tools.Retention) []string {
	names := make([]string, 0, len(r.Tools))
	for t := range r.Tools {
		names = append(names, t)
	}
	sort.Strings(names)
	return names
}

// days writes a retention as it is given: 31d, 36h0m0s.
func days(d time.Duration) string {
	if d > 0 && d%(24*time.Hour) == 0 {
		return fmt.Sprintf("%dd", d/(24*time.Hour))
	}
	return d.String()
}

// purgeComebacks returns the ways a job can come back that a purge must
// outlive: those of the live streams, and the --horizon when given. Without
// the streams and without a horizon it refuses.
func purgeComebacks(ctx context.Context, nf *cli.NATSFlags, horizonFlag string) ([]operate.Comeback, error) {
	var cs []operate.Comeback
	if horizonFlag != "" {
		h, err := cli.ParseDuration(horizonFlag)
		if err != nil {
			return nil, cli.Usagef("--horizon: %w", err)
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
			"give the NATS flags of toolq's server, or --horizon H (at least 30d), the longest the streams keep a job", embedded.RedactURL(nf.URL), err)
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

// answeredText is when the row last recorded answering a duplicate: a
// duplicate answered within the hour of the row's last update or recorded
// answer is not recorded (Row.AnsweredAt).
func answeredText(r ledger.Row) string {
	if r.AnsweredAt.IsZero() {
		return "(none recorded: none answered more than an hour after updated_at)"
	}
	return r.AnsweredAt.Format(time.RFC3339) + " (answers within the hour after it are not recorded)"
}
