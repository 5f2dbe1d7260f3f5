package bench

import (
	"bytes"
	"compress/gzip"
	"encoding/binary"
	"io"
	"os"
	"testing"
)

// decodedProfile is what the tests read of a profile file (profile.proto,
// gzipped): each sample type's total, and when it was taken and for how
// long.
type decodedProfile struct {
	totals                   map[string]int64 // by sample type
	timeNanos, durationNanos int64
}

// readProfile decodes the profile file at path.
func readProfile(t *testing.T, path string) decodedProfile {
	t.Helper()
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	zr, err := gzip.NewReader(bytes.NewReader(raw))
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	data, err := io.ReadAll(zr)
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	var types [][2]int64 // string indexes: type, unit
	var samples [][]int64
	var strs []string
	p := decodedProfile{totals: map[string]int64{}}
	eachField(t, data, func(field int, wire int, v uint64, b []byte) {
		switch field {
		case 1: // sample_type
			var vt [2]int64
			eachField(t, b, func(f, w int, v uint64, _ []byte) {
				if f == 1 || f == 2 {
					vt[f-1] = int64(v)
				}
			})
			types = append(types, vt)
		case 2: // sample
			var values []int64
			eachField(t, b, func(f, w int, v uint64, packed []byte) {
				if f != 2 {
					return
				}
				if w == 0 {
					values = append(values, int64(v))
					return
				}
				for len(packed) > 0 {
					x, n := binary.Uvarint(packed)
					values = append(values, int64(x))
					packed = packed[n:]
				}
			})
			samples = append(samples, values)
		case 6: // string_table
			strs = append(strs, string(b))
		case 9:
			p.timeNanos = int64(v)
		case 10:
			p.durationNanos = int64(v)
		}
	})
	for _, values := range samples {
		for i, v := range values {
			if i < len(types) {
				p.totals[strs[types[i][0]]] += v
			}
		}
	}
	return p
}

// eachField calls f with each field of the protobuf message data: its
// number, its wire type and its varint or its bytes.
func eachField(t *testing.T, data []byte, f func(field, wire int, v uint64, b []byte)) {
	t.Helper()
	for len(data) > 0 {
		key, n := binary.Uvarint(data)
		if n <= 0 {
			t.Fatal("bad profile: key")
		}
		data = data[n:]
		field, wire := int(key>>3), int(key&7)
		switch wire {
		case 0:
			v, n := binary.Uvarint(data)
			if n <= 0 {
				t.Fatal("bad profile: varint")
			}
			data = data[n:]
			f(field, wire, v, nil)
		case 2:
			l, n := binary.Uvarint(data)
			if n <= 0 || int(l) > len(data)-n {
				t.Fatal("bad profile: length")
			}
			f(field, wire, 0, data[n:n+int(l)])
			data = data[n+int(l):]
		case 1:
			data = data[8:]
		case 5:
			data = data[4:]
		default:
			t.Fatalf("bad profile: wire type %d", wire)
		}
	}
}
