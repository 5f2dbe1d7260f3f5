package ledger

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// claimPostgres claims the whole batch in one statement and returns, for
// each key, the inserted row or the row that was already there. The rows
// already there (and not released) are read first, by primary key (OFFSET
// 0 keeps the planner from turning the lookups into a scan), and only the
// other keys are inserted: a batch of duplicates writes nothing (but
// answered_at, at most once an hour a row, $14 being answeredEvery in
// milliseconds: see answeredEvery), takes no row
// lock and so commits without a WAL flush (an upsert that conflicts locks
// the row even when its WHERE leaves it alone). A key that
// a concurrent transaction inserted after this statement's snapshot was
// taken conflicts without being in the snapshot: it is not in the answer,
// and claim reads it again. A released row is claimed again at its next
// attempt by the upsert. A settled row whose answer is due to be recorded
// (due) answers only if the record was written (answered), and it is
// written only where $15 allows: in a transaction that commits waiting for
// the disk. A purge that deleted the row after this statement's snapshot
// leaves it out of the answer, and claim reads the key again, finding it
// free (answering from the deleted row would leave the duplicate's job
// free to run the call when it comes back); a claim that does not wait for
// the disk leaves it out too, and claim records the answer in a
// transaction of its own that does (recordAnswers) before it reads the key
// again.
var claimPostgres = `WITH input AS (
	SELECT * FROM unnest($1::text[], $2::text[], $3::bigint[], $4::text[], $5::bigint[], $6::text[],
		$7::text[], $8::text[], $9::text[], $10::text[], $11::bigint[], $12::text[], $13::text[])
		AS t(key, conversation_id, turn_index, tool, ordinal, args_digest, first_tool_use_id, owner, trace_id, span_id, lease_ms, claim_token, tenant)
), existing AS (
	SELECT e.* FROM input CROSS JOIN LATERAL (SELECT ` + pgCols + ` FROM toolq_ledger
		WHERE key = input.key AND state <> 'released' OFFSET 0) AS e
), due AS (
	SELECT t.key FROM existing AS e JOIN toolq_ledger AS t ON t.key = e.key
	WHERE e.state IN ('completed', 'failed', 'indeterminate') AND t.state IN ('completed', 'failed', 'indeterminate')
		AND greatest(t.answered_at, t.updated_at) < now() - $14::bigint * interval '1 millisecond'
), answered AS (
	UPDATE toolq_ledger AS t SET answered_at = now() FROM due
	WHERE $15::boolean AND t.key = due.key AND t.state IN ('completed', 'failed', 'indeterminate')
		AND greatest(t.answered_at, t.updated_at) < now() - $14::bigint * interval '1 millisecond'
	RETURNING t.key
), ins AS (
	INSERT INTO toolq_ledger (key, conversation_id, turn_index, tool, ordinal, args_digest, state, attempt, owner,
		lease_until, first_tool_use_id, trace_id, span_id, claim_token, tenant)
	SELECT key, conversation_id, turn_index, tool, ordinal, args_digest, 'in_flight', 1, owner,
		now() + lease_ms * interval '1 millisecond', first_tool_use_id, trace_id, span_id, claim_token, tenant FROM input
		WHERE key NOT IN (SELECT key FROM existing) ORDER BY key COLLATE "C"
	` + claimConflict + `
	RETURNING ` + pgCols + `
)
SELECT true, ins.* FROM ins
UNION ALL
SELECT false, existing.* FROM existing WHERE key NOT IN (SELECT key FROM due) OR key IN (SELECT key FROM answered)`

type postgresDB struct {
	pool *pgxpool.Pool
	// genericPlan is the statement claimRound runs before the claim
	// (genericPlanStatement; a test substitutes one the server refuses).
	genericPlan string
	// noGenericPlan is set once the server has refused genericPlan as a
	// setting it does not know (Postgres before 12, and engines built on
	// it): from then on the claim runs without it. asyncCommit and
	// noAsyncCommit are the same for the claims that ask for
	// Claim.AsyncCommit.
	noGenericPlan atomic.Bool
	asyncCommit   string
	noAsyncCommit atomic.Bool
	settledShare  settledShare // of the recent claims: readSettled first while it is most
	// indexOnly is the setting queryByKey runs before its statement
	// (indexOnlyStatement; a test substitutes one the server refuses), and
	// noIndexOnly is set once the server has refused it.
	indexOnly   string
	noIndexOnly atomic.Bool
}

