-- answered_at is when a claim last found the row settled and so answered a
-- duplicate from it, to within an hour (Store.Claim writes it only when the
-- stored time is older than that). A purge measures the retention from the
-- later of it and updated_at: the duplicate's job can come back (a replay,
-- a requeue) for as long after its answer as after the first. Existing rows
-- start at 0 (the epoch): measured from when they settled, as before. Unix
-- milliseconds.
ALTER TABLE toolq_ledger ADD COLUMN answered_at INTEGER NOT NULL DEFAULT 0;
