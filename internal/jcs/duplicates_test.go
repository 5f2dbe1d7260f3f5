package jcs_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/toolq/toolq/internal/jcs"
)

// TestDuplicateNamesMatchASet: objects of 0–40 members whose names come
// from a small pool (some spelled with escapes) and nested objects; the
// duplicate check must agree with a set over the unescaped names, at the
// offset of the first repeat.
func TestDuplicateNamesMatchASet(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	spell := func(i int) (raw, name string) {
		name = fmt.Sprintf("n%d", i)
		switch r.IntN(3) {
		case 0:
			return `"` + name + `"`, name
		case 1:
			return `"\u006e` + name[1:] + `"`, name
		default:
			return `"n\u00` + fmt.Sprintf("%x", name[1]) + name[2:] + `"`, name
		}
	}
	for range 50000 {
		n := r.IntN(41)
		pool := 1 + r.IntN(60)
		var b strings.Builder
		b.WriteByte('{')
		seen := map[string]bool{}
		wantAt := -1
		for i := range n {
			if i > 0 {
				b.WriteByte(',')
			}
			raw, name := spell(r.IntN(pool))
			if seen[name] && wantAt < 0 {
				wantAt = b.Len()
			}
			seen[name] = true
			b.WriteString(raw)
			b.WriteByte(':')
			if r.IntN(4) == 0 {
				b.WriteString(`{"n1":1,"n2":2}`)
			} else {
				b.WriteString("1")
			}
		}
		b.WriteByte('}')
		doc := b.String()
		v, err := jcs.ParseStrict([]byte(doc))
		if wantAt < 0 {
			if err != nil {
				t.Fatalf("%s: %v, want no error", doc, err)
			}
			if !json.Valid(v.Canonical()) {
				t.Fatal("invalid canonical")
			}
			continue
		}
		var se *jcs.SyntaxError
		if !errors.Is(err, jcs.ErrDuplicateName) || !errors.As(err, &se) || se.Offset != wantAt {
			t.Fatalf("%s: %v, want a duplicate at %d", doc, err, wantAt)
		}
	}
}
