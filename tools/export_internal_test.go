package tools

import (
	"encoding/json"
	"testing"
)

// TestMCPAnnotationsSayReadOrWrite: a read is read-only; every other class,
// including one this code has not heard of, is a write whose repeat with
// the same arguments takes effect again (toolq collapses one call's
// duplicates, not a second call).
func TestMCPAnnotationsSayReadOrWrite(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		class Class
		want  string
	}{
		{Read, `{"readOnlyHint":true}`},
		{KeyedWrite, `{"readOnlyHint":false,"idempotentHint":false}`},
		{UnkeyedWrite, `{"readOnlyHint":false,"idempotentHint":false}`},
		{"transactional_write", `{"readOnlyHint":false,"idempotentHint":false}`},
		{"a_class_from_later", `{"readOnlyHint":false,"idempotentHint":false}`},
	} {
		got, err := json.Marshal(mcpAnnotationsOf(c.class))
		if err != nil || string(got) != c.want {
			t.Errorf("%s: %s %v, want %s", c.class, got, err, c.want)
		}
	}
}