// OpenPostgres opens a pool on the Postgres database at url. Pool settings
// (pool_max_conns and the like) and TLS (sslmode, sslrootcert, …) come from
// the URL. A connection attempt gives up after 5 s unless the URL says
// otherwise (connect_timeout).
func OpenPostgres(ctx context.Context, url string) (*Store, error) {
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, fmt.Errorf("ledger: database URL %s: %s", redact(url), redact(strings.ReplaceAll(err.Error(), url, redact(url))))
	}
	if cfg.ConnConfig.ConnectTimeout == 0 {
		cfg.ConnConfig.ConnectTimeout = 5 * time.Second
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("ledger: open %s: %s", redact(url), redact(err.Error()))
	}
	return &Store{db: &postgresDB{pool: pool, genericPlan: genericPlanStatement, asyncCommit: asyncCommitStatement, indexOnly: indexOnlyStatement}, backend: "postgres"}, nil
}

func (p *postgresDB) sql() *queries { return postgresQueries }

func (p *postgresDB) ping(ctx context.Context) error { return p.pool.Ping(ctx) }

func (p *postgresDB) close() { p.pool.Close() }

func (p *postgresDB) exec(ctx context.Context, query string, args namedArgs) (int64, error) {
	tag, err := p.pool.Exec(ctx, query, pgArgs(args)...)
	return tag.RowsAffected(), err
}

func (p *postgresDB) queryRows(ctx context.Context, query string, args namedArgs, each func(scanner) error) error {
	return p.query(ctx, query, pgArgs(args), each)
}

// pgArgs are named arguments as pgx takes them (@name in the statement).
func pgArgs(args namedArgs) []any {
	if len(args) == 0 {
		return nil
	}
	return []any{pgx.NamedArgs(args)}
}

// query runs a statement with arguments as pgx takes them.
func (p *postgresDB) query(ctx context.Context, query string, args []any, each func(scanner) error) error {
	rows, err := p.pool.Query(ctx, query, args...)
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		if err := each(rows); err != nil {
			return err
		}
	}
	return rows.Err()
}

func (p *postgresDB) claim(ctx context.Context, claims []Claim, everyMS int64) ([]claimed, error) {
	out := make([]claimed, len(claims))
	async := true
	for i := range claims {
		async = async && claims[i].AsyncCommit
	}
	pending := make([]int, len(claims)) // indexes of claims still without an answer
	for i := range pending {
		pending[i] = i
	}
	settled := 0 // claims answered by a settled row, for readFirst
	defer func() { p.settledShare.note(settled, len(claims)) }()
	// The claim's own transaction waits for the disk (see recordAnswers):
	// it does not ask not to, or the server refused to let it.
	recordable := !async || p.noAsyncCommit.Load()
	if p.settledShare.mostly() {
		var err error
		if pending, err = p.readSettled(ctx, claims, everyMS, out); err != nil {
			return nil, err
		}
		settled = len(claims) - len(pending)
	}
	for round := 0; len(pending) > 0; round++ {
		if round == 10 {
			return nil, errors.New("claim did not settle after 10 rounds of concurrent inserts and deletes")
		}
		n := len(pending)
		keys, convs, tools, digests, tuids, owners, traces, spans, tokens, tenants := make([]string, n), make([]string, n), make([]string, n),
			make([]string, n), make([]string, n), make([]string, n), make([]string, n), make([]string, n), make([]string, n), make([]string, n)
		turns, ordinals, leases := make([]int64, n), make([]int64, n), make([]int64, n)
		at := make(map[string]int, n)
		for j, i := range pending {
			c := &claims[i]
			keys[j], convs[j], turns[j], tools[j], ordinals[j], digests[j] = c.Key, c.ConversationID, c.TurnIndex, c.Tool, c.Ordinal, c.ArgsDigest
			tuids[j], owners[j], traces[j], spans[j], leases[j], tokens[j] = c.ToolUseID, c.Owner, c.TraceID, c.SpanID, c.Lease.Milliseconds(), c.Token
			tenants[j] = c.Tenant
			at[c.Key] = i
		}
		answered := make(map[int]bool, n)
		err := p.claimRound(ctx, async, []any{keys, convs, turns, tools, ordinals, digests, tuids, owners, traces, spans, leases, tokens, tenants, everyMS, recordable},
			func(sc scanner) error {
				var c claimed
				var r Row
				if err := scanRow(sc, &r, &c.inserted); err != nil {
					return err
				}
				c.row = r
				i := at[r.Key]
				out[i] = c
				if !c.inserted && (r.State == Completed || r.State == Failed || r.State == Indeterminate) {
					settled++
				}
				answered[i] = true
				return nil
			})
		if err != nil {
			return nil, err
		}
		var next []int
		for _, i := range pending {
			if !answered[i] {
				next = append(next, i)
			}
		}
		pending = next
		if !recordable && len(pending) > 0 {
			if err := p.recordAnswers(ctx, claims, pending, everyMS); err != nil {
				return nil, err
			}
		}
	}
	return out, nil
}

