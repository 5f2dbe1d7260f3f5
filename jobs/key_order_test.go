package jobs_test

import (
	"fmt"
	"math/rand/v2"
	"testing"

	refjcs "github.com/gowebpki/jcs"

	"github.com/toolq/toolq/internal/jsontest"
	"github.com/toolq/toolq/jobs"
)

// keyOfBoth checks that two spellings of one object (jsontest.Respelled:
// members of every object in another order, strings and numbers spelled
// otherwise) give one canonical form, the one an independent RFC 8785
// implementation gives, and one key, whether derived from the call or by the
// worker's decode of a job body.
func keyOfBoth(t *testing.T, a, b string) {
	t.Helper()
	want, err := refjcs.Transform([]byte(a))
	if err != nil {
		t.Fatalf("the reference refused %s: %v", a, err)
	}
	call := jobs.Call{ConversationID: "conv-order", TurnIndex: 2, Tool: "cast_vote"}
	var key string
	for i, args := range []string{a, b} {
		call.Args = []byte(args)
		m, err := call.Material()
		if err != nil {
			t.Fatalf("args %s: %v", args, err)
		}
		if string(m.Canonical) != string(want) {
			t.Fatalf("args %s:\n canonical %s\n reference %s", args, m.Canonical, want)
		}
		body := fmt.Sprintf(`{"version":1,"conversation_id":"conv-order","turn_index":2,"tool":"cast_vote","tool_use_id":"toolu_%d","args":%s}`, i, args)
		_, dm, err := jobs.DecodeJobMaterial([]byte(body))
		if err != nil {
			t.Fatalf("body %s: %v", body, err)
		}
		if dm.Key() != m.Key() {
			t.Fatalf("args %s: decode gives key %s, the call %s", args, dm.Key(), m.Key())
		}
		if i == 0 {
			key = m.Key()
		} else if m.Key() != key {
			t.Fatalf("one object, two keys:\n %s -> %s\n %s -> %s", a, key, b, m.Key())
		}
	}
}

// TestKeyIgnoresMemberOrder: member order, whitespace and the spelling of
// strings and numbers never change a key, over objects whose names share
// high surrogates (👍 👎), mix U+E000–U+FFFF with astral characters, and
// are written with and without escapes.
func TestKeyIgnoresMemberOrder(t *testing.T) {
	t.Parallel()
	rng := rand.New(rand.NewPCG(8785, 23))
	for range 4000 {
		a, b := jsontest.Respelled(rng)
		keyOfBoth(t, a, b)
	}
}

// FuzzKeyIgnoresMemberOrder is TestKeyIgnoresMemberOrder with the fuzzer
// choosing the generator's seed.
func FuzzKeyIgnoresMemberOrder(f *testing.F) {
	for i := range uint64(8) {
		f.Add(i, 8785+i)
	}
	f.Fuzz(func(t *testing.T, s1, s2 uint64) {
		a, b := jsontest.Respelled(rand.New(rand.NewPCG(s1, s2)))
		keyOfBoth(t, a, b)
	})
}

// TestKeyMatchesUTF16Vectors: the shared vectors of names that make orders
// disagree (jobs/testdata/utf16_keys.jsonl, written by an independent
// Python derivation) give their canonical form, material and key, and their
// legacy form and key exactly where the order before the fix differed.
func TestKeyMatchesUTF16Vectors(t *testing.T) {
	t.Parallel()
	type vector struct {
		ConversationID  string `json:"conversation_id"`
		TurnIndex       int64  `json:"turn_index"`
		Tool            string `json:"tool"`
		Ordinal         int64  `json:"ordinal"`
		ArgsWire        string `json:"args_wire"`
		Canonical       string `json:"canonical"`
		Material        string `json:"material"`
		Key             string `json:"key"`
		LegacyCanonical string `json:"legacy_canonical"`
		LegacyKey       string `json:"legacy_key"`
	}
	legacies := 0
	for i, v := range readJSONL[vector](t, "testdata/utf16_keys.jsonl") {
		body := fmt.Sprintf(`{"version":1,"conversation_id":%q,"turn_index":%d,"tool":%q,"ordinal":%d,"tool_use_id":"toolu_%d","args":%s}`,
			v.ConversationID, v.TurnIndex, v.Tool, v.Ordinal, i, v.ArgsWire)
		_, dm, err := jobs.DecodeJobMaterial([]byte(body))
		if err != nil {
			t.Fatalf("row %d: %v", i, err)
		}
		c := jobs.Call{ConversationID: v.ConversationID, TurnIndex: v.TurnIndex, Tool: v.Tool, Ordinal: v.Ordinal, Args: []byte(v.ArgsWire)}
		m, err := c.Material()
		if err != nil {
			t.Fatalf("row %d: %v", i, err)
		}
		for _, m := range []jobs.Material{m, dm} {
			if string(m.Canonical) != v.Canonical || m.Text != v.Material || m.Key() != v.Key {
				t.Fatalf("row %d: %s\n canonical %s\n want      %s\n key %s want %s", i, v.ArgsWire, m.Canonical, v.Canonical, m.Key(), v.Key)
			}
			legacy, ok := m.Legacy()
			if ok != (v.LegacyKey != "") || ok && (string(legacy.Canonical) != v.LegacyCanonical || legacy.Key() != v.LegacyKey) {
				t.Fatalf("row %d: %s\n legacy %s (%v) key %s\n want   %s key %s", i, v.ArgsWire, legacy.Canonical, ok, legacy.Key(), v.LegacyCanonical, v.LegacyKey)
			}
		}
		if v.LegacyKey != "" {
			legacies++
		}
	}
	if legacies < 10 {
		t.Fatalf("only %d vectors whose legacy key differs", legacies)
	}
}
