package codec

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"math"
	"slices"
	"testing"
)

// typedSamples are, for each tensor type, little-endian elements of shape [2,3] with the
// edges of the type (its minimum and maximum, a negative, a fraction for the floats) and,
// for the JSON round trip, the numbers JSON must write for them.
func typedSamples() map[string]struct {
	data []byte
	json string
} {
	le := binary.LittleEndian
	put := func(size int, f func(b []byte, i int)) []byte {
		b := make([]byte, 6*size)
		for i := range 6 {
			f(b[i*size:], i)
		}
		return b
	}
	f16 := []float32{0, 1, -2.5, 0.099975586, 65504, -0.0009765625}
	bf16 := []float32{0, 1, -2.5, 0.099609375, 3.3895314e+38, -1.1754944e-38}
	i8 := []int8{0, 1, -1, 100, math.MinInt8, math.MaxInt8}
	i16 := []int16{0, 1, -1, 1000, math.MinInt16, math.MaxInt16}
	u16 := []uint16{0, 1, 2, 1000, 40000, math.MaxUint16}
	u32 := []uint32{0, 1, 2, 1000, 3000000000, math.MaxUint32}
	u64 := []uint64{0, 1, 2, 1 << 40, 1 << 63, math.MaxUint64}
	return map[string]struct {
		data []byte
		json string
	}{
		"float16":  {put(2, func(b []byte, i int) { le.PutUint16(b, Float16Bits(f16[i])) }), "[0,1,-2.5,0.099975586,65504,-0.0009765625]"},
		"bfloat16": {put(2, func(b []byte, i int) { le.PutUint16(b, BFloat16Bits(bf16[i])) }), "[0,1,-2.5,0.099609375,3.3895314e+38,-1.1754944e-38]"},
		"int8":     {put(1, func(b []byte, i int) { b[0] = byte(i8[i]) }), "[0,1,-1,100,-128,127]"},
		"int16":    {put(2, func(b []byte, i int) { le.PutUint16(b, uint16(i16[i])) }), "[0,1,-1,1000,-32768,32767]"},
		"uint16":   {put(2, func(b []byte, i int) { le.PutUint16(b, u16[i]) }), "[0,1,2,1000,40000,65535]"},
		"uint32":   {put(4, func(b []byte, i int) { le.PutUint32(b, u32[i]) }), "[0,1,2,1000,3000000000,4294967295]"},
		"uint64":   {put(8, func(b []byte, i int) { le.PutUint64(b, u64[i]) }), "[0,1,2,1099511627776,9223372036854775808,18446744073709551615]"},
	}
}

// TestTensorTypes: every tensor type round-trips through msgpack (its raw bytes) and JSON
// (numbers, written as expected), and Validate knows its element size.
func TestTensorTypes(t *testing.T) {
	for typ, s := range typedSamples() {
		in := &Tensor{Type: typ, Shape: []int64{2, 3}, Data: s.data}
		if err := in.Validate(); err != nil {
			t.Fatalf("%s: %v", typ, err)
		}
		b, err := Marshal(in)
		if err != nil {
			t.Fatal(err)
		}
		var mp Tensor
		if err := Unmarshal(b, &mp); err != nil || mp.Type != typ || !slices.Equal(mp.Shape, in.Shape) || !bytes.Equal(mp.Data, in.Data) {
			t.Errorf("%s msgpack round trip: %+v, %v", typ, mp, err)
		}
		j, err := json.Marshal(in)
		if err != nil {
			t.Fatalf("%s: %v", typ, err)
		}
		want := `{"type":"` + typ + `","shape":[2,3],"data":` + s.json + `}`
		if string(j) != want {
			t.Errorf("%s JSON = %s, want %s", typ, j, want)
		}
		var js Tensor
		if err := json.Unmarshal(j, &js); err != nil || js.Type != typ || !bytes.Equal(js.Data, in.Data) {
			t.Errorf("%s JSON round trip: %+v, %v (want data %v)", typ, js, err, in.Data)
		}
		short := &Tensor{Type: typ, Shape: []int64{2, 3}, Data: s.data[1:]}
		if short.Validate() == nil {
			t.Errorf("%s: a short data validated", typ)
		}
	}
}

// TestTensorJSONRanges: a JSON number outside its integer type is refused, never wrapped;
// a float16 or bfloat16 number is rounded to the nearest value of the type.
func TestTensorJSONRanges(t *testing.T) {
	for _, c := range []string{
		`{"type":"int8","shape":[1],"data":[128]}`,
		`{"type":"uint8","shape":[1],"data":[-1]}`,
		`{"type":"int16","shape":[1],"data":[40000]}`,
		`{"type":"uint16","shape":[1],"data":[65536]}`,
		`{"type":"uint32","shape":[1],"data":[-1]}`,
		`{"type":"uint64","shape":[1],"data":[-1]}`,
		`{"type":"uint64","shape":[1],"data":[1.5]}`,
		`{"type":"int32","shape":[1],"data":[2147483648]}`,
	} {
		var x Tensor
		if err := json.Unmarshal([]byte(c), &x); err == nil {
			t.Errorf("%s: accepted as %v", c, x.Data)
		}
	}
	var x Tensor
	if err := json.Unmarshal([]byte(`{"type":"float16","shape":[2],"data":[0.1,70000]}`), &x); err != nil {
		t.Fatal(err)
	}
	if got := [2]uint16{binary.LittleEndian.Uint16(x.Data), binary.LittleEndian.Uint16(x.Data[2:])}; got != [2]uint16{0x2e66, 0x7c00} {
		t.Errorf("float16 0.1, 70000 = %#04x, want 0x2e66 and +Inf 0x7c00", got)
	}
	if err := json.Unmarshal([]byte(`{"type":"bfloat16","shape":[2],"data":[0.1,1.00390625]}`), &x); err != nil {
		t.Fatal(err)
	}
	// 0.1 is 0x3dcccccd as a float32: rounded up to 0x3dcd; 1.00390625 (0x3f808000) is a
	// tie, rounded to even 0x3f80.
	if got := [2]uint16{binary.LittleEndian.Uint16(x.Data), binary.LittleEndian.Uint16(x.Data[2:])}; got != [2]uint16{0x3dcd, 0x3f80} {
		t.Errorf("bfloat16 0.1, 1.00390625 = %#04x, want 0x3dcd, 0x3f80", got)
	}
	if BFloat16Value(0x3f80) != 1 || Float16Value(0x3c00) != 1 || math.Float32bits(BFloat16Value(BFloat16Bits(float32(math.NaN()))))>>16 != 0x7fc0 {
		t.Error("bfloat16/float16 value helpers")
	}
}
