-- The claim store: one row per idempotency key. Times are Unix milliseconds.
CREATE TABLE toolq_ledger (
    key               TEXT    PRIMARY KEY,
    conversation_id   TEXT    NOT NULL,
    turn_index        INTEGER NOT NULL,
    tool              TEXT    NOT NULL,
    ordinal           INTEGER NOT NULL,
    args_digest       TEXT    NOT NULL,
    state             TEXT    NOT NULL CHECK (state IN ('in_flight', 'completed', 'failed', 'indeterminate')),
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

CREATE INDEX toolq_ledger_updated ON toolq_ledger (updated_at);
