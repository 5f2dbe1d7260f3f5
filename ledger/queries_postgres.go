package ledger

// The statements of the Postgres ledger. Times are timestamptz, measured by
// the server's now() (so clock skew between consumer hosts cannot break a
// lease) and read as Unix milliseconds. A text argument compared with ''
// is cast (@state::text): Postgres cannot infer its type from the literal.

// pgCols are the columns scanRow reads. The lease's remaining time is
// rounded up to the millisecond: rounded to the nearest, a lease with under
// half a millisecond left read as expired while lease_until <= now() (the
// takeover's test) was still false.
const pgCols = `key, conversation_id, turn_index, tool, ordinal, args_digest, state, attempt, owner,
	(extract(epoch from lease_until) * 1000)::bigint,
	greatest(0, ceil(extract(epoch from (lease_until - now())) * 1000)::bigint),
	first_tool_use_id, trace_id, span_id, result, error,
	(extract(epoch from created_at) * 1000)::bigint, (extract(epoch from updated_at) * 1000)::bigint,
	history, failures, claim_token, (extract(epoch from answered_at) * 1000)::bigint,
	approval_status, (extract(epoch from approval_expires_at) * 1000)::bigint, approval, waiters, approval_attempt, tenant`

// pgFenced is the WHERE of a write by the holder of one claim. The attempt
// alone does not name a claim: a claim that Postgres lost in a crash before
// it reached the disk (Claim.AsyncCommit) is made again at the same attempt,
// by another holder, under another token.
const pgFenced = `WHERE key = @key AND attempt = @attempt AND claim_token = @token::text AND state = 'in_flight'`

// pgListFilter is a list's Filter: @state, @tool, @conversation, @tenant, the
// least and greatest age in milliseconds, @older_ms and @newer_ms (0: any),
// @approval, and the approver groups, a JSON array @groups ([]: any). A
// released row is listed only as an approved call not run yet.
const pgListFilter = `(state <> 'released' OR (approval_status = 'approved' AND @approval::text IN ('any', 'decided', 'approved')))
	AND (@state::text = '' OR state = @state::text) AND (@tool::text = '' OR tool = @tool::text)
	AND (@conversation::text = '' OR conversation_id = @conversation::text)
	AND (@tenant::text = '' OR tenant = @tenant::text)
	AND (@older_ms::bigint = 0 OR updated_at < now() - @older_ms::bigint * interval '1 millisecond')
	AND (@newer_ms::bigint = 0 OR updated_at >= now() - @newer_ms::bigint * interval '1 millisecond')
	AND (@approval::text = '' OR approval_status = @approval::text OR (@approval::text = 'any' AND approval_status <> '')
		OR (@approval::text = 'decided' AND approval_status IN ('approved', 'denied', 'expired')))
	AND (@groups::text = '[]' OR (CASE WHEN approval = '' THEN NULL
		ELSE regexp_replace(approval, ` + pgUnreadable + `)::json->>'group' END)
		IN (SELECT jsonb_array_elements_text(@groups::text::jsonb)))`

// pgUnreadable are the arguments of a regexp_replace that makes JSON text
// readable by Postgres whatever it holds: json and jsonb refuse to turn
// \u0000 or a surrogate that is not in a pair into text, and args and
// outputs may hold them. Each \u0000 and surrogate escape becomes \ufffd
// (after an escaped backslash the match makes \\ufffd, a backslash and
// text): the JSON stays valid, its structure and its other strings as
// they were.
const pgUnreadable = `'\\u(0000|[dD][89a-fA-F][0-9a-fA-F]{2})', '\\ufffd', 'g'`

// pgDecidedAt is when the row's approval was decided: the time of the
// approve, deny or expire event of its history (NULL: none).
const pgDecidedAt = `(SELECT max((e->>'at')::timestamptz) FROM json_array_elements(regexp_replace(history, ` + pgUnreadable + `)::json) e
	WHERE e->>'action' IN ('approve', 'deny', 'expire'))`

// pgPurgeable are the rows a purge with cutoff @cutoff_ms (Unix
// milliseconds) deletes: finished, and neither updated nor answered since
// the cutoff (the later of updated_at and answered_at lags the last answer
// by up to answeredEvery, @every_ms, so each is compared with the cutoff
// less that much: two comparisons, so that updated_at's index serves), of tool @only (empty: any) and of none of the tools in the
// JSON array @except.
const pgPurgeable = `state IN ('completed', 'failed', 'released')
	AND updated_at < to_timestamp(@cutoff_ms::bigint / 1000.0) - @every_ms::bigint * interval '1 millisecond'
	AND answered_at < to_timestamp(@cutoff_ms::bigint / 1000.0) - @every_ms::bigint * interval '1 millisecond'
	AND (@only::text = '' OR tool = @only::text)
	AND NOT (tool = ANY (ARRAY(SELECT jsonb_array_elements_text(@except::text::jsonb))))`

