package worker

import (
	"errors"

	"github.com/toolq/toolq/jobs"
	"github.com/toolq/toolq/ledger"
)

// Before member names were ordered by all their UTF-16 code units (RFC
// 8785), names that first differ at characters above U+FFFF sharing a high
// surrogate (👍 U+1F44D and 👎 U+1F44E) kept the order they were written
// in, so such a call had another key: its legacy key (jobs.Material.Legacy).
// A call that ran under it before the upgrade must not run again after it,
// so a delivery whose call has a legacy key acts under that key instead of
// the new one when
//
//   - its tool keeps a ledger and the ledger has a row under the legacy key
//     (settled, or in flight: the delivery answers from it, awaits it, or
//     takes it over sending the legacy key downstream, as for any row; or
//     approved and not run yet: the delivery runs it, without asking a
//     person again), or
//   - its tool keeps no ledger and the job carries the legacy key in its
//     Toolq-Key header: it was published before the upgrade, and its
//     earlier deliveries went downstream under that key.
//
// Otherwise the call is new: it is claimed, and sent, under the new key.

// useLegacyKey switches the delivery to its call's legacy key and material
// when it must act under them (see above). An error is the ledger's: the
// delivery cannot tell yet, and is handed back.
func (d *delivery) useLegacyKey() error {
	legacy, ok := d.material.Legacy()
	if !ok {
		return nil
	}
	key := legacy.Key()
	if d.decided() && d.msg.Headers().Get(jobs.HeaderKey) == key {
		// toolq published it again under the key its row has: an approved
		// call's released row, which Get does not see.
		d.material, d.key = legacy, key
		return nil
	}
	if !d.tool.UsesLedger {
		if d.msg.Headers().Get(jobs.HeaderKey) == key {
			d.material, d.key = legacy, key
		}
		return nil
	}
	// An approved call's released row too: a retried turn runs it rather
	// than ask again under the new key.
	row, err := d.w.cfg.Ledger.GetOrApproved(d.runCtx, key)
	switch {
	case errors.Is(err, ledger.ErrNotFound):
		return nil
	case err != nil:
		return err
	}
	d.w.log.InfoContext(d.ctx, "the call has a ledger row under its key from before the member-order fix: acting on it",
		d.attrs("legacy_key", key, "state", row.State)...)
	d.material, d.key = legacy, key
	return nil
}

// isLegacyKey reports whether key is the legacy key of the delivery's call:
// the Toolq-Key a publisher from before the upgrade derived for it.
func (d *delivery) isLegacyKey(key string) bool {
	legacy, ok := d.material.Legacy()
	return ok && legacy.Key() == key
}
