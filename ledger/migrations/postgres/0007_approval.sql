-- Approvals: a call whose tool needs a person's approval waits in state
-- 'awaiting_approval' until it is approved (then released, to run at its
-- next claim without asking again), denied or expired (then failed).
-- approval_status is '', 'awaiting', 'approved', 'denied' or 'expired' and
-- survives a release; approval holds the request and the decision as JSON
-- (the canonical args that run when it is approved among them);
-- approval_expires_at is when an awaiting call expires; waiters are the
-- tool_use_ids that asked while it waited, a JSON array, emptied once each
-- has its final answer; approval_attempt the row's attempt when it was
-- approved (a claim since has a later one). The partial index serves the approvals sweep,
-- which reads only the rows with waiters. Existing rows are unchanged.
ALTER TABLE toolq_ledger DROP CONSTRAINT IF EXISTS toolq_ledger_state_check;
ALTER TABLE toolq_ledger ADD CONSTRAINT toolq_ledger_state_check
    CHECK (state IN ('in_flight', 'completed', 'failed', 'indeterminate', 'released', 'awaiting_approval'));
ALTER TABLE toolq_ledger ADD COLUMN approval_status text NOT NULL DEFAULT '';
ALTER TABLE toolq_ledger ADD COLUMN approval_expires_at timestamptz NOT NULL DEFAULT 'epoch';
ALTER TABLE toolq_ledger ADD COLUMN approval text NOT NULL DEFAULT '';
ALTER TABLE toolq_ledger ADD COLUMN waiters text NOT NULL DEFAULT '[]';
ALTER TABLE toolq_ledger ADD COLUMN approval_attempt bigint NOT NULL DEFAULT 0;
-- tenant is the tenant whose call the row is ('' the default), so that a
-- tenant's lookup answers its own keys only. Existing rows are the default's.
ALTER TABLE toolq_ledger ADD COLUMN tenant text NOT NULL DEFAULT '';
CREATE INDEX toolq_ledger_approvals ON toolq_ledger (approval_expires_at) WHERE waiters <> '[]';