// recordAnswersPostgres records, for the keys whose settled rows are due
// to record an answer (see answeredEvery), that they answered one.
var recordAnswersPostgres = `UPDATE toolq_ledger SET answered_at = now()
	WHERE key = ANY($1::text[]) AND state IN ('completed', 'failed', 'indeterminate')
		AND greatest(answered_at, updated_at) < now() - $2::bigint * interval '1 millisecond'
	RETURNING key`

// recordAnswers records the due answers of the pending claims' keys in a
// transaction of its own, which commits waiting for the disk, for a claim
// whose own transaction does not (Claim.AsyncCommit): an answer recorded
// there and lost in a crash of Postgres (visible to others before it is on
// disk: another duplicate would be answered from it without recording
// anything) would let a purge count the row's retention from before the
// answer, while the duplicate's job can come back for the whole retention
// after it. A pending key with no settled row due (a row purged
// meanwhile, a key inserted after the claim's snapshot) is left alone; the
// claim reads every pending key again. It costs a round trip at most once
// an hour a row.
func (p *postgresDB) recordAnswers(ctx context.Context, claims []Claim, pending []int, everyMS int64) error {
	keys := make([]string, len(pending))
	for j, i := range pending {
		keys[j] = claims[i].Key
	}
	return p.queryByKey(ctx, recordAnswersPostgres, []any{keys, everyMS}, func(sc scanner) error {
		var key string
		return sc.Scan(&key)
	})
}

// readSettledPostgres reads the rows of a batch's keys that are settled
// (completed, failed, indeterminate) and need not record their answer
// (answeredEvery, $2 in milliseconds): what the claim would answer those
// keys with, by one lookup (see readSettled).
var readSettledPostgres = `SELECT ` + pgCols + ` FROM toolq_ledger
	WHERE key = ANY($1::text[]) AND state IN ('completed', 'failed', 'indeterminate')
		AND greatest(answered_at, updated_at) >= now() - $2::bigint * interval '1 millisecond'`

