-- The claim store: one row per idempotency key.
CREATE TABLE toolq_ledger (
    key               text        PRIMARY KEY,
    conversation_id   text        NOT NULL,
    turn_index        bigint      NOT NULL,
    tool              text        NOT NULL,
    ordinal           bigint      NOT NULL,
    args_digest       text        NOT NULL,
    state             text        NOT NULL CHECK (state IN ('in_flight', 'completed', 'failed', 'indeterminate')),
    attempt           bigint      NOT NULL,  -- fencing token: every write after a claim names it
    owner             text        NOT NULL,
    lease_until       timestamptz NOT NULL,
    first_tool_use_id text        NOT NULL,
    trace_id          text        NOT NULL DEFAULT '',
    span_id           text        NOT NULL DEFAULT '',
    result            text        NOT NULL DEFAULT '',  -- the tool's output, byte for byte
    error             text        NOT NULL DEFAULT '',  -- {"code":…,"message":…}
    created_at        timestamptz NOT NULL DEFAULT now(),
    updated_at        timestamptz NOT NULL DEFAULT now()
);

-- Operators list recent rows and purge finished rows by age. There is no index
-- on state on purpose: the hot path finds rows by key, and a state index
-- tempts the planner away from the primary key when statistics lag.
CREATE INDEX toolq_ledger_updated ON toolq_ledger (updated_at);
