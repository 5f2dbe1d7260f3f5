package jobs_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/toolq/toolq/jobs"
)

const goodJob = `{"version":1,"conversation_id":"conv-1","turn_index":3,"ordinal":0,"tool":"send_payment",` +
	`"tool_use_id":"toolu_01","args":{"invoice_id":"inv_1","amount_cents":500,"currency":"EUR"},"created_at":"2026-12-02T10:00:00Z"}`

func TestDecodeJob(t *testing.T) {
	t.Parallel()
	j, err := jobs.DecodeJob([]byte(goodJob))
	if err != nil {
		t.Fatal(err)
	}
	if j.ConversationID != "conv-1" || j.TurnIndex != 3 || j.Tool != "send_payment" || j.ToolUseID != "toolu_01" || j.CreatedAt.IsZero() {
		t.Fatalf("decoded %+v", j)
	}
	// The key of a job is the key of its call, with or without toolq's decoding.
	k1, _ := j.Key()
	k2, _ := jobs.Call{ConversationID: "conv-1", TurnIndex: 3, Tool: "send_payment",
		Args: []byte(`{"currency":"EUR","amount_cents":500.0,"invoice_id":"inv_1"}`)}.Key()
	if k1 != k2 || k1 == "" {
		t.Fatalf("keys %q %q", k1, k2)
	}
}

func TestDecodeJobRejects(t *testing.T) {
	t.Parallel()
	replace := func(old, new string) string { return strings.Replace(goodJob, old, new, 1) }
	for _, tc := range []struct {
		name, body, field string
		is                error
	}{
		{"not JSON", `hello`, "", jobs.ErrSyntax},
		{"an array", `[1]`, "(body)", nil},
		{"version 2", replace(`"version":1`, `"version":2`), "version", jobs.ErrVersion},
		{"version missing", replace(`"version":1,`, ``), "version", nil},
		{"unknown field", replace(`"version":1`, `"version":1,"extra":true`), "extra", nil},
		{"duplicate field", replace(`"version":1`, `"version":1,"tool":"x"`), "", jobs.ErrDuplicateName},
		{"conversation missing", replace(`"conversation_id":"conv-1",`, ``), "conversation_id", nil},
		{"conversation with a wildcard", replace(`conv-1`, `conv.*`), "conversation_id", nil},
		{"conversation a number", replace(`"conv-1"`, `12`), "conversation_id", nil},
		{"turn as a float", replace(`"turn_index":3`, `"turn_index":3.0`), "turn_index", nil},
		{"turn negative", replace(`"turn_index":3`, `"turn_index":-3`), "turn_index", nil},
		{"turn a string", replace(`"turn_index":3`, `"turn_index":"3"`), "turn_index", nil},
		{"tool with a space", replace(`"send_payment"`, `"send payment"`), "tool", nil},
		{"tool_use_id missing", replace(`"tool_use_id":"toolu_01",`, ``), "tool_use_id", nil},
		{"tool_use_id with a dot", replace(`toolu_01`, `toolu.01`), "tool_use_id", nil},
		{"args missing", replace(`"args":{"invoice_id":"inv_1","amount_cents":500,"currency":"EUR"},`, ``), "args", nil},
		{"args an array", replace(`{"invoice_id":"inv_1","amount_cents":500,"currency":"EUR"}`, `[]`), "args", jobs.ErrNotObject},
		{"args with an unsafe integer", replace(`500`, `9007199254740993`), "", jobs.ErrUnsafeInteger},
		{"bad created_at", replace(`2026-12-02T10:00:00Z`, `yesterday`), "created_at", nil},
		{"truncated", goodJob[:40], "", jobs.ErrSyntax},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := jobs.DecodeJob([]byte(tc.body))
			if err == nil {
				t.Fatal("accepted")
			}
			if tc.field != "" {
				var fe *jobs.FieldError
				if !errors.As(err, &fe) || fe.Field != tc.field {
					t.Fatalf("err = %v, want a FieldError on %s", err, tc.field)
				}
			}
			if tc.is != nil && !errors.Is(err, tc.is) {
				t.Fatalf("err = %v, want %v", err, tc.is)
			}
		})
	}
}