// readSettled answers, from one read, the claims of the batch whose key
// has a settled row that need not record its answer (into out: see
// answeredEvery), and returns the indexes of the others,
// which the claim statement takes. The claim would answer those keys with
// the same rows: a settled row is only ever changed by an operator's
// resolution or purge, which a claim's snapshot may miss just as well;
// the rows whose answer must be recorded are left to the claim, which
// records it. On a batch of duplicates (a retried turn's, a replay's)
// the read costs Postgres a third of the claim statement, which decodes
// thirteen arrays and plans an insert for keys it does not insert.
func (p *postgresDB) readSettled(ctx context.Context, claims []Claim, everyMS int64, out []claimed) ([]int, error) {
	keys := make([]string, len(claims))
	at := make(map[string]int, len(claims))
	for i := range claims {
		keys[i] = claims[i].Key
		at[claims[i].Key] = i
	}
	found := make([]bool, len(claims))
	err := p.queryByKey(ctx, readSettledPostgres, []any{keys, everyMS}, func(sc scanner) error {
		var r Row
		if err := scanRow(sc, &r); err != nil {
			return err
		}
		i, ok := at[r.Key]
		if !ok {
			return fmt.Errorf("ledger: read a row of key %q, not in the batch", r.Key)
		}
		out[i], found[i] = claimed{row: r}, true
		return nil
	})
	if err != nil {
		return nil, err
	}
	var pending []int
	for i := range claims {
		if !found[i] {
			pending = append(pending, i)
		}
	}
	return pending, nil
}

// settledShare follows what share of the recent claims found their key
// settled (a moving average over claim batches, in thousandths), so that
// the claim reads settled rows first (readSettled) while duplicates are
// most of what comes, and claims at once, in one round trip, while new
// calls are.
type settledShare struct {
	permille atomic.Int64
	pinned   bool // read first whatever the share (tests: export_test.go)
}

// note records a batch of n claims of which settled found a settled row.
func (s *settledShare) note(settled, n int) {
	if n == 0 {
		return
	}
	share := int64(settled * 1000 / n)
	old := s.permille.Load()
	s.permille.Store(old + (share-old)/4) // concurrent batches may lose an update: a moving average all the same
}

// mostly reports whether most recent claims found their key settled.
func (s *settledShare) mostly() bool { return s.pinned || s.permille.Load() > 500 }

// genericPlanStatement makes the statements after it in the same
// transaction run the server's cached generic plan of their prepared
// statement.
const genericPlanStatement = `SELECT set_config('plan_cache_mode', 'force_generic_plan', true)`

// asyncCommitStatement lets the transaction it runs in commit without
// waiting for its WAL to reach the disk (Claim.AsyncCommit).
const asyncCommitStatement = `SELECT set_config('synchronous_commit', 'off', true)`

// claimRound runs claimPostgres once, in one round trip, after the settings
// it runs under (indexOnly among them: a plan cached while the ledger was
// small would join due and answered to the table by scanning it). Left to choose, Postgres plans the claim afresh at every
// execution: a generic plan's estimate for unnest of an array parameter
// (ten rows each) costs more than a custom plan for the actual batch, so it
// never switches. Planning is about 0.16 ms, two thirds of the statement's
// time at a batch of one, and the generic plan is the same one (the lookups
// go by primary key whatever the statistics say: see claimPostgres). So the
// claim goes in a pipeline (one implicit transaction) after genericPlan and,
// for a batch that asks for it, asyncCommit; both hold for that transaction
// only: the pool's other statements keep the defaults. A server that refuses
// a setting (plan_cache_mode is Postgres 12's; an engine built on Postgres
// may not know either) does so before the claim has run: the claim then
// goes without that setting, on this round and every one after it.
func (p *postgresDB) claimRound(ctx context.Context, async bool, args []any, each func(scanner) error) error {
	for {
		var batch pgx.Batch
		var refusals []*atomic.Bool // the flag that remembers a refusal of each setting queued
		if !p.noGenericPlan.Load() {
			batch.Queue(p.genericPlan)
			refusals = append(refusals, &p.noGenericPlan)
		}
		if async && !p.noAsyncCommit.Load() {
			batch.Queue(p.asyncCommit)
			refusals = append(refusals, &p.noAsyncCommit)
		}
		if p.indexOnly != "" && !p.noIndexOnly.Load() { // the joins on key of due and answered
			batch.Queue(p.indexOnly)
			refusals = append(refusals, &p.noIndexOnly)
		}
		if len(refusals) == 0 {
			return p.query(ctx, claimPostgres, args, each)
		}
		batch.Queue(claimPostgres, args...)
		results := p.pool.SendBatch(ctx, &batch)
		refused, err := readAfterSettings(results, len(refusals), each)
		// Closed once, here: it gives the connection back to the pool, and a
		// second Close would still touch that connection's statement cache.
		if cerr := results.Close(); err == nil {
			err = cerr
		}
		if refused < 0 {
			return err
		}
		refusals[refused].Store(true)
	}
}

