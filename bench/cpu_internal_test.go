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
	if got := to.since(from).stealPct(); math.Abs(got-15) > 1e-9 {
		t.Errorf("steal between the readings: %.2f %%, want 15 %%", got)
	}
	if got := to.since(to).stealPct(); got != 0 {
		t.Errorf("steal of no time: %.2f %%, want 0", got)
	}
	if got := to.since(machineTime{}).stealPct(); got != 0 {
		t.Errorf("steal since a reading that failed: %.2f %%, want 0 (not the share since the machine booted)", got)
	}
}

// TestMachineCPUIsItsTicksOverUserHZ: the machine's CPU seconds are its
// busy ticks (user, nice, system, irq, softirq) added up, then divided by
// USER_HZ once, as they always were: divided one field at a time and then
// added, the seconds round differently, so machine_cpu_s_per_1000 of the
// same two readings changed in its last digits and the settle wait's "a
// fifth of a core" at exactly 4 ticks in 200ms went the other way.
func TestMachineCPUIsItsTicksOverUserHZ(t *testing.T) {
	for _, tc := range []struct {
		line  string
		ticks int64 // user + nice + system + irq + softirq
	}{
		{"cpu 10 20 0 5 0 0 0 0", 30},
		{"cpu  1774911 1637 866378 2231109 12072 0 61588 48971 0 0", 1774911 + 1637 + 866378 + 61588},
		{"cpu  1775255 1637 866821 2231609 12072 0 61611 48981 0 0", 1775255 + 1637 + 866821 + 61611},
	} {
		if got, want := parseMachineTime(tc.line).machine, float64(tc.ticks)/100; got != want {
			t.Errorf("%q: machine %v s, want %v", tc.line, got, want)
		}
	}
	// A run of 10,000 jobs between two readings: the figure the report
	// gave before steal was read beside it.
	from := parseMachineTime("cpu  1774911 1637 866378 2231109 12072 0 61588 48971 0 0")
	to := parseMachineTime("cpu  1775255 1637 866821 2231609 12072 0 61611 48981 0 0")
	if got, want := (to.machine-from.machine)/10000*1000, (float64(1775255+1637+866821+61611)/100-float64(1774911+1637+866378+61588)/100)/10000*1000; got != want {
		t.Errorf("machine CPU s/1000 jobs: %v, want %v", got, want)
	}
	// The settle wait: 4 ticks of busy in 200ms is as idle as it was.
	last := parseMachineTime("cpu  1779410 1551 145821 3010051 13937 0 69758 26148 0 0").machine
	now := parseMachineTime("cpu  1779414 1551 145821 3010051 13937 0 69758 26148 0 0").machine
	wantIdle := float64(1779414+1551+145821+69758)/100-float64(1779410+1551+145821+69758)/100 < 0.2*0.2
	if idle := now-last < 0.2*0.2; idle != wantIdle {
		t.Errorf("settle: 4 ticks in 200ms counted idle %v, want %v", idle, wantIdle)
	}
}
