package jcs_test

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"unicode/utf8"

	refjcs "github.com/gowebpki/jcs"

	"github.com/toolq/toolq/internal/jcs"
	"github.com/toolq/toolq/internal/jsontest"
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
	for _, v := range readJSONL[vector](t, "../../jobs/testdata/rfc8785.jsonl") {
		t.Run(v.Name, func(t *testing.T) {
			got, err := jcs.Canonicalize([]byte(v.Input))
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
		if got := jcs.FormatNumber(tc.in); got != tc.want {
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
		want, err := refjcs.Transform([]byte(doc))
		if err != nil {
			t.Fatalf("doc %d: reference refused %s: %v", i, doc, err)
		}
		got, err := jcs.Canonicalize([]byte(doc))
		if err != nil {
			t.Fatalf("doc %d: Canonicalize(%s): %v", i, doc, err)
		}
		if string(got) != string(want) {
			t.Fatalf("doc %d: %s\n got  %s\n want %s", i, doc, got, want)
		}
	}
}

// FuzzCanonicalize checks that canonicalization never panics, is a fixed point
// (the canonical form of a canonical form is itself), always gives valid UTF-8
// JSON, and that the canonical form of an object (the key's input) ignores
// member order and whitespace.
func FuzzCanonicalize(f *testing.F) {
	for _, seed := range []string{`{}`, `{"a":1,"b":[1.0,"x",null]}`, `{"\ud83d\ude00":"\u0000"}`, `[1e30,-0.0]`, `{"a":{"b":{"c":[true,false]}}}`, `"\u20ac"`} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, doc []byte) {
		canon, err := jcs.Canonicalize(doc)
		if err != nil {
			return
		}
		if !utf8.Valid(canon) || !json.Valid(canon) {
			t.Fatalf("canonical form is not valid JSON: %q", canon)
		}
		again, err := jcs.Canonicalize(canon)
		if err != nil || string(again) != string(canon) {
			t.Fatalf("not a fixed point: %q -> %q (%v)", canon, again, err)
		}
		v, err := jcs.ParseStrict(doc)
		if err != nil || v.Kind != jcs.KindObject {
			return
		}
		// Reverse member order and pad with whitespace: the canonical form, and
		// so the key hashed from it, must not move.
		var b strings.Builder
		b.WriteString(" {\n")
		for i := len(v.Members) - 1; i >= 0; i-- {
			name, _ := json.Marshal(v.Members[i].Name)
			value, _ := jcs.Canonicalize(mustMarshalValue(t, v.Members[i].Value))
			fmt.Fprintf(&b, "\t%s : %s", name, value)
			if i > 0 {
				b.WriteString(" ,\r\n")
			}
		}
		b.WriteString("\n} ")
		c1, err1 := jcs.CanonicalizeObject(doc)
		c2, err2 := jcs.CanonicalizeObject([]byte(b.String()))
		if err1 != nil || err2 != nil || string(c1) != string(c2) {
			t.Fatalf("reordered %q -> %q: canonical %s %s (%v, %v)", doc, b.String(), c1, c2, err1, err2)
		}
	})
}

