package bench

import (
	"math"
	"testing"
)

// TestStealIsTheHypervisorsShareOfTheMachinesTime: /proc/stat's first line
// splits into the processes' CPU time (user, nice, system, irq, softirq),
// the hypervisor's (steal) and all the time there was (idle and iowait
// too; guest time is in user already), and a run's steal is its share of
// the time between two readings.
func TestStealIsTheHypervisorsShareOfTheMachinesTime(t *testing.T) {
	for _, tc := range []struct {
		name, line          string
		machine, steal, all float64
	}{
		{"every field", "cpu  100 20 50 800 10 5 5 30 70 3", 1.80, 0.30, 10.20},
		{"no steal field (an old kernel)", "cpu 100 20 50 800 10 5 5", 1.80, 0, 9.90},
		{"no /proc", "", 0, 0, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := parseMachineTime(tc.line)
			if math.Abs(got.machine-tc.machine) > 1e-9 || math.Abs(got.steal-tc.steal) > 1e-9 || math.Abs(got.all-tc.all) > 1e-9 {
				t.Errorf("%q: %+v, want machine %.2f, steal %.2f, all %.2f", tc.line, got, tc.machine, tc.steal, tc.all)
			}
		})
	}
	from := parseMachineTime("cpu 100 0 50 800 10 5 5 30 0 0")
	to := parseMachineTime("cpu 150 0 70 900 10 5 5 60 0 0") // 2 s of time, 0.3 s of it stolen
	if got := stealPct(from, to); math.Abs(got-15) > 1e-9 {
		t.Errorf("steal between the readings: %.2f %%, want 15 %%", got)
	}
	if got := stealPct(to, to); got != 0 {
		t.Errorf("steal of no time: %.2f %%, want 0", got)
	}
}
