package ledger

// The statements of the SQLite ledger. Times are Unix milliseconds of the
// host's clock (sqliteNow): SQLite runs in the consumer's process, so there
// is one clock per host, as there is one host.

// sqliteNow is the database's clock in Unix milliseconds.
const sqliteNow = "CAST(unixepoch('subsec') * 1000 AS INTEGER)"

// sqliteCols are the columns scanRow reads.
const sqliteCols = `key, conversation_id, turn_index, tool, ordinal, args_digest, state, attempt, owner,
	lease_until, max(0, lease_until - ` + sqliteNow + `), first_tool_use_id, trace_id, span_id, result, error,
	created_at, updated_at, history, failures, claim_token, answered_at,
	approval_status, approval_expires_at, approval, waiters, approval_attempt, tenant`

// sqliteFenced is the WHERE of a write by the holder of one claim (see
// pgFenced).
const sqliteFenced = `WHERE key = @key AND attempt = @attempt AND claim_token = @token AND state = 'in_flight'`

// sqliteListFilter is a list's Filter (see pgListFilter).
const sqliteListFilter = `(state <> 'released' OR (approval_status = 'approved' AND @approval IN ('any', 'decided', 'approved')))
	AND (@state = '' OR state = @state) AND (@tool = '' OR tool = @tool)
	AND (@conversation = '' OR conversation_id = @conversation)
	AND (@tenant = '' OR tenant = @tenant)
	AND (@older_ms = 0 OR updated_at < ` + sqliteNow + ` - @older_ms)
	AND (@newer_ms = 0 OR updated_at >= ` + sqliteNow + ` - @newer_ms)
	AND (@approval = '' OR approval_status = @approval OR (@approval = 'any' AND approval_status <> '')
		OR (@approval = 'decided' AND approval_status IN ('approved', 'denied', 'expired')))
	AND (@groups = '[]' OR (CASE WHEN approval = '' THEN NULL ELSE json_extract(approval, '$.group') END)
		IN (SELECT value FROM json_each(@groups)))`

// sqliteDecidedAt is when the row's approval was decided (see
// pgDecidedAt), in Unix seconds.
const sqliteDecidedAt = `(SELECT max(unixepoch(json_extract(e.value, '$.at'), 'subsec')) FROM json_each(history) e
	WHERE json_extract(e.value, '$.action') IN ('approve', 'deny', 'expire'))`

// sqlitePurgeable are the rows a purge deletes (see pgPurgeable).
const sqlitePurgeable = `state IN ('completed', 'failed', 'released')
	AND updated_at < @cutoff_ms - @every_ms AND answered_at < @cutoff_ms - @every_ms
	AND (@only = '' OR tool = @only)
	AND NOT (tool IN (SELECT value FROM json_each(@except)))`

// sqliteAppendEvent is the history with the JSON object @event appended
// (see pgAppendEvent).
const sqliteAppendEvent = `(CASE WHEN history = '[]' THEN '[' || @event || ']'
	ELSE substr(history, 1, length(history) - 1) || ',' || @event || ']' END)`

