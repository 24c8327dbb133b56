package npy

import (
	"bytes"
	"encoding/binary"
	"math"
	"slices"
	"strings"
	"testing"
	"unicode/utf8"
	"unsafe"

	"github.com/ortbus/ortbus/codec"
)

// file builds a .npy file: version major.0, header dict padded as NumPy pads it (spaces
// and a newline to a multiple of 64), then data.
func file(major byte, dict string, data []byte) []byte {
	start := 10
	if major != 1 {
		start = 12
	}
	h := dict + " "
	for (start+len(h)+1)%64 != 0 {
		h += " "
	}
	h += "\n"
	b := append([]byte(Magic), major, 0)
	if major == 1 {
		b = binary.LittleEndian.AppendUint16(b, uint16(len(h)))
	} else {
		b = binary.LittleEndian.AppendUint32(b, uint32(len(h)))
	}
	return append(append(b, h...), data...)
}

func f32(v ...float32) []byte {
	var b []byte
	for _, x := range v {
		b = binary.LittleEndian.AppendUint32(b, math.Float32bits(x))
	}
	return b
}

// TestDecodeNumPy reads files laid out as np.save writes them (version 1.0, NumPy's own
// header spelling, including the spaces it leaves for the shape to grow).
func TestDecodeNumPy(t *testing.T) {
	dict := "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }" + strings.Repeat(" ", 20)
	b := file(1, dict, f32(0, 1, 2, 3, 4, 5))
	if len(b) != 128+24 {
		t.Fatalf("fixture is %d bytes", len(b))
	}
	tn, err := Decode(b)
	if err != nil {
		t.Fatal(err)
	}
	if tn.Type != "float32" || len(tn.Shape) != 2 || tn.Shape[0] != 2 || tn.Shape[1] != 3 || !bytes.Equal(tn.Data, f32(0, 1, 2, 3, 4, 5)) {
		t.Errorf("got %+v", tn)
	}
	// Versions 2.0 and 3.0 (a 4-byte header length), double quotes, a Python 2 long, no
	// trailing comma, a 1-D shape.
	for _, major := range []byte{2, 3} {
		b := file(major, `{"descr": "<i8", "shape": (2L,), "fortran_order": False}`, binary.LittleEndian.AppendUint64(binary.LittleEndian.AppendUint64(nil, 7), math.MaxUint64))
		tn, err := Decode(b)
		if err != nil {
			t.Fatalf("version %d: %v", major, err)
		}
		if tn.Type != "int64" || len(tn.Shape) != 1 || tn.Shape[0] != 2 || len(tn.Data) != 16 {
			t.Errorf("version %d: got %+v", major, tn)
		}
	}
	// A scalar, an empty array, and a Fortran-order array whose bytes are C order's too.
	for _, c := range []struct {
		dict string
		data []byte
		n    int
	}{
		{"{'descr': '|u1', 'fortran_order': False, 'shape': (), }", []byte{9}, 0},
		{"{'descr': '|b1', 'fortran_order': False, 'shape': (0, 5), }", nil, 2},
		{"{'descr': '<f4', 'fortran_order': True, 'shape': (1, 3, 1), }", f32(1, 2, 3), 3},
	} {
		tn, err := Decode(file(1, c.dict, c.data))
		if err != nil {
			t.Errorf("%s: %v", c.dict, err)
			continue
		}
		if len(tn.Shape) != c.n || !bytes.Equal(tn.Data, c.data) {
			t.Errorf("%s: got %+v", c.dict, tn)
		}
	}
}

