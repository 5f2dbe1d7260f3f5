package testenv

import (
	"testing"
	"time"
)

// pollInterval is how often Eventually asks its condition.
const pollInterval = 20 * time.Millisecond

// Eventually waits until cond returns true, asking it at once and then
// every 20ms, and fails the test with "timed out after <timeout> waiting
// for <what>" when timeout passes first. It is how every test waits on a
// condition: never a bare time.Sleep.
func Eventually(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", timeout, what)
		}
		time.Sleep(pollInterval)
	}
}
