-- A release keeps the row, in state 'released' with its last attempt, so that
-- the next claim of the key takes the attempt after it: a fence never
-- repeats for a key. Existing rows are unchanged.
ALTER TABLE toolq_ledger DROP CONSTRAINT IF EXISTS toolq_ledger_state_check;
ALTER TABLE toolq_ledger ADD CONSTRAINT toolq_ledger_state_check
    CHECK (state IN ('in_flight', 'completed', 'failed', 'indeterminate', 'released'));
