-- What the ledger remembers of its purges, so that a dead letter is not
-- requeued after the row of its call was purged: rows finished before
-- purged_before may be gone (the latest cutoff of any purge), older_than_ms is
-- the last purge's retention. One row, none before the first purge.
CREATE TABLE toolq_purge (
    id            smallint    PRIMARY KEY CHECK (id = 1),
    purged_before timestamptz NOT NULL,
    older_than_ms bigint      NOT NULL,
    purged_at     timestamptz NOT NULL
);
