package ledger

import (
	"strconv"
	"strings"
)

// dialect holds the statements of one backend. They are written once, below,
// with placeholders for what differs: {now} (the database clock in Unix
// milliseconds on SQLite, now() on Postgres), {ms:X} (a time column as Unix
// milliseconds), {at:$N} (the time $N Unix milliseconds, for a time column),
// {nowms} (the database clock in Unix milliseconds), {plus:$N} and {minus:$N}
// (now plus or minus $N milliseconds),
// {text:$N} (a text parameter Postgres must be told the type of) and {cols}
// (the columns scanRow reads).
type dialect struct {
	takeover, extend, complete, fail, endLease, indeterminate, release   string
	failures                                                             string
	get, list, listStale, counts, resolveNotRun, resolveCompleted, purge string
	clock, purgeCount, recordPurge, lastPurge, getAny, oldestInFlight    string
	answered                                                             string
	cols                                                                 string
}

const columnsTemplate = `key, conversation_id, turn_index, tool, ordinal, args_digest, state, attempt, owner,
	{ms:lease_until}, {remaining}, first_tool_use_id, trace_id, span_id, result, error,
	{ms:created_at}, {ms:updated_at}, history, failures, claim_token, {ms:answered_at}`

// fence is the WHERE of a write by the holder of one claim: $1 the key, $2
// the attempt and $n the claim's token. The attempt alone does not name a
// claim: a claim that Postgres lost in a crash before it reached the disk
// (Claim.AsyncCommit) is made again at the same attempt, by another holder.
func fence(n int) string {
	return `WHERE key = $1 AND attempt = $2 AND claim_token = {text:$` + strconv.Itoa(n) + `} AND state = 'in_flight'`
}

// A released row is a claim given up: to every reader the key is free, as
// if the row were not there, but it keeps its attempt so that the next claim
// takes the one after it, and no fence of a key is ever issued twice.
const (
	released   = `'released'`
	notRelease = `state <> 'released'`
)

// claimConflict is the upsert of a claim whose key has a row: a released row
// is claimed again at its next attempt, any other is left alone (the claim
// then reads it).
const claimConflict = `ON CONFLICT (key) DO UPDATE SET conversation_id = excluded.conversation_id,
	turn_index = excluded.turn_index, tool = excluded.tool, ordinal = excluded.ordinal, args_digest = excluded.args_digest,
	state = 'in_flight', attempt = toolq_ledger.attempt + 1, owner = excluded.owner, lease_until = excluded.lease_until,
	first_tool_use_id = excluded.first_tool_use_id, trace_id = excluded.trace_id, span_id = excluded.span_id,
	claim_token = excluded.claim_token, result = '', error = '', updated_at = excluded.updated_at
	WHERE toolq_ledger.state = 'released'`

// listFilter is the Filter of a list: $1 state, $3 tool, $4 conversation,
// $5 and $6 the least and the greatest age in milliseconds (0: any).
const listFilter = `({text:$1} = '' OR state = {text:$1}) AND ({text:$3} = '' OR tool = {text:$3})
	AND ({text:$4} = '' OR conversation_id = {text:$4})
	AND (CAST($5 AS BIGINT) = 0 OR updated_at < {minus:$5}) AND (CAST($6 AS BIGINT) = 0 OR updated_at >= {minus:$6})`

// purgeable are the rows a purge with cutoff $1 (Unix milliseconds) deletes:
// finished before it, and answered no duplicate since. answered_at lags the
// last answer by up to answeredEvery (see staleAnswer), so it is compared
// with the cutoff less that much.
var purgeable = `state IN ('completed', 'failed', ` + released + `) AND updated_at < {at:$1}
	AND answered_at < {at:(CAST($1 AS BIGINT) - ` + strconv.FormatInt(answeredEvery.Milliseconds(), 10) + `)}`

// settled are the states a claim answers from: a claim that finds its row
// in one of them answers a duplicate.
const settled = `('completed', 'failed', 'indeterminate')`

// staleAnswer is the time before which a row's answered_at is rewritten
// when a duplicate is answered from it (see answeredEvery), so that a key
// answered again and again costs one write an hour, not one a duplicate.
var staleAnswer = `{minus:` + strconv.FormatInt(answeredEvery.Milliseconds(), 10) + `}`

// toolFilter keeps the rows of tool only (parameter only; empty: every
// tool) and not of any tool in the JSON array of strings except.
func toolFilter(only, except string) string {
	return `({text:` + only + `} = '' OR tool = {text:` + only + `}) AND NOT {intools:` + except + `}`
}

// appendHistory is the history column (a JSON array, as text) with the JSON
// object in parameter ev appended, written as text on both backends: an
// output or an error message may hold U+0000 (\u0000 in JSON), which
// Postgres's jsonb refuses and text keeps, so a resolution goes through
// no JSON type of the database.
func appendHistory(ev string) string {
	return `(CASE WHEN history = '[]' THEN '[' || {text:` + ev + `} || ']'
		ELSE substr(history, 1, length(history) - 1) || ',' || {text:` + ev + `} || ']' END)`
}