// TestRoundTrip: every tensor type and a range of shapes survive Encode and Decode, and
// the file is padded to 64 bytes as NumPy pads it.
func TestRoundTrip(t *testing.T) {
	for _, c := range []struct {
		typ   string
		shape []int64
	}{
		{"float32", []int64{1, 3, 4, 4}},
		{"float64", []int64{5}},
		{"int64", []int64{2, 2}},
		{"int32", []int64{}},
		{"uint8", []int64{3, 0}},
		{"bool", []int64{7, 1}},
		{"float16", []int64{2, 3}},
		{"int16", []int64{4}},
		{"int8", []int64{}},
		{"uint64", []int64{1, 2}},
		{"uint32", []int64{3}},
		{"uint16", []int64{0}},
		{"float32", []int64{1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2}},
	} {
		n, err := codec.Elements(c.shape)
		if err != nil {
			t.Fatal(err)
		}
		data := make([]byte, n*int64(codec.ElemSize(c.typ)))
		for i := range data {
			data[i] = byte(i * 7)
			if c.typ == "bool" {
				data[i] &= 1
			}
		}
		in := &codec.Tensor{Type: c.typ, Shape: c.shape, Data: data}
		b, err := Encode(in)
		if err != nil {
			t.Fatalf("%s %v: %v", c.typ, c.shape, err)
		}
		h, err := ParseHeader(b)
		if err != nil {
			t.Fatalf("%s %v: %v", c.typ, c.shape, err)
		}
		if h.DataOffset%64 != 0 || h.Major != 1 || b[h.DataOffset-1] != '\n' {
			t.Errorf("%s %v: data at %d, version %d, header ends %q", c.typ, c.shape, h.DataOffset, h.Major, b[h.DataOffset-1])
		}
		out, err := Decode(b)
		if err != nil {
			t.Fatalf("%s %v: %v", c.typ, c.shape, err)
		}
		if out.Type != in.Type || len(out.Shape) != len(in.Shape) || !bytes.Equal(out.Data, in.Data) {
			t.Errorf("%s %v: got back %s %v (%d bytes)", c.typ, c.shape, out.Type, out.Shape, len(out.Data))
		}
		for i := range in.Shape {
			if out.Shape[i] != in.Shape[i] {
				t.Errorf("%s %v: shape back %v", c.typ, c.shape, out.Shape)
			}
		}
		var buf bytes.Buffer
		if err := Write(&buf, in); err != nil || !bytes.Equal(buf.Bytes(), b) {
			t.Errorf("%s %v: Write differs from Encode (%v)", c.typ, c.shape, err)
		}
	}
	// What Decode refuses, Encode does not write.
	if _, err := Encode(&codec.Tensor{Type: "float32", Shape: make([]int64, MaxRank+1)}); err == nil {
		t.Error("Encode wrote a tensor of more than MaxRank dimensions")
	}
	if _, err := Encode(&codec.Tensor{Type: "bfloat16", Shape: []int64{2}, Data: []byte{0, 0}}); err == nil {
		t.Error("Encode wrote a bfloat16 tensor whose data does not match its shape")
	}
	if _, err := Encode(&codec.Tensor{Type: "float32", Shape: []int64{2}, Data: f32(1)}); err == nil {
		t.Error("Encode wrote a tensor whose data does not match its shape")
	}
}

