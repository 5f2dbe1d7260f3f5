package bench

import (
	"bytes"
	"compress/gzip"
	"encoding/binary"
	"io"
	"os"
	"strings"
	"testing"
)

// decodedProfile is what the tests read of a profile file (profile.proto,
// gzipped): its samples with their stacks' function names, and when it was
// taken and for how long.
type decodedProfile struct {
	types                    []string // the sample types, in the order of a sample's values
	samples                  []decodedSample
	timeNanos, durationNanos int64
}

// decodedSample is one sample: its values and the functions of its stack.
type decodedSample struct {
	values []int64
	funcs  []string
}

// total is the sum of the samples' values of sampleType, of the samples
// with a function whose name contains within in their stack (any sample
// for "").
func (p decodedProfile) total(sampleType, within string) int64 {
	i := -1
	for j, t := range p.types {
		if t == sampleType {
			i = j
		}
	}
	var sum int64
	for _, s := range p.samples {
		if i < 0 || i >= len(s.values) {
			continue
		}
		if within == "" || strings.Contains(strings.Join(s.funcs, "\n"), within) {
			sum += s.values[i]
		}
	}
	return sum
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
	var typeNames []uint64 // string indexes
	type sample struct{ values, locations []uint64 }
	var samples []sample
	locFuncs := map[uint64][]uint64{} // location id: function ids
	funcNames := map[uint64]uint64{}  // function id: string index
	var strs []string
	var p decodedProfile
	eachField(t, data, func(field int, wire int, v uint64, b []byte) {
		switch field {
		case 1: // sample_type: ValueType{type, unit}
			eachField(t, b, func(f, _ int, v uint64, _ []byte) {
				if f == 1 {
					typeNames = append(typeNames, v)
				}
			})
		case 2: // sample: Sample{location_id, value}
			var s sample
			eachField(t, b, func(f, w int, v uint64, packed []byte) {
				switch f {
				case 1:
					s.locations = varints(w, v, packed, s.locations)
				case 2:
					s.values = varints(w, v, packed, s.values)
				}
			})
			samples = append(samples, s)
		case 4: // location: Location{id, …, line: Line{function_id}}
			var id uint64
			var funcs []uint64
			eachField(t, b, func(f, _ int, v uint64, line []byte) {
				switch f {
				case 1:
					id = v
				case 4:
					eachField(t, line, func(f, _ int, v uint64, _ []byte) {
						if f == 1 {
							funcs = append(funcs, v)
						}
					})
				}
			})
			locFuncs[id] = funcs
		case 5: // function: Function{id, name}
			var id, name uint64
			eachField(t, b, func(f, _ int, v uint64, _ []byte) {
				switch f {
				case 1:
					id = v
				case 2:
					name = v
				}
			})
			funcNames[id] = name
		case 6: // string_table
			strs = append(strs, string(b))
		case 9:
			p.timeNanos = int64(v)
		case 10:
			p.durationNanos = int64(v)
		}
	})
	for _, i := range typeNames {
		p.types = append(p.types, strs[i])
	}
	for _, s := range samples {
		var d decodedSample
		for _, v := range s.values {
			d.values = append(d.values, int64(v))
		}
		for _, loc := range s.locations {
			for _, fn := range locFuncs[loc] {
				d.funcs = append(d.funcs, strs[funcNames[fn]])
			}
		}
		p.samples = append(p.samples, d)
	}
	return p
}

// varints appends to into a field's varint, or its packed varints.
func varints(wire int, v uint64, packed []byte, into []uint64) []uint64 {
	if wire == 0 {
		return append(into, v)
	}
	for len(packed) > 0 {
		x, n := binary.Uvarint(packed)
		if n <= 0 {
			break
		}
		into = append(into, x)
		packed = packed[n:]
	}
	return into
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
