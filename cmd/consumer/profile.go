package main

import (
	"fmt"
	"os"
	"runtime/debug"
	"runtime/pprof"
	"runtime/trace"
	"slices"
)

// startProfiles starts a CPU profile and an execution trace of this
// process into the files named (empty: none), and returns what ends them.
func startProfiles(cpuFile, traceFile string) (func(), error) {
	var stops []func()
	stop := func() {
		for _, s := range slices.Backward(stops) {
			s()
		}
	}
	if cpuFile != "" {
		f, err := os.Create(cpuFile)
		if err != nil {
			return nil, fmt.Errorf("--debug-cpuprofile: %w", err)
		}
		if err := pprof.StartCPUProfile(f); err != nil {
			f.Close()
			return nil, fmt.Errorf("--debug-cpuprofile: %w", err)
		}
		stops = append(stops, func() { pprof.StopCPUProfile(); f.Close() })
	}
	if traceFile != "" {
		f, err := os.Create(traceFile)
		if err != nil {
			stop()
			return nil, fmt.Errorf("--debug-trace: %w", err)
		}
		if err := trace.Start(f); err != nil {
			f.Close()
			stop()
			return nil, fmt.Errorf("--debug-trace: %w", err)
		}
		stops = append(stops, func() { trace.Stop(); f.Close() })
	}
	return stop, nil
}

// gcPercent is the consumer's garbage collection target when GOGC is not
// set: the heap may grow to five times what is live before a collection.
// A consumer's live heap is small (a few MiB: the deliveries in flight),
// and every delivery allocates a few KiB, so that at Go's default (100)
// the collector ran every few hundred jobs and took about a fifth of the
// consumer's CPU (docs/performance.md); at 400 it takes a quarter of
// that, for some MiB more of resident memory. GOGC and GOMEMLIMIT in the
// environment take precedence, as they do for any Go program.
const gcPercent = 400

// setGC applies gcPercent unless the environment sets GOGC.
func setGC(getenv func(string) string) {
	if getenv("GOGC") == "" {
		debug.SetGCPercent(gcPercent)
	}
}
