package ledger

// queries are the statements of one backend, written out in full for it
// (postgresQueries, sqliteQueries) with named arguments: @key, @attempt and
// @token name a claim (see fencedWhere), the others are named after what
// they carry. The two backends store times differently (Postgres as
// timestamptz by its own clock, SQLite as Unix milliseconds by the host's)
// and both read them as Unix milliseconds (cols).
type queries struct {
	cols string // the columns scanRow reads, in its order

	// The holder's writes, each fenced by its claim.
	takeover, extend, failures, complete, fail, endLease, indeterminate, release string
	// A settled row answered a call outside a claim (Store.Answered).
	answered string

	// Reads. A list is in one order per statement (Filter.Order), and
	// its total counts what it selects, the limit aside.
	get, getAny, list, listByExpiry, listByDecision, listStale, listTotal, listStaleTotal, counts, oldestInFlight, clock string

	// An operator's resolution, which appends its event to the history.
	resolveNotRun, resolveCompleted string

	// Approvals (approval.go).
	awaitApproval, addWaiter, approve, deny, expire, unanswered, waitersAnswered, approvalPublished, failApproved string
	// approvalStatus is a row's approval status and whether it awaits past
	// its expiry, by the clock approve and expire read.
	approvalStatus string

	// Retention.
	purge, purgeCount, recordPurge, lastPurge string
}

// namedArgs are the arguments of a statement, by name (@name in its text).
type namedArgs map[string]any

// fenceArgs are the arguments that name the claim f, with more.
func fenceArgs(f Fence, more namedArgs) namedArgs {
	a := namedArgs{"key": f.Key, "attempt": f.Attempt, "token": f.Token}
	for k, v := range more {
		a[k] = v
	}
	return a
}

// The claim's upsert when its key has a row, the same on both backends: a
// released row is claimed again at its next attempt, any other is left
// alone (the claim then reads it). A released row is a claim given up: to
// every reader the key is free, as if the row were not there, but it keeps
// its attempt so that the next claim takes the one after it, and no fence
// of a key is ever issued twice.
const claimConflict = `ON CONFLICT (key) DO UPDATE SET conversation_id = excluded.conversation_id,
	turn_index = excluded.turn_index, tool = excluded.tool, ordinal = excluded.ordinal, args_digest = excluded.args_digest,
	state = 'in_flight', attempt = toolq_ledger.attempt + 1, owner = excluded.owner, lease_until = excluded.lease_until,
	first_tool_use_id = excluded.first_tool_use_id, trace_id = excluded.trace_id, span_id = excluded.span_id,
	claim_token = excluded.claim_token, result = '', error = '', updated_at = excluded.updated_at
	WHERE toolq_ledger.state = 'released'`
