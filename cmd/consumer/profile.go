package main

import (
	"fmt"
	"os"
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
