-- A release keeps the row, in state 'released' with its last attempt, so that
-- the next claim of the key takes the attempt after it: a fence never
-- repeats for a key. SQLite cannot change a CHECK constraint in place: the
-- table is copied into one that allows the new state. Existing rows are
-- unchanged.
CREATE TABLE toolq_ledger_0002 (
    key               TEXT    PRIMARY KEY,
    conversation_id   TEXT    NOT NULL,
    turn_index        INTEGER NOT NULL,
    tool              TEXT    NOT NULL,
    ordinal           INTEGER NOT NULL,
    args_digest       TEXT    NOT NULL,
    state             TEXT    NOT NULL CHECK (state IN ('in_flight', 'completed', 'failed', 'indeterminate', 'released')),
    attempt           INTEGER NOT NULL,
    owner             TEXT    NOT NULL,
    lease_until       INTEGER NOT NULL,
    first_tool_use_id TEXT    NOT NULL,
    trace_id          TEXT    NOT NULL DEFAULT '',
    span_id           TEXT    NOT NULL DEFAULT '',
    result            TEXT    NOT NULL DEFAULT '',
    error             TEXT    NOT NULL DEFAULT '',
    created_at        INTEGER NOT NULL,
    updated_at        INTEGER NOT NULL
) WITHOUT ROWID;

INSERT INTO toolq_ledger_0002 (key, conversation_id, turn_index, tool, ordinal, args_digest, state, attempt, owner,
    lease_until, first_tool_use_id, trace_id, span_id, result, error, created_at, updated_at)
    SELECT key, conversation_id, turn_index, tool, ordinal, args_digest, state, attempt, owner,
    lease_until, first_tool_use_id, trace_id, span_id, result, error, created_at, updated_at FROM toolq_ledger;
DROP TABLE toolq_ledger;
ALTER TABLE toolq_ledger_0002 RENAME TO toolq_ledger;
CREATE INDEX toolq_ledger_updated ON toolq_ledger (updated_at);
