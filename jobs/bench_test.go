package jobs_test

import (
	"testing"

	"github.com/toolq/toolq/jobs"
)

// BenchmarkDecodeJobMaterial decodes a job body the way the worker does at
// every delivery: strict parse, fields, and the key's material.
func BenchmarkDecodeJobMaterial(b *testing.B) {
	body := []byte(`{"version":1,"conversation_id":"c-42","turn_index":7,"ordinal":0,"tool":"send_payment",` +
		`"tool_use_id":"toolu_01A09q90qw90lq917835lq9","created_at":"2026-12-04T06:30:00.123456Z",` +
		`"args":{"amount_cents":1250,"currency":"EUR","recipient":"acct_981","memo":"invoice 2026-118"}}`)
	b.ReportAllocs()
	for b.Loop() {
		if _, m, err := jobs.DecodeJobMaterial(body); err != nil || m.Key() == "" {
			b.Fatal(err)
		}
	}
}
