package tools

// Audit says, for one tool, what protects it from running twice.
type Audit struct {
	Name          string `json:"name"`
	Class         Class  `json:"class"`
	Ledger        bool   `json:"ledger"`
	KeyForwarded  bool   `json:"key_forwarded"`
	CanDoubleFire bool   `json:"can_double_fire"`
	Why           string `json:"why"`
}

// Audit reports whether the tool can take effect twice, and why.
func (t *Tool) Audit() Audit {
	a := Audit{Name: t.Name, Class: t.Class, Ledger: t.UsesLedger, KeyForwarded: t.ForwardsKey}
	switch {
	case t.Class == Read:
		a.Why = "a read has no side effect: it runs on every delivery, without ledger or key"
	case t.Class == UnkeyedWrite:
		a.Why = "at most once: claimed in the ledger before it runs; an unknown outcome becomes indeterminate " +
			"for an operator to resolve and is never re-run automatically"
	case t.Class == TransactionalWrite:
		a.Why = "exactly once: its effect is a write in the ledger's own database, committed in one transaction with " +
			"the call's ledger row; a call that did not commit left nothing and runs again, and one that did is never re-run"
	case !t.ForwardsKey:
		a.CanDoubleFire = true
		a.Why = "a keyed write that does not forward its key: an ambiguous failure (timeout, reset, 5xx) is " +
			"retried and nothing downstream collapses the retry; forward the key or make it an unkeyed_write"
	case t.UsesLedger:
		a.Why = "claimed in the ledger before it runs, and the downstream collapses retries of the forwarded Idempotency-Key"
	default:
		a.Why = "no local ledger: every duplicate delivery reaches the downstream, which collapses it by the " +
			"forwarded Idempotency-Key for as long as it keeps keys (that window must outlast redeliveries and replays)"
	}
	return a
}
