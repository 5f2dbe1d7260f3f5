package jobs_test

import (
	"bufio"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/toolq/toolq/jobs"
)

func readJSONL[T any](t *testing.T, path string) []T {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var rows []T
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		var row T
		if err := json.Unmarshal(sc.Bytes(), &row); err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		rows = append(rows, row)
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	if len(rows) == 0 {
		t.Fatalf("%s: no rows", path)
	}
	return rows
}

func TestKeyMatchesPythonFormula(t *testing.T) {
	t.Parallel()
	type vector struct {
		ConversationID string `json:"conversation_id"`
		TurnIndex      int64  `json:"turn_index"`
		Tool           string `json:"tool"`
		Ordinal        int64  `json:"ordinal"`
		ArgsWire       string `json:"args_wire"`
		Canonical      string `json:"canonical"`
		Material       string `json:"material"`
		Key            string `json:"key"`
	}
	for i, v := range readJSONL[vector](t, "testdata/python_keys.jsonl") {
		c := jobs.Call{ConversationID: v.ConversationID, TurnIndex: v.TurnIndex, Tool: v.Tool, Ordinal: v.Ordinal, Args: []byte(v.ArgsWire)}
		m, err := c.Material()
		if err != nil {
			t.Fatalf("row %d: %v", i, err)
		}
		if string(m.Canonical) != v.Canonical || m.Text != v.Material || m.Key() != v.Key {
			t.Fatalf("row %d:\n canonical %s\n want      %s\n key %s want %s", i, m.Canonical, v.Canonical, m.Key(), v.Key)
		}
		// The worker's decode derives the material from its one parse of
		// the whole body: it must be the same.
		body := fmt.Sprintf(`{"version":1,"conversation_id":%q,"turn_index":%d,"tool":%q,"ordinal":%d,"tool_use_id":"toolu_%d","args":%s}`,
			v.ConversationID, v.TurnIndex, v.Tool, v.Ordinal, i, v.ArgsWire)
		j, dm, err := jobs.DecodeJobMaterial([]byte(body))
		if err != nil {
			t.Fatalf("row %d: DecodeJobMaterial: %v", i, err)
		}
		if dm.Text != v.Material || string(dm.Canonical) != v.Canonical || string(j.Args) != v.ArgsWire {
			t.Fatalf("row %d: DecodeJobMaterial gives material %q (args %s), want %q", i, dm.Text, j.Args, v.Material)
		}
	}
}

func TestKeyIgnoresSpellingButNotMeaning(t *testing.T) {
	t.Parallel()
	base := jobs.Call{ConversationID: "conv-1", TurnIndex: 3, Tool: "send_payment", Args: []byte(`{"amount":1,"currency":"EUR"}`)}
	key := func(c jobs.Call) string {
		t.Helper()
		k, err := c.Key()
		if err != nil {
			t.Fatal(err)
		}
		return k
	}
	k := key(base)
	if len(k) != jobs.KeyLen {
		t.Fatalf("key %q has length %d", k, len(k))
	}
	same := []string{`{"amount":1.0,"currency":"EUR"}`, `{"currency":"EUR","amount":1}`, " {\n \"currency\" : \"\\u0045UR\", \"amount\": 10e-1 } "}
	for _, args := range same {
		c := base
		c.Args = []byte(args)
		if got := key(c); got != k {
			t.Errorf("args %s: key %s, want %s", args, got, k)
		}
	}
	vary := map[string]func(*jobs.Call){
		"conversation": func(c *jobs.Call) { c.ConversationID = "conv-2" },
		"turn":         func(c *jobs.Call) { c.TurnIndex = 4 },
		"tool":         func(c *jobs.Call) { c.Tool = "void_payment" },
		"ordinal":      func(c *jobs.Call) { c.Ordinal = 1 },
		"args":         func(c *jobs.Call) { c.Args = []byte(`{"amount":2,"currency":"EUR"}`) },
	}
	for name, change := range vary {
		c := base
		change(&c)
		if key(c) == k {
			t.Errorf("changing the %s kept the key", name)
		}
	}
}

var rejectionErrors = map[string]error{
	"not_object":     jobs.ErrNotObject,
	"duplicate_name": jobs.ErrDuplicateName,
	"unsafe_integer": jobs.ErrUnsafeInteger,
	"number_range":   jobs.ErrNumberRange,
	"syntax":         jobs.ErrSyntax,
	"lone_surrogate": jobs.ErrLoneSurrogate,
	"too_deep":       jobs.ErrTooDeep,
	"invalid_utf8":   jobs.ErrInvalidUTF8,
}

type rejection struct {
	Name string
	Call struct {
		ConversationID string `json:"conversation_id"`
		TurnIndex      int64  `json:"turn_index"`
		Tool           string `json:"tool"`
		Ordinal        int64  `json:"ordinal"`
		Args           string `json:"args"`
		ArgsHex        string `json:"args_hex"`
	}
	Error string
}

func (r rejection) call(t *testing.T) jobs.Call {
	args := []byte(r.Call.Args)
	if r.Call.ArgsHex != "" {
		var err error
		if args, err = hex.DecodeString(r.Call.ArgsHex); err != nil {
			t.Fatal(err)
		}
	}
	return jobs.Call{ConversationID: r.Call.ConversationID, TurnIndex: r.Call.TurnIndex, Tool: r.Call.Tool, Ordinal: r.Call.Ordinal, Args: args}
}

func TestKeyRejections(t *testing.T) {
	t.Parallel()
	for _, r := range readJSONL[rejection](t, "testdata/reject.jsonl") {
		t.Run(r.Name, func(t *testing.T) {
			_, err := r.call(t).Key()
			if err == nil {
				t.Fatal("accepted")
			}
			if strings.Contains(err.Error(), "\n") {
				t.Errorf("error is not one line: %q", err)
			}
			if field, ok := strings.CutPrefix(r.Error, "field:"); ok {
				var fe *jobs.FieldError
				if !errors.As(err, &fe) || fe.Field != field {
					t.Fatalf("err = %v, want a FieldError on %s", err, field)
				}
				return
			}
			want := rejectionErrors[r.Error]
			if want == nil {
				t.Fatalf("unknown error class %q in the corpus", r.Error)
			}
			if !errors.Is(err, want) {
				t.Fatalf("err = %v, want %v", err, want)
			}
		})
	}
}
