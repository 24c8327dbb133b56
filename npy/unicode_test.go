package npy

import (
	"bytes"
	"encoding/binary"
	"slices"
	"strings"
	"testing"

	"github.com/ortbus/ortbus/codec"
)

func utf32(units ...uint32) []byte {
	var b []byte
	for _, u := range units {
		b = binary.LittleEndian.AppendUint32(b, u)
	}
	return b
}

// TestUnicode reads a '<U{n}' file laid out as np.save(np.array([["ab", "c"], ["", "é😀"]]))
// writes it (UTF-32LE, NUL-padded to the widest element), and writes it back byte for byte.
func TestUnicode(t *testing.T) {
	data := utf32('a', 'b', 'c', 0, 0, 0, 0xe9, 0x1f600)
	b := file(1, "{'descr': '<U2', 'fortran_order': False, 'shape': (2, 2), }", data)
	tn, err := Decode(b)
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"ab", "c", "", "é😀"}; tn.Type != "string" || !slices.Equal(tn.Shape, []int64{2, 2}) || !slices.Equal(tn.Strings, want) || len(tn.Data) != 0 {
		t.Fatalf("got %+v, want strings %q", tn, want)
	}
	out, err := Encode(tn)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(out, b) {
		t.Errorf("Encode wrote\n%q\nwant\n%q", out, b)
	}
	// A NUL inside an element stays; a scalar; an empty array; all-empty strings are '<U1'.
	for _, c := range []*codec.Tensor{
		{Type: "string", Shape: []int64{1}, Strings: []string{"a\x00b"}},
		{Type: "string", Shape: []int64{}, Strings: []string{"scalar"}},
		{Type: "string", Shape: []int64{0, 4}},
		{Type: "string", Shape: []int64{3}, Strings: []string{"", "", ""}},
	} {
		b, err := Encode(c)
		if err != nil {
			t.Fatalf("%+v: %v", c, err)
		}
		back, err := Decode(b)
		if err != nil {
			t.Fatalf("%+v: %v", c, err)
		}
		if back.Type != "string" || !slices.Equal(back.Shape, c.Shape) || len(back.Strings) != len(c.Strings) || !slices.Equal(back.Strings, c.Strings) && len(c.Strings) > 0 {
			t.Errorf("round trip of %+v = %+v", c, back)
		}
	}
	if !Writable("string") {
		t.Error("string is not Writable")
	}
	// Refused for writing: a trailing NUL (NumPy would strip it), and data over the limit.
	if _, err := Encode(&codec.Tensor{Type: "string", Shape: []int64{1}, Strings: []string{"a\x00"}}); err == nil || !strings.Contains(err.Error(), "ends with U+0000") {
		t.Errorf("trailing NUL: %v", err)
	}
	wide := make([]string, MaxUnicodeData/4/1024+1)
	wide[0] = strings.Repeat("x", 1024)
	if _, err := HeaderOf(&codec.Tensor{Type: "string", Shape: []int64{int64(len(wide))}, Strings: wide}); err == nil || !strings.Contains(err.Error(), "over the limit") {
		t.Errorf("padded data over the limit: %v", err)
	}
}

// TestUnicodeRefusals: every byte is hostile. Itemsizes that are no number, zero, or huge;
// lengths at their maximum; code units that are no Unicode scalar value; data of the
// wrong size: each is a clear error, never a panic nor an allocation the file cannot pay.
func TestUnicodeRefusals(t *testing.T) {
	hdr := func(descr, shape string) string {
		return "{'descr': '" + descr + "', 'fortran_order': False, 'shape': " + shape + ", }"
	}
	for _, c := range []struct {
		name string
		b    []byte
		want string
	}{
		{"no itemsize", file(1, hdr("<U", "(1,)"), utf32('a')), "not a decimal number"},
		{"itemsize zero", file(1, hdr("<U0", "(268435456,)"), nil), "outside 1 to"},
		{"itemsize over the limit", file(1, hdr("<U67108865", "(1,)"), nil), "outside 1 to"},
		{"itemsize over int64", file(1, hdr("<U99999999999999999999", "(1,)"), nil), "not a decimal number"},
		{"itemsize with a sign", file(1, hdr("<U+4", "(1,)"), utf32('a', 'b', 'c', 'd')), "not a decimal number"},
		{"itemsize in hex", file(1, hdr("<U0x4", "(1,)"), utf32('a', 'b', 'c', 'd')), "not a decimal number"},
		{"big-endian", file(1, hdr(">U1", "(1,)"), []byte{0, 0, 0, 'a'}), `dtype ">U1" is not supported`},
		{"bytes dtype", file(1, hdr("|S1", "(1,)"), []byte{'a'}), `dtype "|S1" is not supported`},
		{"max itemsize, max elements", file(1, hdr("<U67108864", "(268435456,)"), utf32('a')), "declares <U67108864 [268435456] (72057594037927936 bytes of data), but the file holds 4"},
		{"elements over the limit", file(1, hdr("<U1", "(268435457,)"), nil), "more than 268435456 elements"},
		{"shape overflow", file(1, hdr("<U1", "(4294967296, 4294967296, 16)"), nil), "more than 268435456 elements"},
		{"data short", file(1, hdr("<U2", "(2,)"), utf32('a', 'b', 'c')), "the file holds 12"},
		{"data long", file(1, hdr("<U1", "(1,)"), utf32('a', 'b')), "the file holds 8"},
		{"data not whole code units", file(1, hdr("<U1", "(1,)"), []byte{'a', 0, 0}), "the file holds 3"},
		{"over U+10FFFF", file(1, hdr("<U2", "(1,)"), utf32('a', 0x110000)), "element 0 holds 0x110000 at code point 1"},
		{"all ones", file(1, hdr("<U1", "(2,)"), utf32('a', 0xffffffff)), "element 1 holds 0xffffffff"},
		{"high surrogate", file(1, hdr("<U1", "(1,)"), utf32(0xd800)), "surrogate"},
		{"low surrogate", file(1, hdr("<U1", "(1,)"), utf32(0xdfff)), "surrogate"},
		{"fortran order", file(1, "{'descr': '<U1', 'fortran_order': True, 'shape': (2, 2), }", utf32('a', 'b', 'c', 'd')), "fortran_order is True"},
	} {
		t.Run(c.name, func(t *testing.T) {
			tn, err := Decode(c.b)
			if err == nil {
				t.Fatalf("accepted: %+v", tn)
			}
			if !strings.Contains(err.Error(), c.want) {
				t.Errorf("error %q does not say %q", err, c.want)
			}
		})
	}
	// The largest code point and the edges of the surrogates are read.
	tn, err := Decode(file(1, hdr("<U3", "(1,)"), utf32(0x10ffff, 0xd7ff, 0xe000)))
	if err != nil || tn.Strings[0] != "\U0010ffff\ud7ff\ue000" {
		t.Errorf("edges: %+v, %v", tn, err)
	}
}
