package gguf

import (
	"bytes"
	"encoding/binary"
	"errors"
	"testing"
)

func header(t testing.TB) []byte {
	t.Helper()
	var buf bytes.Buffer
	if _, err := sample().WriteTo(&buf); err != nil {
		t.Fatal(err)
	}
	h, err := ReadHeader(bytes.NewReader(buf.Bytes()), DefaultLimits)
	if err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()[:h.DataOffset]
}

// TestReadTruncated is that every cut of a valid header before its last byte is a format
// error, not a panic nor a header.
func TestReadTruncated(t *testing.T) {
	b := header(t)
	// The header proper ends before its padding; cuts inside the padding are complete.
	full, _ := ReadHeader(bytes.NewReader(b), DefaultLimits)
	last := full.Tensors[len(full.Tensors)-1]
	end := headerEnd(t, b, last)
	for n := 0; n < end; n++ {
		if _, err := ReadHeader(bytes.NewReader(b[:n]), DefaultLimits); !errors.Is(err, ErrFormat) {
			t.Fatalf("cut at %d of %d: %v, want a format error", n, end, err)
		}
	}
}

// headerEnd is where the header of b ends: after the last tensor info's offset field.
func headerEnd(t *testing.T, b []byte, last TensorInfo) int {
	t.Helper()
	i := bytes.LastIndex(b, []byte(last.Name))
	if i < 0 {
		t.Fatal("last tensor's name not in the header")
	}
	return i + len(last.Name) + 4 + 8*len(last.Dims) + 4 + 8
}

// TestReadForged is that forged counts and sizes are refused within the limits, before
// anything of that size is allocated.
func TestReadForged(t *testing.T) {
	u32 := func(v uint32) []byte { return binary.LittleEndian.AppendUint32(nil, v) }
	u64 := func(v uint64) []byte { return binary.LittleEndian.AppendUint64(nil, v) }
	cat := func(parts ...[]byte) []byte { return bytes.Join(parts, nil) }
	start := func(tensors, kvs uint64) []byte { return cat([]byte("GGUF"), u32(3), u64(tensors), u64(kvs)) }
	key := cat(u64(1), []byte("k"))
	for name, b := range map[string][]byte{
		"magic":        cat([]byte("GGUG"), u32(3), u64(0), u64(0)),
		"version":      cat([]byte("GGUF"), u32(2), u64(0), u64(0)),
		"tensors":      start(1<<62, 0),
		"kvs":          start(0, 1<<62),
		"key length":   cat(start(0, 1), u64(1<<62)),
		"value type":   cat(start(0, 1), key, u32(99)),
		"array length": cat(start(0, 1), key, u32(uint32(TypeArray)), u32(uint32(TypeUint8)), u64(1<<62)),
		"array type":   cat(start(0, 1), key, u32(uint32(TypeArray)), u32(uint32(TypeArray)), u64(1)),
		"array short":  cat(start(0, 1), key, u32(uint32(TypeArray)), u32(uint32(TypeUint32)), u64(1000), u32(1)),
		"bool":         cat(start(0, 1), key, u32(uint32(TypeBool)), []byte{2}),
		"dims":         cat(start(1, 0), u64(1), []byte("t"), u32(1<<30)),
		"alignment":    cat(start(0, 1), cat(u64(17), []byte("general.alignment")), u32(uint32(TypeUint32)), u32(48)),
	} {
		if _, err := ReadHeader(bytes.NewReader(b), DefaultLimits); !errors.Is(err, ErrFormat) {
			t.Errorf("%s: %v, want a format error", name, err)
		}
	}
	// The whole-header budget holds too.
	small := DefaultLimits
	small.MaxTotalMeta = 100
	if _, err := ReadHeader(bytes.NewReader(header(t)), small); !errors.Is(err, ErrFormat) {
		t.Errorf("header over MaxTotalMeta: %v, want a format error", err)
	}
}

// FuzzReadHeader: any input is read without a panic, within the limits; one that reads
// has its data section after the fixed header, aligned.
func FuzzReadHeader(f *testing.F) {
	f.Add(header(f))
	f.Add([]byte("GGUF\x03\x00\x00\x00"))
	f.Fuzz(func(t *testing.T, b []byte) {
		lim := DefaultLimits
		lim.MaxTotalMeta = 1 << 20
		h, err := ReadHeader(bytes.NewReader(b), lim)
		if err != nil {
			return
		}
		if h.DataOffset < 24 || h.DataOffset%DefaultAlignment != 0 && h.Get("general.alignment") == nil {
			t.Fatalf("data offset %d: before the end of the fixed header, or not aligned", h.DataOffset)
		}
	})
}
