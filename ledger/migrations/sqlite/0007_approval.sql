-- Approvals (see the Postgres migration of the same number). SQLite cannot
-- change a CHECK constraint in place: the table is copied into one that
-- allows the new state, with the new columns. approval_expires_at is Unix
-- milliseconds. Existing rows are unchanged.
CREATE TABLE toolq_ledger_0007 (
    key                 TEXT    PRIMARY KEY,
    conversation_id     TEXT    NOT NULL,
    turn_index          INTEGER NOT NULL,
    tool                TEXT    NOT NULL,
    ordinal             INTEGER NOT NULL,
    args_digest         TEXT    NOT NULL,
    state               TEXT    NOT NULL CHECK (state IN ('in_flight', 'completed', 'failed', 'indeterminate', 'released', 'awaiting_approval')),
    attempt             INTEGER NOT NULL,
    owner               TEXT    NOT NULL,
    lease_until         INTEGER NOT NULL,
    first_tool_use_id   TEXT    NOT NULL,
    trace_id            TEXT    NOT NULL DEFAULT '',
    span_id             TEXT    NOT NULL DEFAULT '',
    result              TEXT    NOT NULL DEFAULT '',
    error               TEXT    NOT NULL DEFAULT '',
    created_at          INTEGER NOT NULL,
    updated_at          INTEGER NOT NULL,
    history             TEXT    NOT NULL DEFAULT '[]',
    failures            INTEGER NOT NULL DEFAULT 0,
    claim_token         TEXT    NOT NULL DEFAULT '',
    answered_at         INTEGER NOT NULL DEFAULT 0,
    approval_status     TEXT    NOT NULL DEFAULT '',
    approval_expires_at INTEGER NOT NULL DEFAULT 0,
    approval            TEXT    NOT NULL DEFAULT '',
    waiters             TEXT    NOT NULL DEFAULT '[]',
    approval_attempt    INTEGER NOT NULL DEFAULT 0,
    tenant              TEXT    NOT NULL DEFAULT ''
) WITHOUT ROWID;

INSERT INTO toolq_ledger_0007 (key, conversation_id, turn_index, tool, ordinal, args_digest, state, attempt, owner,
    lease_until, first_tool_use_id, trace_id, span_id, result, error, created_at, updated_at, history, failures,
    claim_token, answered_at)
    SELECT key, conversation_id, turn_index, tool, ordinal, args_digest, state, attempt, owner,
    lease_until, first_tool_use_id, trace_id, span_id, result, error, created_at, updated_at, history, failures,
    claim_token, answered_at FROM toolq_ledger;
DROP TABLE toolq_ledger;
ALTER TABLE toolq_ledger_0007 RENAME TO toolq_ledger;
CREATE INDEX toolq_ledger_updated ON toolq_ledger (updated_at);
CREATE INDEX toolq_ledger_approvals ON toolq_ledger (approval_expires_at) WHERE waiters <> '[]';