// mustMarshalValue writes a parsed value back as JSON (any spelling will do).
func mustMarshalValue(t *testing.T, v jcs.Value) []byte {
	var b strings.Builder
	var write func(v jcs.Value)
	write = func(v jcs.Value) {
		switch v.Kind {
		case jcs.KindNull:
			b.WriteString("null")
		case jcs.KindBool:
			b.WriteString(strconv.FormatBool(v.Bool))
		case jcs.KindNumber:
			b.WriteString(strconv.FormatFloat(v.Number, 'g', -1, 64))
		case jcs.KindString:
			s, _ := json.Marshal(v.String)
			b.Write(s)
		case jcs.KindArray:
			b.WriteString("[")
			for i, e := range v.Array {
				if i > 0 {
					b.WriteString(",")
				}
				write(e)
			}
			b.WriteString("]")
		case jcs.KindObject:
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

// TestDuplicateNamesAtAnySize: a repeated member name is refused wherever it
// is and however many members come before it (small objects are scanned,
// large ones use a set from the 16th member on), and however it is spelled.
func TestDuplicateNamesAtAnySize(t *testing.T) {
	for _, n := range []int{1, 2, 15, 16, 17, 40} {
		for _, dupOf := range []int{0, n / 2, n - 1} {
			var b strings.Builder
			b.WriteByte('{')
			for i := range n {
				fmt.Fprintf(&b, `"m%d":%d,`, i, i)
			}
			fmt.Fprintf(&b, `"\u006d%d":true}`, dupOf) // "m<dupOf>" spelled with an escape
			if _, err := jcs.ParseStrict([]byte(b.String())); !errors.Is(err, jcs.ErrDuplicateName) {
				t.Errorf("%d members, a second m%d: err %v, want ErrDuplicateName", n, dupOf, err)
			}
			ok := strings.Replace(b.String(), fmt.Sprintf(`"\u006d%d"`, dupOf), `"other"`, 1)
			if _, err := jcs.ParseStrict([]byte(ok)); err != nil {
				t.Errorf("%d members, all distinct: %v", n, err)
			}
		}
	}
}

// TestMemberRawAndCanonical: a member's Raw is its value as written, and
// Value.Canonical is what Canonicalize gives for the same text.
func TestMemberRawAndCanonical(t *testing.T) {
	doc := `{ "b" : [1, 2.50, "\u00e9"] , "a":{"y":null,"x":true} }`
	v, err := jcs.ParseStrict([]byte(doc))
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"b": `[1, 2.50, "\u00e9"]`, "a": `{"y":null,"x":true}`}
	for _, m := range v.Members {
		if string(m.Raw) != want[m.Name] {
			t.Errorf("member %s: Raw %q, want %q", m.Name, m.Raw, want[m.Name])
		}
		canon, err := jcs.Canonicalize(m.Raw)
		if err != nil {
			t.Fatal(err)
		}
		if got := m.Value.Canonical(); string(got) != string(canon) {
			t.Errorf("member %s: Canonical %s, Canonicalize %s", m.Name, got, canon)
		}
	}
	if canon, _ := jcs.Canonicalize([]byte(doc)); string(v.Canonical()) != string(canon) {
		t.Errorf("document: Canonical %s, Canonicalize %s", v.Canonical(), canon)
	}
}

// TestInstanceIsWhatASchemaValidatorWouldDecode checks that the instance built
// from a strict parse is the one encoding/json decodes from the same document
// with UseNumber (what a JSON Schema validator takes): every kind, every
// member, and numbers as their literals, so that a schema's multipleOf or
// maximum sees the number written, not its nearest double.
func TestInstanceIsWhatASchemaValidatorWouldDecode(t *testing.T) {
	t.Parallel()
	rng := rand.New(rand.NewPCG(8785, 2))
	docs := []string{`{"a":0.30,"b":1e2,"c":-0,"d":[1.50,{"e":null}],"f":"\u00e9","g":true}`, `{}`, `{"x":[]}`}
	for range 3000 {
		docs = append(docs, jsontest.RandomObject(rng))
	}
	for i, doc := range docs {
		v, err := jcs.ParseStrict([]byte(doc))
		if err != nil {
			t.Fatalf("doc %d: ParseStrict(%s): %v", i, doc, err)
		}
		dec := json.NewDecoder(strings.NewReader(doc))
		dec.UseNumber()
		var want any
		if err := dec.Decode(&want); err != nil {
			t.Fatalf("doc %d: encoding/json refused %s: %v", i, doc, err)
		}
		if got := v.Instance(); !reflect.DeepEqual(got, want) {
			t.Fatalf("doc %d: %s\n got  %#v\n want %#v", i, doc, got, want)
		}
	}
}
