package mcpfront

import (
	"encoding/json"
	"testing"
)

func TestIntegerTakesOnlyWhatEveryClientReadsAlike(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		v    any
		want int64
		ok   bool
	}{
		{float64(0), 0, true},
		{float64(7), 7, true},
		{float64(1 << 53), 1 << 53, true},
		{float64(1<<53 + 2), 0, false},
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
