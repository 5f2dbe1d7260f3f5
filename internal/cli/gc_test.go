package cli

import (
	"runtime/debug"
	"runtime/metrics"
	"testing"
)

// gcPercent is this process's garbage collection target now.
func gcPercent() uint64 {
	s := []metrics.Sample{{Name: "/gc/gogc:percent"}}
	metrics.Read(s)
	return s[0].Value.Uint64()
}

// TestServiceGCIsTheDefaultAndGOGCWins: a long-running process runs at
// ServiceGCPercent when its environment has no GOGC, and at what GOGC
// says (left to the runtime, which read it at start) when it has one.
func TestServiceGCIsTheDefaultAndGOGCWins(t *testing.T) {
	defer debug.SetGCPercent(debug.SetGCPercent(100))
	SetServiceGC(func(k string) string { return map[string]string{"GOGC": "100"}[k] })
	if got := gcPercent(); got != 100 {
		t.Fatalf("GOGC=100 in the environment: the process runs at %d", got)
	}
	SetServiceGC(func(string) string { return "" })
	if got := gcPercent(); got != ServiceGCPercent {
		t.Fatalf("no GOGC: the process runs at %d, want %d", got, ServiceGCPercent)
	}
}
