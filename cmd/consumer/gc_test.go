package main

import (
	"context"
	"io"
	"runtime/debug"
	"runtime/metrics"
	"strings"
	"testing"

	"github.com/toolq/toolq/internal/cli"
)

// TestRunTakesGOGCFromTheEnvironmentItIsGiven: `consumer run` leaves the
// garbage collector to a GOGC in the environment it is given (not only the
// process's), and a run refused for a bad flag changes nothing.
func TestRunTakesGOGCFromTheEnvironmentItIsGiven(t *testing.T) {
	defer debug.SetGCPercent(debug.SetGCPercent(100))
	read := func() uint64 {
		s := []metrics.Sample{{Name: "/gc/gogc:percent"}}
		metrics.Read(s)
		return s[0].Value.Uint64()
	}
	env := map[string]string{"GOGC": "100"}
	err := run(context.Background(), []string{"run", "--backoff", "bogus"}, cli.IO{In: strings.NewReader(""), Out: io.Discard, Err: io.Discard},
		func(k string) string { return env[k] })
	if err == nil {
		t.Fatal("--backoff bogus accepted")
	}
	if got := read(); got != 100 {
		t.Fatalf("GOGC=100 in the environment given: the process now runs at GOGC %d", got)
	}
}
