package ledger

import "strings"

// dialect holds the statements of one backend. They are written once, below,
// with placeholders for what differs: {now} (the database clock in Unix
// milliseconds on SQLite, now() on Postgres), {ms:X} (a time column as Unix
// milliseconds), {plus:$N} and {minus:$N} (now plus or minus $N milliseconds),
// {text:$N} (a text parameter Postgres must be told the type of) and {cols}
// (the columns scanRow reads).
type dialect struct {
	takeover, extend, complete, fail, endLease, indeterminate, release   string
	get, list, listStale, counts, resolveNotRun, resolveCompleted, purge string
	cols                                                                 string
}

const columnsTemplate = `key, conversation_id, turn_index, tool, ordinal, args_digest, state, attempt, owner,
	{ms:lease_until}, {remaining}, first_tool_use_id, trace_id, span_id, result, error,
	{ms:created_at}, {ms:updated_at}`

const fence = `WHERE key = $1 AND attempt = $2 AND state = 'in_flight'`

func newDialect(expand func(string) string) *dialect {
	d := &dialect{
		takeover: `UPDATE toolq_ledger SET attempt = attempt + 1, owner = $3, lease_until = {plus:$4}, updated_at = {now}
			WHERE key = $1 AND attempt = $2 AND state = 'in_flight' AND lease_until <= {now} RETURNING {cols}`,
		extend:        `UPDATE toolq_ledger SET lease_until = {plus:$3}, updated_at = {now} ` + fence,
		complete:      `UPDATE toolq_ledger SET state = 'completed', result = $3, lease_until = {now}, updated_at = {now} ` + fence,
		fail:          `UPDATE toolq_ledger SET state = 'failed', error = $3, lease_until = {now}, updated_at = {now} ` + fence,
		endLease:      `UPDATE toolq_ledger SET error = $3, lease_until = {now}, updated_at = {now} ` + fence,
		indeterminate: `UPDATE toolq_ledger SET state = 'indeterminate', error = $3, lease_until = {now}, updated_at = {now} ` + fence,
		release:       `DELETE FROM toolq_ledger ` + fence,
		get:           `SELECT {cols} FROM toolq_ledger WHERE key = $1`,
		list: `SELECT {cols} FROM toolq_ledger WHERE ({text:$1} = '' OR state = {text:$1})
			ORDER BY updated_at DESC, key LIMIT $2`,
		listStale: `SELECT {cols} FROM toolq_ledger WHERE state = 'in_flight' AND lease_until <= {now}
			ORDER BY lease_until, key LIMIT $1`,
		counts: `SELECT state, count(*) FROM toolq_ledger GROUP BY state
			UNION ALL SELECT 'stale', count(*) FROM toolq_ledger WHERE state = 'in_flight' AND lease_until <= {now}`,
		resolveNotRun:    `DELETE FROM toolq_ledger WHERE key = $1 AND state = 'indeterminate'`,
		resolveCompleted: `UPDATE toolq_ledger SET state = 'completed', result = $2, updated_at = {now} WHERE key = $1 AND state = 'indeterminate'`,
		purge: `DELETE FROM toolq_ledger WHERE key IN (SELECT key FROM toolq_ledger
			WHERE state IN ('completed', 'failed') AND updated_at < {minus:$1} LIMIT $2)`,
		cols: columnsTemplate,
	}
	for _, s := range []*string{&d.takeover, &d.extend, &d.complete, &d.fail, &d.endLease, &d.indeterminate, &d.release,
		&d.get, &d.list, &d.listStale, &d.counts, &d.resolveNotRun, &d.resolveCompleted, &d.purge, &d.cols} {
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