func newDialect(expand func(string) string) *dialect {
	d := &dialect{
		// A takeover is a compare-and-set on the claim it takes over
		// ($5 its token); the new claim has its own token ($6).
		takeover: `UPDATE toolq_ledger SET attempt = attempt + 1, owner = $3, lease_until = {plus:$4}, claim_token = {text:$6}, error = '',
			updated_at = {now} ` + fence(5) + ` AND lease_until <= {now} RETURNING {cols}`,
		extend:        `UPDATE toolq_ledger SET lease_until = {plus:$3}, updated_at = {now} ` + fence(4),
		failures:      `UPDATE toolq_ledger SET failures = $3 ` + fence(4),
		complete:      `UPDATE toolq_ledger SET state = 'completed', result = $3, lease_until = {now}, updated_at = {now} ` + fence(4),
		fail:          `UPDATE toolq_ledger SET state = 'failed', error = $3, lease_until = {now}, updated_at = {now} ` + fence(4),
		endLease:      `UPDATE toolq_ledger SET error = $3, lease_until = {now}, updated_at = {now} ` + fence(4),
		indeterminate: `UPDATE toolq_ledger SET state = 'indeterminate', error = $3, lease_until = {now}, updated_at = {now} ` + fence(4),
		release: `UPDATE toolq_ledger SET state = ` + released + `, result = '', error = '', lease_until = {now}, updated_at = {now} ` +
			fence(3),
		get: `SELECT {cols} FROM toolq_ledger WHERE key = $1 AND ` + notRelease,
		list: `SELECT {cols} FROM toolq_ledger WHERE ` + notRelease + ` AND ` + listFilter + `
			ORDER BY updated_at DESC, key LIMIT $2`,
		listStale: `SELECT {cols} FROM toolq_ledger WHERE state = 'in_flight' AND lease_until <= {now} AND ` + listFilter + `
			ORDER BY lease_until, key LIMIT $2`,
		counts: `SELECT state, count(*) FROM toolq_ledger WHERE ` + notRelease + ` GROUP BY state
			UNION ALL SELECT 'stale', count(*) FROM toolq_ledger WHERE state = 'in_flight' AND lease_until <= {now}`,
		getAny:         `SELECT {cols} FROM toolq_ledger WHERE key = $1`,
		oldestInFlight: `SELECT {cols} FROM toolq_ledger WHERE state = 'in_flight' ORDER BY lease_until, key LIMIT 1`,
		// A resolution appends its event ($2, a JSON object) to the row's
		// history in the statement that settles it.
		resolveNotRun: `UPDATE toolq_ledger SET state = ` + released + `, result = '', error = '', lease_until = {now}, updated_at = {now},
			history = ` + appendHistory("$2") + ` WHERE key = $1 AND state = 'indeterminate'`,
		resolveCompleted: `UPDATE toolq_ledger SET state = 'completed', result = $3, updated_at = {now}, history = ` + appendHistory("$2") + `
			WHERE key = $1 AND state = 'indeterminate'`,
		purge: `DELETE FROM toolq_ledger WHERE key IN (SELECT key FROM toolq_ledger
			WHERE ` + purgeable + ` AND ` + toolFilter("$3", "$4") + ` LIMIT $2)`,
		answered:   `UPDATE toolq_ledger SET answered_at = {now} WHERE key = $1 AND state IN ` + settled + ` AND answered_at < ` + staleAnswer,
		clock:      `SELECT {nowms}`,
		purgeCount: `SELECT count(*) FROM toolq_ledger WHERE ` + purgeable + ` AND ` + toolFilter("$2", "$3"),
		// The record keeps the latest cutoff of any purge: one with a longer
		// retention after one with a shorter does not hide what the
		// shorter one deleted.
		recordPurge: `INSERT INTO toolq_purge (id, purged_before, older_than_ms, purged_at) VALUES (1, {at:$1}, $2, {at:$3})
			ON CONFLICT (id) DO UPDATE SET older_than_ms = excluded.older_than_ms, purged_at = excluded.purged_at,
			purged_before = CASE WHEN excluded.purged_before > toolq_purge.purged_before
				THEN excluded.purged_before ELSE toolq_purge.purged_before END`,
		lastPurge: `SELECT {ms:purged_before}, older_than_ms, {ms:purged_at} FROM toolq_purge WHERE id = 1`,
		cols:      columnsTemplate,
	}
	for _, s := range []*string{&d.takeover, &d.extend, &d.failures, &d.complete, &d.fail, &d.endLease, &d.indeterminate, &d.release,
		&d.get, &d.list, &d.listStale, &d.counts, &d.resolveNotRun, &d.resolveCompleted, &d.purge,
		&d.clock, &d.answered, &d.purgeCount, &d.recordPurge, &d.lastPurge, &d.getAny, &d.oldestInFlight, &d.cols} {
		*s = expand(strings.ReplaceAll(*s, "{cols}", columnsTemplate))
	}
	return d
}

// expandWith replaces each {name:arg} or {name} placeholder by f(name, arg).
func expandWith(f func(name, arg string) string) func(string) string {
	return func(s string) string {
		var b strings.Builder
		for {
			i := strings.IndexByte(s, '{')
			if i < 0 {
				b.WriteString(s)
				return b.String()
			}
			j := strings.IndexByte(s[i:], '}')
			b.WriteString(s[:i])
			name, arg, _ := strings.Cut(s[i+1:i+j], ":")
			b.WriteString(f(name, arg))
			s = s[i+j+1:]
		}
	}
}