// readAfterSettings reads the answers of a batch of settings statements
// and then one statement with rows (claimRound's, queryByKey's). refused
// is the index of a setting the server refused as unknown or not settable
// (undefined_object, invalid_parameter_value, feature_not_supported),
// before the statement ran; -1 otherwise.
func readAfterSettings(results pgx.BatchResults, settings int, each func(scanner) error) (refused int, err error) {
	for i := range settings {
		if _, err := results.Exec(); err != nil {
			if isRefusedSetting(err) {
				return i, err
			}
			return -1, err
		}
	}
	rows, err := results.Query()
	if err != nil {
		return -1, err
	}
	defer rows.Close()
	for rows.Next() {
		if err := each(rows); err != nil {
			return -1, err
		}
	}
	rows.Close()
	return -1, rows.Err()
}

// completeBatchPostgres completes a batch of fenced rows in one
// statement: each row whose key, attempt and claim token match and which
// is still in flight (pgFenced's WHERE, row by row) is completed with its
// output, and comes back. A row another attempt holds does not match and
// is never locked. One set-based statement costs Postgres about two thirds
// of what one UPDATE per row in a pipeline did (BenchmarkCompleteBatch).
var completeBatchPostgres = `UPDATE toolq_ledger AS t SET state = 'completed', result = u.result, lease_until = now(), updated_at = now()
	FROM unnest($1::text[], $2::bigint[], $3::text[], $4::text[]) AS u(key, attempt, token, result)
	WHERE t.key = u.key AND t.attempt = u.attempt AND t.claim_token = u.token AND t.state = 'in_flight'
	RETURNING t.key, t.attempt, t.claim_token`

// indexOnlyStatement keeps the statements after it in the same
// transaction off sequential scans: a plan cached while the ledger was
// small (a new deployment's first minutes) would scan the whole table for
// each batch until the next ANALYZE; every lookup here goes by key.
const indexOnlyStatement = `SELECT set_config('enable_seqscan', 'off', true)`

// queryByKey runs a statement that looks rows up by key in a pipeline (one
// implicit transaction, one round trip) after indexOnly.
// A server that refuses the setting as one it does not know (an engine
// built on Postgres), before the statement has run, gets the statement
// without it, then and from then on.
func (p *postgresDB) queryByKey(ctx context.Context, query string, args []any, each func(scanner) error) error {
	if p.noIndexOnly.Load() || p.indexOnly == "" {
		return p.query(ctx, query, args, each)
	}
	var batch pgx.Batch
	batch.Queue(p.indexOnly)
	batch.Queue(query, args...)
	br := p.pool.SendBatch(ctx, &batch)
	refused, err := readAfterSettings(br, 1, each)
	// Closed once: it gives the connection back to the pool.
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	if refused >= 0 {
		p.noIndexOnly.Store(true)
		return p.query(ctx, query, args, each)
	}
	return err
}

// isRefusedSetting reports a setting the server refused as unknown or not
// settable (undefined_object, invalid_parameter_value,
// feature_not_supported).
func isRefusedSetting(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && (pgErr.Code == "42704" || pgErr.Code == "22023" || pgErr.Code == "0A000")
}

// completeBatch completes the batch in one statement and one round trip.
func (p *postgresDB) completeBatch(ctx context.Context, cs []Completion) (map[Fence]bool, error) {
	keys, attempts, tokens, results := make([]string, len(cs)), make([]int64, len(cs)), make([]string, len(cs)), make([]string, len(cs))
	for i, c := range cs {
		keys[i], attempts[i], tokens[i], results[i] = c.Fence.Key, c.Fence.Attempt, c.Fence.Token, string(c.Output)
	}
	done := make(map[Fence]bool, len(cs))
	err := p.queryByKey(ctx, completeBatchPostgres, []any{keys, attempts, tokens, results}, func(sc scanner) error {
		var f Fence
		if err := sc.Scan(&f.Key, &f.Attempt, &f.Token); err != nil {
			return err
		}
		done[f] = true
		return nil
	})
	if err != nil {
		return nil, err
	}
	return done, nil
}

