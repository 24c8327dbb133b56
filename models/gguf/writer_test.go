package gguf

import (
	"bytes"
	"errors"
	"os"
	"reflect"
	"strings"
	"testing"
)

// sample is a file with a value of every type and tensors of both types, the second of
// an odd size so the third needs padding before it.
func sample() *File {
	seq := func(dst []byte) {
		for i := range dst {
			dst[i] = byte(i*7 + 1)
		}
	}
	return &File{
		KVs: []KV{
			{"u8", uint8(200)}, {"i8", int8(-5)}, {"u16", uint16(60000)}, {"i16", int16(-300)},
			{"u32", uint32(1 << 31)}, {"i32", int32(-70000)}, {"f32", float32(1.5)}, {"bool", true},
			{"str", "héllo"}, {"u64", uint64(1 << 40)}, {"i64", int64(-1 << 40)}, {"f64", 2.25},
			{"general.alignment", uint32(64)},
			{"a.u8", []uint8{1, 2}}, {"a.i8", []int8{-1}}, {"a.u16", []uint16{3}}, {"a.i16", []int16{-4}},
			{"a.u32", []uint32{5, 6}}, {"a.i32", []int32{-7}}, {"a.f32", []float32{0.5, -0.25}},
			{"a.bool", []bool{true, false}}, {"a.str", []string{"x", "", "yz"}}, {"a.u64", []uint64{8}},
			{"a.i64", []int64{-9}}, {"a.f64", []float64{1e300}}, {"a.empty", []string{}},
		},
		Tensors: []Tensor{
			{Name: "m", Dims: []uint64{3, 2}, Type: F32, Fill: seq},
			{Name: "odd", Dims: []uint64{5}, Type: F16, Fill: seq},
			{Name: "after", Dims: []uint64{4}, Type: F32, Fill: seq},
		},
		Alignment: 64,
	}
}

func TestRoundTrip(t *testing.T) {
	f := sample()
	var buf bytes.Buffer
	n, err := f.WriteTo(&buf)
	if err != nil {
		t.Fatal(err)
	}
	size, err := f.Size()
	if err != nil || uint64(n) != size || int(n) != buf.Len() {
		t.Fatalf("wrote %d bytes (buffer %d), Size says %d (%v)", n, buf.Len(), size, err)
	}
	if !bytes.HasPrefix(buf.Bytes(), []byte("GGUF\x03\x00\x00\x00")) {
		t.Fatalf("file starts % x, want GGUF and version 3", buf.Bytes()[:8])
	}
	h, err := ReadHeader(bytes.NewReader(buf.Bytes()), DefaultLimits)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(h.KVs, f.KVs) {
		t.Fatalf("metadata read back differs:\n got %#v\nwant %#v", h.KVs, f.KVs)
	}
	if h.DataOffset%64 != 0 {
		t.Fatalf("data section at %d, not aligned to 64", h.DataOffset)
	}
	if len(h.Tensors) != len(f.Tensors) {
		t.Fatalf("%d tensor infos read back, want %d", len(h.Tensors), len(f.Tensors))
	}
	for i, ti := range h.Tensors {
		w := &f.Tensors[i]
		if ti.Name != w.Name || !reflect.DeepEqual(ti.Dims, w.Dims) || ti.Type != w.Type || ti.Offset%64 != 0 {
			t.Fatalf("tensor %d read back as %+v, want %s %v type %d at an offset aligned to 64", i, ti, w.Name, w.Dims, w.Type)
		}
		want := make([]byte, w.Bytes())
		w.Fill(want)
		start := h.DataOffset + ti.Offset
		if got := buf.Bytes()[start : start+w.Bytes()]; !bytes.Equal(got, want) {
			t.Fatalf("tensor %s's data at %d is % x, want % x", w.Name, start, got, want)
		}
	}
	if h.Tensors[1].Offset != 64 || h.Tensors[2].Offset != 128 {
		t.Fatalf("tensors at %d, %d, want 64, 128 (each starts aligned)", h.Tensors[1].Offset, h.Tensors[2].Offset)
	}
}

func TestWriteRefuses(t *testing.T) {
	for name, f := range map[string]*File{
		"value type": {KVs: []KV{{"k", struct{}{}}}},
		"nested":     {KVs: []KV{{"k", [][]string{{"a"}}}}},
		"no fill":    {Tensors: []Tensor{{Name: "t", Dims: []uint64{1}, Type: F32}}},
		"type":       {Tensors: []Tensor{{Name: "t", Dims: []uint64{1}, Type: 2, Fill: func([]byte) {}}}},
	} {
		if _, err := f.WriteTo(&bytes.Buffer{}); err == nil {
			t.Errorf("%s: written without an error", name)
		}
	}
}

// TestWriteError is that a failing writer's error comes back.
func TestWriteError(t *testing.T) {
	boom := errors.New("disk full")
	for _, n := range []int{0, 100, 1000} { // in the header, the metadata, the data
		left := n
		if _, err := sample().WriteTo(failAfter{n: &left, err: boom}); !errors.Is(err, boom) {
			t.Fatalf("WriteTo failing after %d bytes = %v, want %v", n, err, boom)
		}
	}
}

// failAfter accepts n bytes, then fails.
type failAfter struct {
	n   *int
	err error
}

func (w failAfter) Write(p []byte) (int, error) {
	if len(p) > *w.n {
		k := *w.n
		*w.n = 0
		return k, w.err
	}
	*w.n -= len(p)
	return len(p), nil
}

func TestWriteFile(t *testing.T) {
	path := t.TempDir() + "/m.gguf"
	if err := sample().WriteFile(path); err != nil {
		t.Fatal(err)
	}
	h, err := ReadHeaderFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if h.Get("str") != "héllo" || h.Get("missing") != nil {
		t.Fatalf("Get: str %v, missing %v", h.Get("str"), h.Get("missing"))
	}
	// A failing write leaves no file behind: not the target, not the temporary one.
	bad := &File{KVs: []KV{{"k", struct{}{}}}}
	dir := t.TempDir()
	if err := bad.WriteFile(dir + "/x.gguf"); err == nil || !strings.Contains(err.Error(), "unsupported") {
		t.Fatalf("WriteFile of a bad file = %v", err)
	}
	if left, _ := os.ReadDir(dir); len(left) != 0 {
		t.Fatalf("a failed WriteFile left %v behind", left)
	}
	if st, err := os.Stat(path); err != nil || st.Mode().Perm() != 0o644 {
		t.Fatalf("written file: %v, %v (want mode 0644)", st, err)
	}
}