// TestRefusals: each malformed or unsupported file is refused with a message that names
// the fault, and never panics.
func TestRefusals(t *testing.T) {
	good := "{'descr': '<f4', 'fortran_order': False, 'shape': (2,), }"
	hugeLen := append([]byte(Magic), 2, 0)
	hugeLen = binary.LittleEndian.AppendUint32(hugeLen, 0xffffffff)
	beyond := append([]byte(Magic), 1, 0)
	beyond = binary.LittleEndian.AppendUint16(beyond, 500)
	beyond = append(beyond, "{'descr': '<f4'"...)
	for _, c := range []struct {
		name string
		b    []byte
		want string
	}{
		{"empty", nil, "magic"},
		{"bad magic", append([]byte("\x93NUMPZ\x01\x00\x10\x00"), make([]byte, 16)...), "magic"},
		{"PNG", []byte("\x89PNG\r\n\x1a\n"), "magic"},
		{"magic alone", []byte(Magic), "magic"},
		{"truncated length", []byte(Magic + "\x01\x00\x05"), "truncated header length"},
		{"version 4.0", file(4, good, f32(1, 2))[:12], "version 4.0"},
		{"version 1.1", append([]byte(Magic), 1, 1, 0, 0), "version 1.1"},
		{"huge header length", hugeLen, "over the limit"},
		{"header length beyond the file", beyond, "more than the"},
		{"shape product overflow", file(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (4294967296, 4294967296, 16), }", nil), "more than 268435456 elements"},
		{"shape over the element limit", file(1, "{'descr': '|u1', 'fortran_order': False, 'shape': (268435457,), }", nil), "more than 268435456 elements"},
		{"dimension over int64", file(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (99999999999999999999,), }", nil), "too large"},
		{"negative dimension", file(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (-1,), }", nil), "non-negative"},
		{"data too short", file(1, good, f32(1)), "declares float32 [2] (8 bytes of data), but the file holds 4"},
		{"data too long", file(1, good, f32(1, 2, 3)), "the file holds 12"},
		{"fortran order", file(1, "{'descr': '<f4', 'fortran_order': True, 'shape': (2, 2), }", f32(1, 2, 3, 4)), "fortran_order is True"},
		{"big-endian float16", file(1, "{'descr': '>f2', 'fortran_order': False, 'shape': (2,), }", []byte{0, 0, 0, 0}), `dtype ">f2" is not supported`},
		{"complex", file(1, "{'descr': '<c8', 'fortran_order': False, 'shape': (1,), }", f32(1, 2)), `dtype "<c8" is not supported`},
		{"big-endian", file(1, "{'descr': '>f4', 'fortran_order': False, 'shape': (2,), }", f32(1, 2)), `dtype ">f4" is not supported`},
		{"float16 short", file(1, "{'descr': '<f2', 'fortran_order': False, 'shape': (2,), }", []byte{0, 0, 0}), "declares float16 [2] (4 bytes of data), but the file holds 3"},
		{"object", file(1, "{'descr': '|O', 'fortran_order': False, 'shape': (2,), }", make([]byte, 16)), `dtype "|O" is not supported`},
		{"structured", file(1, "{'descr': [('a', '<f4')], 'fortran_order': False, 'shape': (2,), }", f32(1, 2)), "structured"},
		{"unknown key", file(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (2,), 'x': 1}", f32(1, 2)), "unknown key"},
		{"duplicate key", file(1, "{'descr': '<f4', 'descr': '<f4', 'fortran_order': False, 'shape': (2,)}", f32(1, 2)), "twice"},
		{"missing key", file(1, "{'descr': '<f4', 'shape': (2,)}", f32(1, 2)), `"fortran_order" is missing`},
		{"fortran_order not a bool", file(1, "{'descr': '<f4', 'fortran_order': 0, 'shape': (2,)}", f32(1, 2)), "not True or False"},
		{"shape not a tuple", file(1, "{'descr': '<f4', 'fortran_order': False, 'shape': [2]}", f32(1, 2)), "not a tuple"},
		{"shape of a float", file(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (2.0,)}", f32(1, 2)), "expected ',' or ')'"},
		{"rank over the limit", file(1, "{'descr': '<f4', 'fortran_order': False, 'shape': ("+strings.Repeat("1,", MaxRank+1)+")}", f32(1)), "more than 64 dimensions"},
		{"escape in a string", file(1, `{'descr': '<f\x34', 'fortran_order': False, 'shape': (1,)}`, f32(1)), "printable ASCII"},
		{"unterminated string", append([]byte(Magic+"\x01\x00\x0c\x00"), "{'descr': '<f4"...), "unterminated"},
		{"not a dict", file(1, "['<f4', False, (2,)]", f32(1, 2)), "expected '{'"},
		{"after the dict", file(1, good+" x", f32(1, 2)), "after the dict"},
		{"unclosed dict", file(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (2,)", f32(1, 2)), "expected ',' or '}'"},
		{"a NUL in the header", file(1, "{'descr': '<f4',\x00 'fortran_order': False, 'shape': (2,)}", f32(1, 2)), "expected a string"},
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
}

// FuzzNPY: Decode never panics; what it accepts is consistent (the data is exactly the
// shape's size, a slice of the input, not a copy: Decode allocates nothing in proportion
// to what a header claims) and survives Encode and Decode unchanged.
func FuzzNPY(f *testing.F) {
	for _, typ := range []string{"float32", "float64", "int64", "int32", "uint8", "bool"} {
		b, err := Encode(&codec.Tensor{Type: typ, Shape: []int64{2, 1}, Data: make([]byte, 2*codec.ElemSize(typ))})
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Add(file(2, "{'descr': '<f4', 'fortran_order': True, 'shape': (1, 2), }", f32(1, 2)))
	f.Add(file(3, `{"descr": "<i4", "fortran_order": False, "shape": (), }`, []byte{1, 0, 0, 0}))
	f.Add(file(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (4294967296, 4294967296, 16), }", nil))
	f.Add(append([]byte(Magic), 2, 0, 0xff, 0xff, 0xff, 0x7f))
	// Unicode: a good one, a surrogate, an itemsize at its limit, lengths at their maximum.
	f.Add(file(1, "{'descr': '<U2', 'fortran_order': False, 'shape': (2,), }", []byte{'a', 0, 0, 0, 0, 0, 0, 0, 0xe9, 0, 0, 0, 0, 0xf6, 1, 0}))
	f.Add(file(1, "{'descr': '<U1', 'fortran_order': False, 'shape': (1,), }", []byte{0, 0xd8, 0, 0}))
	f.Add(file(1, "{'descr': '<U67108864', 'fortran_order': False, 'shape': (268435456,), }", nil))
	f.Add(file(2, "{'descr': '<U0', 'fortran_order': False, 'shape': (0,), }", nil))
	f.Fuzz(func(t *testing.T, b []byte) {
		tn, err := Decode(b)
		if err != nil {
			return
		}
		n, err := codec.Elements(tn.Shape)
		if err != nil || int64(len(tn.Data)) != n*int64(codec.ElemSize(tn.Type)) {
			t.Fatalf("accepted %s %v with %d bytes of data (%v)", tn.Type, tn.Shape, len(tn.Data), err)
		}
		if len(tn.Shape) > MaxRank {
			t.Fatalf("accepted %d dimensions", len(tn.Shape))
		}
		if tn.Type == "string" {
			var total int
			for _, s := range tn.Strings {
				if !utf8.ValidString(s) {
					t.Fatalf("accepted a string that is not UTF-8: %q", s)
				}
				total += len(s)
			}
			if int64(len(tn.Strings)) != n || total > len(b) {
				t.Fatalf("accepted %d strings (%d bytes) for %v from %d bytes", len(tn.Strings), total, tn.Shape, len(b))
			}
		}
		if len(tn.Data) > 0 {
			p, lo, hi := uintptr(unsafe.Pointer(&tn.Data[0])), uintptr(unsafe.Pointer(&b[0])), uintptr(unsafe.Pointer(&b[len(b)-1]))
			if p < lo || p > hi {
				t.Fatal("the data is a copy, not a slice of the file")
			}
		}
		again, err := Encode(tn)
		if err != nil {
			t.Fatalf("re-encode: %v", err)
		}
		back, err := Decode(again)
		if err != nil {
			t.Fatalf("decode of the re-encoding: %v", err)
		}
		if back.Type != tn.Type || !bytes.Equal(back.Data, tn.Data) || len(back.Shape) != len(tn.Shape) || !slices.Equal(back.Strings, tn.Strings) {
			t.Fatalf("round trip changed %s %v into %s %v", tn.Type, tn.Shape, back.Type, back.Shape)
		}
	})
}

// TestNewDtypes reads the dtypes of the types added for every ONNX Runtime numeric tensor
// as np.save spells them ('|i1', '<i2', '<u2', '<u4', '<u8', '<f2', and '<V2' for
// ml_dtypes' bfloat16) and writes them back with the same spelling.
func TestNewDtypes(t *testing.T) {
	for descr, typ := range map[string]string{"|i1": "int8", "<i2": "int16", "<u2": "uint16", "<u4": "uint32", "<u8": "uint64", "<f2": "float16", "<V2": "bfloat16"} {
		size := codec.ElemSize(typ)
		data := make([]byte, 3*size)
		for i := range data {
			data[i] = byte(0xf0 + i)
		}
		b := file(1, "{'descr': '"+descr+"', 'fortran_order': False, 'shape': (3,), }", data)
		tn, err := Decode(b)
		if err != nil {
			t.Fatalf("%s: %v", descr, err)
		}
		if tn.Type != typ || len(tn.Shape) != 1 || tn.Shape[0] != 3 || !bytes.Equal(tn.Data, data) {
			t.Errorf("%s: got %+v", descr, tn)
		}
		out, err := Encode(tn)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(out, b) {
			t.Errorf("%s: Encode wrote\n%q\nwant\n%q", descr, out, b)
		}
	}
	// The other spellings of bfloat16 read: '|V2' (a void has no byte order), and
	// 'bfloat16' (a header written by hand from str(dtype), the ml_dtypes workaround).
	one := []byte{0x80, 0x3f} // 1.0
	for _, descr := range []string{"|V2", "bfloat16"} {
		tn, err := Decode(file(1, "{'descr': '"+descr+"', 'fortran_order': False, 'shape': (), }", one))
		if err != nil || tn.Type != "bfloat16" || len(tn.Shape) != 0 || !bytes.Equal(tn.Data, one) {
			t.Errorf("%s: %+v, %v", descr, tn, err)
		}
	}
	// Other voids are not bfloat16.
	for _, descr := range []string{"<V4", "|V1", "<V"} {
		if _, err := Decode(file(1, "{'descr': '"+descr+"', 'fortran_order': False, 'shape': (1,), }", make([]byte, 4))); err == nil {
			t.Errorf("%s read", descr)
		}
	}
	for _, typ := range []string{"bfloat16", "float16", "uint64", "string"} {
		if !Writable(typ) {
			t.Errorf("%s is not Writable", typ)
		}
	}
}
