package main

import (
	"encoding/json"
	"testing"
)

// TestSimulate: with the same failures, the naive dispatcher pays some
// turns twice and toolq pays every turn exactly once.
func TestSimulate(t *testing.T) {
	t.Parallel()
	out, err := runPublisher(t, "", "simulate", "--turns", "60", "--failure-rate", "0.4", "--after-dispatch", "0.6", "--seed", "7", "--json")
	if err != nil {
		t.Fatal(err)
	}
	var rows []struct {
		Dispatcher      string `json:"dispatcher"`
		Turns           int    `json:"turns"`
		AfterDispatch   int    `json:"failures_after_dispatch"`
		GaveUp          int    `json:"turns_given_up"`
		Payments        int    `json:"payments"`
		DuplicatedTurns int    `json:"turns_paid_more_than_once"`
	}
	if err := json.Unmarshal([]byte(out), &rows); err != nil || len(rows) != 2 {
		t.Fatalf("%q %v", out, err)
	}
	naive, toolq := rows[0], rows[1]
	if naive.AfterDispatch == 0 || naive.DuplicatedTurns == 0 || naive.Payments <= naive.Turns-naive.GaveUp {
		t.Fatalf("the scenario produced no duplicates to prevent: %+v", naive)
	}
	if toolq.AfterDispatch != naive.AfterDispatch || toolq.DuplicatedTurns != 0 || toolq.Payments > toolq.Turns || toolq.Payments < toolq.Turns-toolq.GaveUp {
		t.Fatalf("toolq: %+v (naive %+v)", toolq, naive)
	}
	if _, err := runPublisher(t, "", "simulate", "--failure-rate", "2"); err == nil {
		t.Fatal("a rate of 2 was accepted")
	}
}
