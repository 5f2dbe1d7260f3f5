-- The audit trail of a row: a JSON array of the operator decisions taken on
-- it (who, when, what and why), oldest first. It survives a release and the
-- claim after it, so a call resolved as not run keeps the record of that
-- decision once it has run. Existing rows start with an empty history.
ALTER TABLE toolq_ledger ADD COLUMN history TEXT NOT NULL DEFAULT '[]';