var sqliteQueries = &queries{
	cols: sqliteCols,

	takeover: `UPDATE toolq_ledger SET attempt = attempt + 1, owner = @owner, lease_until = ` + sqliteNow + ` + @lease_ms,
		claim_token = @new_token, error = '', updated_at = ` + sqliteNow + `
		` + sqliteFenced + ` AND lease_until <= ` + sqliteNow + ` RETURNING ` + sqliteCols,
	extend:   `UPDATE toolq_ledger SET lease_until = ` + sqliteNow + ` + @lease_ms, updated_at = ` + sqliteNow + ` ` + sqliteFenced,
	failures: `UPDATE toolq_ledger SET failures = @failures ` + sqliteFenced,
	complete: `UPDATE toolq_ledger SET state = 'completed', result = @result, lease_until = ` + sqliteNow + `,
		updated_at = ` + sqliteNow + ` ` + sqliteFenced,
	fail: `UPDATE toolq_ledger SET state = 'failed', error = @error, lease_until = ` + sqliteNow + `,
		updated_at = ` + sqliteNow + ` ` + sqliteFenced,
	endLease: `UPDATE toolq_ledger SET error = @error, lease_until = ` + sqliteNow + `, updated_at = ` + sqliteNow + ` ` + sqliteFenced,
	indeterminate: `UPDATE toolq_ledger SET state = 'indeterminate', error = @error, lease_until = ` + sqliteNow + `,
		updated_at = ` + sqliteNow + ` ` + sqliteFenced,
	release: `UPDATE toolq_ledger SET state = 'released', result = '', error = '', lease_until = ` + sqliteNow + `,
		updated_at = ` + sqliteNow + ` ` + sqliteFenced,
	answered: `UPDATE toolq_ledger SET answered_at = ` + sqliteNow + `
		WHERE key = @key AND state IN ('completed', 'failed', 'indeterminate') AND max(answered_at, updated_at) < ` + sqliteNow + ` - @every_ms`,

	get:            `SELECT ` + sqliteCols + ` FROM toolq_ledger WHERE key = @key AND state <> 'released'`,
	getAny:         `SELECT ` + sqliteCols + ` FROM toolq_ledger WHERE key = @key`,
	approvalStatus: `SELECT approval_status, state = 'awaiting_approval' AND approval_expires_at <= ` + sqliteNow + ` FROM toolq_ledger WHERE key = @key`,

	list:         `SELECT ` + sqliteCols + ` FROM toolq_ledger WHERE ` + sqliteListFilter + ` ORDER BY updated_at DESC, key LIMIT @limit`,
	listByExpiry: `SELECT ` + sqliteCols + ` FROM toolq_ledger WHERE ` + sqliteListFilter + ` ORDER BY approval_expires_at, key LIMIT @limit`,
	listByDecision: `SELECT ` + sqliteCols + ` FROM toolq_ledger WHERE ` + sqliteListFilter + `
		ORDER BY ` + sqliteDecidedAt + ` DESC NULLS LAST, key LIMIT @limit`,
	listStale: `SELECT ` + sqliteCols + ` FROM toolq_ledger WHERE state = 'in_flight' AND lease_until <= ` + sqliteNow + `
		AND ` + sqliteListFilter + ` ORDER BY lease_until, key LIMIT @limit`,
	listTotal: `SELECT count(*) FROM toolq_ledger WHERE ` + sqliteListFilter,
	listStaleTotal: `SELECT count(*) FROM toolq_ledger WHERE state = 'in_flight' AND lease_until <= ` + sqliteNow + `
		AND ` + sqliteListFilter,
	counts: `SELECT state, count(*) FROM toolq_ledger WHERE state <> 'released' GROUP BY state
		UNION ALL SELECT 'stale', count(*) FROM toolq_ledger WHERE state = 'in_flight' AND lease_until <= ` + sqliteNow,
	oldestInFlight: `SELECT ` + sqliteCols + ` FROM toolq_ledger WHERE state = 'in_flight' ORDER BY lease_until, key LIMIT 1`,
	clock:          `SELECT ` + sqliteNow,

	resolveNotRun: `UPDATE toolq_ledger SET state = 'released', result = '', error = '', lease_until = ` + sqliteNow + `,
		updated_at = ` + sqliteNow + `, history = ` + sqliteAppendEvent + ` WHERE key = @key AND state = 'indeterminate' AND attempt = @attempt`,
	resolveCompleted: `UPDATE toolq_ledger SET state = 'completed', result = @result, updated_at = ` + sqliteNow + `,
		history = ` + sqliteAppendEvent + ` WHERE key = @key AND state = 'indeterminate' AND attempt = @attempt`,

	awaitApproval: `UPDATE toolq_ledger SET state = 'awaiting_approval', approval_status = 'awaiting', approval = @approval,
		approval_expires_at = ` + sqliteNow + ` + @ttl_ms, waiters = @waiters, lease_until = ` + sqliteNow + `,
		updated_at = ` + sqliteNow + ` ` + sqliteFenced + ` RETURNING ` + sqliteCols,
	addWaiter: `UPDATE toolq_ledger SET waiters = CASE WHEN EXISTS (SELECT 1 FROM json_each(toolq_ledger.waiters) WHERE value = @id)
		THEN waiters ELSE json_insert(waiters, '$[#]', @id) END
		WHERE key = @key AND state = 'awaiting_approval' RETURNING ` + sqliteCols,
	approve: `UPDATE toolq_ledger SET state = 'released', approval_status = 'approved', approval_attempt = attempt, lease_until = ` + sqliteNow + `,
		updated_at = ` + sqliteNow + `, history = ` + sqliteAppendEvent + `
		WHERE key = @key AND state = 'awaiting_approval' AND approval_expires_at > ` + sqliteNow + ` RETURNING ` + sqliteCols,
	deny: `UPDATE toolq_ledger SET state = 'failed', approval_status = 'denied', error = @error, lease_until = ` + sqliteNow + `,
		updated_at = ` + sqliteNow + `, history = ` + sqliteAppendEvent + `
		WHERE key = @key AND state = 'awaiting_approval' AND approval_expires_at > ` + sqliteNow + ` RETURNING ` + sqliteCols,
	expire: `UPDATE toolq_ledger SET state = 'failed', approval_status = 'expired', error = @error, lease_until = ` + sqliteNow + `,
		updated_at = ` + sqliteNow + `, history = ` + sqliteAppendEvent + `
		WHERE key IN (SELECT key FROM toolq_ledger WHERE waiters <> '[]' AND state = 'awaiting_approval'
			AND approval_expires_at <= ` + sqliteNow + ` ORDER BY approval_expires_at LIMIT @limit)
		AND state = 'awaiting_approval' AND approval_expires_at <= ` + sqliteNow + ` RETURNING ` + sqliteCols,
	unanswered: `SELECT ` + sqliteCols + ` FROM toolq_ledger WHERE waiters <> '[]'
		AND state IN ('completed', 'failed', 'indeterminate', 'released') AND NOT (state = 'released' AND attempt > approval_attempt)
		AND updated_at <= ` + sqliteNow + ` - @older_ms AND key > @after ORDER BY key LIMIT @limit`,
	waitersAnswered: `UPDATE toolq_ledger SET waiters = '[]' WHERE key = @key AND state IN ('completed', 'failed', 'indeterminate')`,
	failApproved: `UPDATE toolq_ledger SET state = 'failed', error = @error, updated_at = ` + sqliteNow + `
		WHERE key = @key AND state = 'released' AND approval_status = 'approved' RETURNING ` + sqliteCols,
	approvalPublished: `UPDATE toolq_ledger SET approval = @approval WHERE key = @key AND state = 'awaiting_approval'`,

	purge:      `DELETE FROM toolq_ledger WHERE key IN (SELECT key FROM toolq_ledger WHERE ` + sqlitePurgeable + ` LIMIT @batch)`,
	purgeCount: `SELECT count(*) FROM toolq_ledger WHERE ` + sqlitePurgeable,
	recordPurge: `INSERT INTO toolq_purge (id, purged_before, older_than_ms, purged_at) VALUES (1, @cutoff_ms, @older_than_ms, @purged_at_ms)
		ON CONFLICT (id) DO UPDATE SET older_than_ms = excluded.older_than_ms, purged_at = excluded.purged_at,
		purged_before = CASE WHEN excluded.purged_before > toolq_purge.purged_before
			THEN excluded.purged_before ELSE toolq_purge.purged_before END`,
	lastPurge: `SELECT purged_before, older_than_ms, purged_at FROM toolq_purge WHERE id = 1`,
}