func (p *postgresDB) migrate(ctx context.Context) error {
	tx, err := p.pool.Begin(ctx)
	if err != nil {
		return err
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	// One migrator at a time across every process sharing the database.
	if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(7360291846)`); err != nil {
		return err
	}
	if err := applyMigrations(ctx, "postgres", pgxTx{tx},
		`CREATE TABLE IF NOT EXISTS toolq_schema_migrations (version bigint PRIMARY KEY, name text NOT NULL, applied_at timestamptz NOT NULL DEFAULT now())`,
		`INSERT INTO toolq_schema_migrations (version, name) VALUES ($1, $2)`); err != nil {
		return err
	}
	return tx.Commit(ctx)
}

type pgxTx struct{ tx pgx.Tx }

func (t pgxTx) exec(ctx context.Context, q string, args ...any) error {
	_, err := t.tx.Exec(ctx, q, args...)
	return err
}

func (t pgxTx) versions(ctx context.Context) (map[int64]bool, error) {
	rows, err := t.tx.Query(ctx, `SELECT version FROM toolq_schema_migrations`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	return scanVersions(rows)
}

// describe reads a pgx error: its message, and whether it means the server
// could not be reached, is going away or cannot take writes for now. A
// read-only answer also resets the pool (see below).
func (p *postgresDB) describe(err error) (string, bool) {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		// Outages too, for the caller retries them until they pass: 25006,
		// a primary demoted by a failover that now refuses writes, and a
		// deadlock or serialization conflict that outlasted retryConflicts.
		// Neither applied anything.
		unavailable := strings.HasPrefix(pgErr.Code, "08") || strings.HasPrefix(pgErr.Code, "57P") || pgErr.Code == "53300" ||
			pgErr.Code == "25006" || p.conflicted(err)
		if pgErr.Code == "25006" && p.pool != nil {
			// The pool's connections are sessions on the demoted server (or
			// began read-only): drop them, so that the next ones find the
			// primary and the outage ends when the failover does.
			p.pool.Reset()
		}
		return fmt.Sprintf("%s (SQLSTATE %s)", pgErr.Message, pgErr.Code), unavailable
	}
	return err.Error(), unreachable(err)
}

// conflicted: 40P01 deadlock_detected, 40001 serialization_failure.
func (p *postgresDB) conflicted(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && (pgErr.Code == "40P01" || pgErr.Code == "40001")
}

// unreachable reports errors of the connection rather than of the statement:
// connecting failed, the network failed, or the server went away mid-call.
func unreachable(err error) bool {
	var connectErr *pgconn.ConnectError
	var netErr net.Error
	if tlsRefusal(err) {
		return false // a configuration to fix: waiting changes nothing
	}
	return errors.As(err, &connectErr) || errors.As(err, &netErr) || errors.Is(err, io.EOF) ||
		errors.Is(err, io.ErrUnexpectedEOF) || pgconn.SafeToRetry(err) || pgconn.Timeout(err) ||
		strings.Contains(err.Error(), "conn closed")
}

// tlsRefusal reports a connection refused over TLS: the server refused TLS
// (sslmode=require against a server without it), or one side refused the
// other's certificate.
func tlsRefusal(err error) bool {
	var alert tls.AlertError
	var verify *tls.CertificateVerificationError
	var unknownCA x509.UnknownAuthorityError
	var hostname x509.HostnameError
	msg := err.Error()
	return errors.As(err, &alert) || errors.As(err, &verify) || errors.As(err, &unknownCA) || errors.As(err, &hostname) ||
		strings.Contains(msg, "refused TLS") || strings.Contains(msg, "tls: ") || strings.Contains(msg, "x509: ")
}
