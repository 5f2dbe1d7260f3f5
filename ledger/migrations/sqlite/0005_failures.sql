-- failures counts the tries of a call that ended unsettled for a reason of
-- its own (the downstream refused it, or its outcome was uncertain): the
-- worker's delivery limit, which deliveries spent waiting do not spend.
-- claim_token is unique to the claim that took the row, so that a claim
-- whose answer was lost recognises its own row, and only its own.
ALTER TABLE toolq_ledger ADD COLUMN failures INTEGER NOT NULL DEFAULT 0;
ALTER TABLE toolq_ledger ADD COLUMN claim_token TEXT NOT NULL DEFAULT '';
