package jobs_test

import (
	"bufio"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/gowebpki/jcs"

	"github.com/toolq/toolq/internal/jsontest"
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

func TestCanonicalizeRFC8785Vectors(t *testing.T) {
	t.Parallel()
	type vector struct{ Name, Input, Canonical string }
	for _, v := range readJSONL[vector](t, "testdata/rfc8785.jsonl") {
		t.Run(v.Name, func(t *testing.T) {
			got, err := jobs.Canonicalize([]byte(v.Input))
			if err != nil {
				t.Fatalf("Canonicalize: %v", err)
			}
			if string(got) != v.Canonical {
				t.Fatalf("got  %s\nwant %s", got, v.Canonical)
			}
		})
	}
}

func TestFormatNumber(t *testing.T) {
	point1, point2 := 0.1, 0.2
	point3 := point1 + point2
	t.Parallel()
	for _, tc := range []struct {
		in   float64
		want string
	}{
		{0, "0"}, {math.Copysign(0, -1), "0"}, {1, "1"}, {-1, "-1"}, {1.5, "1.5"},
		{1e21, "1e+21"}, {1e20, "100000000000000000000"}, {1e-6, "0.000001"}, {1e-7, "1e-7"},
		{123e-20, "1.23e-18"}, {-5e-324, "-5e-324"}, {math.MaxFloat64, "1.7976931348623157e+308"},
		{point3, "0.30000000000000004"}, {9007199254740992, "9007199254740992"},
	} {
		if got := jobs.FormatNumber(tc.in); got != tc.want {
			t.Errorf("FormatNumber(%v) = %s, want %s", tc.in, got, tc.want)
		}
	}
}

// TestCanonicalizeAgreesWithJCS compares the canonicalizer byte for byte with an
// independent RFC 8785 implementation on random documents that mix non-ASCII
// and astral-plane strings and names, control characters, floats in exponent
// form, negative numbers and nesting.
func TestCanonicalizeAgreesWithJCS(t *testing.T) {
	t.Parallel()
	rng := rand.New(rand.NewPCG(8785, 1))
	for i := range 3000 {
		doc := jsontest.RandomObject(rng)
		want, err := jcs.Transform([]byte(doc))
		if err != nil {
			t.Fatalf("doc %d: reference refused %s: %v", i, doc, err)
		}
		got, err := jobs.Canonicalize([]byte(doc))
		if err != nil {
			t.Fatalf("doc %d: Canonicalize(%s): %v", i, doc, err)
		}
		if string(got) != string(want) {
			t.Fatalf("doc %d: %s\n got  %s\n want %s", i, doc, got, want)
		}
	}
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

// FuzzCanonicalize checks that canonicalization never panics, is a fixed point
// (the canonical form of a canonical form is itself), always gives valid UTF-8
// JSON, and that the key ignores member order and whitespace.
func FuzzCanonicalize(f *testing.F) {
	for _, seed := range []string{`{}`, `{"a":1,"b":[1.0,"x",null]}`, `{"\ud83d\ude00":"\u0000"}`, `[1e30,-0.0]`, `{"a":{"b":{"c":[true,false]}}}`, `"\u20ac"`} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, doc []byte) {
		canon, err := jobs.Canonicalize(doc)
		if err != nil {
			return
		}
		if !utf8.Valid(canon) || !json.Valid(canon) {
			t.Fatalf("canonical form is not valid JSON: %q", canon)
		}
		again, err := jobs.Canonicalize(canon)
		if err != nil || string(again) != string(canon) {
			t.Fatalf("not a fixed point: %q -> %q (%v)", canon, again, err)
		}
		v, err := jobs.ParseStrict(doc)
		if err != nil || v.Kind != jobs.KindObject {
			return
		}
		// Reverse member order and pad with whitespace: the key must not move.
		var b strings.Builder
		b.WriteString(" {\n")
		for i := len(v.Members) - 1; i >= 0; i-- {
			name, _ := json.Marshal(v.Members[i].Name)
			value, _ := jobs.Canonicalize(mustMarshalValue(t, v.Members[i].Value))
			fmt.Fprintf(&b, "\t%s : %s", name, value)
			if i > 0 {
				b.WriteString(" ,\r\n")
			}
		}
		b.WriteString("\n} ")
		c1 := jobs.Call{ConversationID: "c", Tool: "t", Args: doc}
		c2 := jobs.Call{ConversationID: "c", Tool: "t", Args: []byte(b.String())}
		k1, err1 := c1.Key()
		k2, err2 := c2.Key()
		if err1 != nil || err2 != nil || k1 != k2 {
			t.Fatalf("reordered %q -> %q: keys %s %s (%v, %v)", doc, b.String(), k1, k2, err1, err2)
		}
	})
}

// mustMarshalValue writes a parsed value back as JSON (any spelling will do).
func mustMarshalValue(t *testing.T, v jobs.Value) []byte {
	var b strings.Builder
	var write func(v jobs.Value)
	write = func(v jobs.Value) {
		switch v.Kind {
		case jobs.KindNull:
			b.WriteString("null")
		case jobs.KindBool:
			b.WriteString(strconv.FormatBool(v.Bool))
		case jobs.KindNumber:
			b.WriteString(strconv.FormatFloat(v.Number, 'g', -1, 64))
		case jobs.KindString:
			s, _ := json.Marshal(v.String)
			b.Write(s)
		case jobs.KindArray:
			b.WriteString("[")
			for i, e := range v.Array {
				if i > 0 {
					b.WriteString(",")
				}
				write(e)
			}
			b.WriteString("]")
		case jobs.KindObject:
			b.WriteString("{")
			for i, m := range v.Members {
				if i > 0 {
					b.WriteString(",")
				}
				s, _ := json.Marshal(m.Name)
				b.Write(s)
				b.WriteString(":")
				write(m.Value)
			}
			b.WriteString("}")
		}
	}
	write(v)
	return []byte(b.String())
}