// pgAppendEvent is the history (a JSON array, as text) with the JSON object
// @event appended, as text: an output or an error may hold U+0000 (\u0000
// in JSON), which jsonb refuses.
const pgAppendEvent = `(CASE WHEN history = '[]' THEN '[' || @event::text || ']'
	ELSE substr(history, 1, length(history) - 1) || ',' || @event::text || ']' END)`

var postgresQueries = &queries{
	cols: pgCols,

	// A takeover is a compare-and-set on the claim it takes over (@token);
	// the new claim has its own token (@new_token).
	takeover: `UPDATE toolq_ledger SET attempt = attempt + 1, owner = @owner,
		lease_until = now() + @lease_ms::bigint * interval '1 millisecond', claim_token = @new_token::text, error = '', updated_at = now()
		` + pgFenced + ` AND lease_until <= now() RETURNING ` + pgCols,
	extend:   `UPDATE toolq_ledger SET lease_until = now() + @lease_ms::bigint * interval '1 millisecond', updated_at = now() ` + pgFenced,
	failures: `UPDATE toolq_ledger SET failures = @failures ` + pgFenced,
	complete: `UPDATE toolq_ledger SET state = 'completed', result = @result, lease_until = now(), updated_at = now() ` + pgFenced,
	fail:     `UPDATE toolq_ledger SET state = 'failed', error = @error, lease_until = now(), updated_at = now() ` + pgFenced,
	endLease: `UPDATE toolq_ledger SET error = @error, lease_until = now(), updated_at = now() ` + pgFenced,
	indeterminate: `UPDATE toolq_ledger SET state = 'indeterminate', error = @error, lease_until = now(), updated_at = now() ` +
		pgFenced,
	release: `UPDATE toolq_ledger SET state = 'released', result = '', error = '', lease_until = now(), updated_at = now() ` +
		pgFenced,
	answered: `UPDATE toolq_ledger SET answered_at = now()
		WHERE key = @key AND state IN ('completed', 'failed', 'indeterminate')
			AND greatest(answered_at, updated_at) < now() - @every_ms::bigint * interval '1 millisecond'`,

	get:            `SELECT ` + pgCols + ` FROM toolq_ledger WHERE key = @key AND state <> 'released'`,
	getAny:         `SELECT ` + pgCols + ` FROM toolq_ledger WHERE key = @key`,
	approvalStatus: `SELECT approval_status, state = 'awaiting_approval' AND approval_expires_at <= now() FROM toolq_ledger WHERE key = @key`,

	list:           `SELECT ` + pgCols + ` FROM toolq_ledger WHERE ` + pgListFilter + ` ORDER BY updated_at DESC, key LIMIT @limit`,
	listByExpiry:   `SELECT ` + pgCols + ` FROM toolq_ledger WHERE ` + pgListFilter + ` ORDER BY approval_expires_at, key LIMIT @limit`,
	listByDecision: `SELECT ` + pgCols + ` FROM toolq_ledger WHERE ` + pgListFilter + ` ORDER BY ` + pgDecidedAt + ` DESC NULLS LAST, key LIMIT @limit`,
	listStale: `SELECT ` + pgCols + ` FROM toolq_ledger WHERE state = 'in_flight' AND lease_until <= now() AND ` + pgListFilter + `
		ORDER BY lease_until, key LIMIT @limit`,
	listTotal:      `SELECT count(*) FROM toolq_ledger WHERE ` + pgListFilter,
	listStaleTotal: `SELECT count(*) FROM toolq_ledger WHERE state = 'in_flight' AND lease_until <= now() AND ` + pgListFilter,
	counts: `SELECT state, count(*) FROM toolq_ledger WHERE state <> 'released' GROUP BY state
		UNION ALL SELECT 'stale', count(*) FROM toolq_ledger WHERE state = 'in_flight' AND lease_until <= now()`,
	oldestInFlight: `SELECT ` + pgCols + ` FROM toolq_ledger WHERE state = 'in_flight' ORDER BY lease_until, key LIMIT 1`,
	clock:          `SELECT (extract(epoch from now()) * 1000)::bigint`,

	resolveNotRun: `UPDATE toolq_ledger SET state = 'released', result = '', error = '', lease_until = now(), updated_at = now(),
		history = ` + pgAppendEvent + ` WHERE key = @key AND state = 'indeterminate' AND attempt = @attempt`,
	resolveCompleted: `UPDATE toolq_ledger SET state = 'completed', result = @result, updated_at = now(),
		history = ` + pgAppendEvent + ` WHERE key = @key AND state = 'indeterminate' AND attempt = @attempt`,

	awaitApproval: `UPDATE toolq_ledger SET state = 'awaiting_approval', approval_status = 'awaiting', approval = @approval,
		approval_expires_at = now() + @ttl_ms::bigint * interval '1 millisecond', waiters = @waiters, lease_until = now(), updated_at = now()
		` + pgFenced + ` RETURNING ` + pgCols,
	addWaiter: `UPDATE toolq_ledger SET waiters = CASE WHEN waiters::jsonb ? @id::text THEN waiters
		ELSE (waiters::jsonb || jsonb_build_array(@id::text))::text END
		WHERE key = @key AND state = 'awaiting_approval' RETURNING ` + pgCols,
	approve: `UPDATE toolq_ledger SET state = 'released', approval_status = 'approved', approval_attempt = attempt, lease_until = now(), updated_at = now(),
		history = ` + pgAppendEvent + ` WHERE key = @key AND state = 'awaiting_approval' AND approval_expires_at > now() RETURNING ` + pgCols,
	deny: `UPDATE toolq_ledger SET state = 'failed', approval_status = 'denied', error = @error, lease_until = now(), updated_at = now(),
		history = ` + pgAppendEvent + ` WHERE key = @key AND state = 'awaiting_approval' AND approval_expires_at > now() RETURNING ` + pgCols,
	expire: `UPDATE toolq_ledger SET state = 'failed', approval_status = 'expired', error = @error, lease_until = now(), updated_at = now(),
		history = ` + pgAppendEvent + ` WHERE key IN (SELECT key FROM toolq_ledger WHERE waiters <> '[]' AND state = 'awaiting_approval'
			AND approval_expires_at <= now() ORDER BY approval_expires_at LIMIT @limit)
		AND state = 'awaiting_approval' AND approval_expires_at <= now() RETURNING ` + pgCols,
	unanswered: `SELECT ` + pgCols + ` FROM toolq_ledger WHERE waiters <> '[]'
		AND state IN ('completed', 'failed', 'indeterminate', 'released') AND NOT (state = 'released' AND attempt > approval_attempt)
		AND updated_at <= now() - @older_ms::bigint * interval '1 millisecond' AND key > @after ORDER BY key LIMIT @limit`,
	waitersAnswered: `UPDATE toolq_ledger SET waiters = '[]' WHERE key = @key AND state IN ('completed', 'failed', 'indeterminate')`,
	failApproved: `UPDATE toolq_ledger SET state = 'failed', error = @error, updated_at = now()
		WHERE key = @key AND state = 'released' AND approval_status = 'approved' RETURNING ` + pgCols,
	approvalPublished: `UPDATE toolq_ledger SET approval = @approval WHERE key = @key AND state = 'awaiting_approval'`,

	// The outer WHERE repeats pgPurgeable: a row changed after the
	// DELETE's snapshot (claimed again, or an answer recorded) is checked
	// again as it is now, which the subquery's condition alone is not.
	purge: `DELETE FROM toolq_ledger WHERE key IN (SELECT key FROM toolq_ledger WHERE ` + pgPurgeable + ` LIMIT @batch)
		AND ` + pgPurgeable,
	purgeCount: `SELECT count(*) FROM toolq_ledger WHERE ` + pgPurgeable,
	// The record keeps the latest cutoff of any purge: one with a longer
	// retention after one with a shorter does not hide what the shorter one
	// deleted.
	recordPurge: `INSERT INTO toolq_purge (id, purged_before, older_than_ms, purged_at)
		VALUES (1, to_timestamp(@cutoff_ms::bigint / 1000.0), @older_than_ms, to_timestamp(@purged_at_ms::bigint / 1000.0))
		ON CONFLICT (id) DO UPDATE SET older_than_ms = excluded.older_than_ms, purged_at = excluded.purged_at,
		purged_before = CASE WHEN excluded.purged_before > toolq_purge.purged_before
			THEN excluded.purged_before ELSE toolq_purge.purged_before END`,
	lastPurge: `SELECT (extract(epoch from purged_before) * 1000)::bigint, older_than_ms, (extract(epoch from purged_at) * 1000)::bigint
		FROM toolq_purge WHERE id = 1`,
}
