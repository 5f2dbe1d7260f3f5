package mcpfront

import (
	"encoding/json"
	"testing"
)

// TestIntegerTakesOnlyWhatEveryClientReadsAlike: integers from 0 to
// 2^53−1, the ones a double holds apart from their neighbours.
func TestIntegerTakesOnlyWhatEveryClientReadsAlike(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		v    any
		want int64
		ok   bool
	}{
		{float64(0), 0, true},
		{float64(7), 7, true},
		{float64(1<<53 - 1), 1<<53 - 1, true},
		{float64(1 << 53), 0, false}, // also what 2^53+1 decodes to
		{float64(1<<53 + 2), 0, false},
		{json.Number("9007199254740992"), 0, false},
		{int64(1<<53 - 1), 1<<53 - 1, true},
		{1.5, 0, false},
		{-1.0, 0, false},
		{json.Number("12"), 12, true},
		{json.Number("1e2"), 0, false},
		{"3", 0, false},
		{nil, 0, false},
		{true, 0, false},
	} {
		got, ok := integer(tc.v)
		if ok != tc.ok || ok && got != tc.want {
			t.Errorf("integer(%#v) = %d, %v; want %d, %v", tc.v, got, ok, tc.want, tc.ok)
		}
	}
}