func TestDecodeJobOrdinalDefaultsToZero(t *testing.T) {
	t.Parallel()
	j, err := jobs.DecodeJob([]byte(strings.Replace(goodJob, `"ordinal":0,`, ``, 1)))
	if err != nil || j.Ordinal != 0 {
		t.Fatalf("ordinal %d, err %v", j.Ordinal, err)
	}
}

func TestResultRoundTrip(t *testing.T) {
	t.Parallel()
	j, err := jobs.DecodeJob([]byte(goodJob))
	if err != nil {
		t.Fatal(err)
	}
	r := jobs.NewResult(j, "k", jobs.StatusOK)
	r.Output = json.RawMessage(`{"id":"pay_1"}`)
	body, err := json.Marshal(r)
	if err != nil {
		t.Fatal(err)
	}
	back, err := jobs.DecodeResult(body)
	if err != nil {
		t.Fatal(err)
	}
	if back.ToolUseID != "toolu_01" || back.Status != jobs.StatusOK || string(back.Output) != `{"id":"pay_1"}` {
		t.Fatalf("round trip: %s", body)
	}
	if _, err := jobs.DecodeResult([]byte(strings.Replace(string(body), `"ok"`, `"maybe"`, 1))); err == nil {
		t.Fatal("unknown status accepted")
	}
}

func ExampleCall_Key() {
	call := jobs.Call{
		ConversationID: "conv-42",
		TurnIndex:      7,
		Tool:           "send_payment",
		Ordinal:        0,
		Args:           []byte(`{"invoice_id": "inv_9", "amount_cents": 1500.0, "currency": "EUR"}`),
	}
	m, _ := call.Material()
	fmt.Println(m.Text)
	fmt.Println(m.Key())
	// Output:
	// conv-42|7|send_payment|0|{"amount_cents":1500,"currency":"EUR","invoice_id":"inv_9"}
	// f59a97883fdd6f13531d0209b36a3446
}

// FuzzDecodeJobMaterial: whatever the body, a job that decodes has the
// material Call.Material derives from its fields, and its re-encoding
// decodes to the same job and key.
func FuzzDecodeJobMaterial(f *testing.F) {
	for _, seed := range []string{
		`{"version":1,"conversation_id":"c1","turn_index":3,"tool":"send_payment","tool_use_id":"toolu_1","args":{"b":[1,2.5e0],"a":"\u00e9"}}`,
		`{"version":1,"conversation_id":"c1","turn_index":0,"ordinal":2,"tool":"t","tool_use_id":"x","args":{},"created_at":"2026-01-02T03:04:05Z"}`,
		`{"version":1,"conversation_id":"c1","turn_index":1,"tool":"t","tool_use_id":"x","args":[1]}`,
		`{"version":1,"conversation_id":"c1","turn_index":1.0,"tool":"t","tool_use_id":"x","args":{}}`,
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		j, m, err := jobs.DecodeJobMaterial(body)
		if err != nil {
			if j2, err2 := jobs.DecodeJob(body); err2 == nil || j2 != nil {
				t.Fatalf("DecodeJobMaterial refuses (%v), DecodeJob does not", err)
			}
			return
		}
		want, err := j.Call().Material()
		if err != nil || want.Text != m.Text || !bytes.Equal(want.Canonical, m.Canonical) {
			t.Fatalf("decoded material %q, Call.Material %q (%v)", m.Text, want.Text, err)
		}
		again, err := json.Marshal(j)
		if err != nil {
			t.Fatal(err)
		}
		j2, m2, err := jobs.DecodeJobMaterial(again)
		if err != nil || m2.Key() != m.Key() || j2.ToolUseID != j.ToolUseID {
			t.Fatalf("re-encoded %s: %v, key %s want %s", again, err, m2.Key(), m.Key())
		}
	})
}
