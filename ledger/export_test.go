package ledger

// ReadSettledFirst makes a Postgres store's claims read settled rows
// first (readSettled) on every batch, as they do while duplicates are most
// of what comes, so that the conformance suite covers that path too.
func ReadSettledFirst(s *Store) { s.db.(*postgresDB).settledShare.pinned = true }
