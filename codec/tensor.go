package codec

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math"
	"strings"
	"unicode/utf8"

	"github.com/x448/float16"
)

// Tensor is a named input or output of the raw infer op. In msgpack its data is bin
// (little-endian elements of Type); in JSON it is a number (or bool) array. float16 and
// bfloat16 travel as their raw 16-bit elements in msgpack and as numbers in JSON (a number
// read is rounded to the nearest value of the type). A string tensor's data is an array of
// str in msgpack and of strings in JSON, held in Strings (Data stays empty); see
// tensor_msgpack.go for its msgpack form.
type Tensor struct {
	Type  string  `msgpack:"type" json:"type"` // one of TensorTypes
	Shape []int64 `msgpack:"shape" json:"shape"`
	Data  []byte  `msgpack:"data" json:"-"`
	// Strings are the elements of a string tensor (Type "string"), in C order: valid
	// UTF-8, at most MaxStringBytes bytes in all. Empty for every other type.
	Strings []string `msgpack:"-" json:"-"`
}

// MaxTensorElems bounds the number of elements of a tensor (2^28: 1 GiB of float32).
const MaxTensorElems = 1 << 28

// Elements is the number of elements of a tensor of shape: an error for a negative
// dimension or a count over MaxTensorElems, checked before each multiplication so that it
// cannot overflow. A zero dimension makes the count 0 whatever the others are.
func Elements(shape []int64) (int64, error) {
	n := int64(1)
	for _, d := range shape {
		if d < 0 {
			return 0, fmt.Errorf("tensor shape %v has a negative dimension", shape)
		}
	}
	for _, d := range shape {
		if d == 0 {
			return 0, nil
		}
	}
	for _, d := range shape {
		if d > MaxTensorElems/n {
			return 0, fmt.Errorf("tensor shape %v has more than %d elements", shape, MaxTensorElems)
		}
		n *= d
	}
	return n, nil
}

// MaxStringBytes bounds the UTF-8 bytes of a string tensor's elements, all together
// (256 MiB; the element count is bounded by MaxTensorElems like any tensor's).
const MaxStringBytes = 1 << 28

// TensorTypes are the element types of a Tensor: ONNX Runtime's numeric tensor types and
// string.
var TensorTypes = []string{"float32", "float64", "float16", "bfloat16", "int64", "int32", "int16", "int8", "uint64", "uint32", "uint16", "uint8", "bool", "string"}

// KnownType reports whether typ is one of TensorTypes.
func KnownType(typ string) bool { return ElemSize(typ) > 0 || typ == "string" }

// ElemSize is the size in bytes of one element of a tensor type, or 0 if unknown or
// string (whose elements have no fixed size: see KnownType).
func ElemSize(typ string) int {
	switch typ {
	case "float64", "int64", "uint64":
		return 8
	case "float32", "int32", "uint32":
		return 4
	case "float16", "bfloat16", "int16", "uint16":
		return 2
	case "int8", "uint8", "bool":
		return 1
	}
	return 0
}

func unknownType(typ string) error {
	return fmt.Errorf("tensor type %q is not one of %s", typ, strings.Join(TensorTypes, ", "))
}

// Validate checks the type, the shape and that the data length matches them. A string
// tensor has exactly one element in Strings per element of its shape, no Data, valid
// UTF-8 throughout and at most MaxStringBytes bytes in all; any other has no Strings.
func (t *Tensor) Validate() error {
	if t.Type == "string" {
		return t.validateStrings()
	}
	if len(t.Strings) > 0 {
		return fmt.Errorf("tensor of type %s has string elements: its data is bytes", t.Type)
	}
	size := ElemSize(t.Type)
	if size == 0 {
		return unknownType(t.Type)
	}
	n, err := Elements(t.Shape)
	if err != nil {
		return err
	}
	if int64(len(t.Data)) != n*int64(size) {
		return fmt.Errorf("tensor of shape %v and type %s needs %d bytes of data, got %d", t.Shape, t.Type, n*int64(size), len(t.Data))
	}
	return nil
}

func (t *Tensor) validateStrings() error {
	n, err := Elements(t.Shape)
	if err != nil {
		return err
	}
	if len(t.Data) > 0 {
		return fmt.Errorf("string tensor has %d bytes of data: its data is an array of strings", len(t.Data))
	}
	if int64(len(t.Strings)) != n {
		return fmt.Errorf("string tensor of shape %v needs %d strings, got %d", t.Shape, n, len(t.Strings))
	}
	total := 0
	for i, s := range t.Strings {
		if total += len(s); total > MaxStringBytes {
			return fmt.Errorf("string tensor has more than %d bytes of strings", MaxStringBytes)
		}
		if !utf8.ValidString(s) {
			return fmt.Errorf("string %d of the tensor is not valid UTF-8", i)
		}
	}
	return nil
}

type jsonTensor struct {
	Type  string            `json:"type"`
	Shape []int64           `json:"shape"`
	Data  []json.RawMessage `json:"data"`
}

// MarshalJSON writes the data as a number (or bool, or string) array.
func (t *Tensor) MarshalJSON() ([]byte, error) {
	if err := t.Validate(); err != nil {
		return nil, err
	}
	if t.Type == "string" {
		return json.Marshal(struct {
			Type  string   `json:"type"`
			Shape []int64  `json:"shape"`
			Data  []string `json:"data"`
		}{t.Type, nonNilShape(t.Shape), append([]string{}, t.Strings...)})
	}
	size := ElemSize(t.Type)
	vals := make([]any, len(t.Data)/size)
	le := binary.LittleEndian
	for i := range vals {
		b := t.Data[i*size:]
		switch t.Type {
		case "float32":
			vals[i] = math.Float32frombits(le.Uint32(b))
		case "float64":
			vals[i] = math.Float64frombits(le.Uint64(b))
		case "float16":
			vals[i] = float16.Frombits(le.Uint16(b)).Float32()
		case "bfloat16":
			vals[i] = BFloat16Value(le.Uint16(b))
		case "int64":
			vals[i] = int64(le.Uint64(b))
		case "int32":
			vals[i] = int32(le.Uint32(b))
		case "int16":
			vals[i] = int16(le.Uint16(b))
		case "int8":
			vals[i] = int8(b[0])
		case "uint64":
			vals[i] = le.Uint64(b)
		case "uint32":
			vals[i] = le.Uint32(b)
		case "uint16":
			vals[i] = le.Uint16(b)
		case "uint8":
			vals[i] = b[0]
		case "bool":
			vals[i] = b[0] != 0
		}
	}
	return json.Marshal(struct {
		Type  string  `json:"type"`
		Shape []int64 `json:"shape"`
		Data  []any   `json:"data"`
	}{t.Type, nonNilShape(t.Shape), vals})
}

// nonNilShape is shape, or [] for nil: a scalar's shape is [], never null.
func nonNilShape(shape []int64) []int64 {
	if shape == nil {
		return []int64{}
	}
	return shape
}

// UnmarshalJSON reads the data from a number (or bool, or string) array.
func (t *Tensor) UnmarshalJSON(b []byte) error {
	var j jsonTensor
	if err := json.Unmarshal(b, &j); err != nil {
		return err
	}
	if j.Type == "string" {
		strs := make([]string, len(j.Data))
		for i, raw := range j.Data {
			if err := json.Unmarshal(raw, &strs[i]); err != nil {
				return fmt.Errorf("tensor data value %d: %w", i, err)
			}
		}
		*t = Tensor{Type: j.Type, Shape: j.Shape, Strings: strs}
		return nil
	}
	size := ElemSize(j.Type)
	if size == 0 {
		return unknownType(j.Type)
	}
	data := make([]byte, len(j.Data)*size)
	le := binary.LittleEndian
	for i, raw := range j.Data {
		d := data[i*size:]
		var err error
		switch j.Type {
		case "bool":
			var v bool
			err = json.Unmarshal(raw, &v)
			if v {
				d[0] = 1
			}
		case "float32", "float64", "float16", "bfloat16":
			var v float64
			err = json.Unmarshal(raw, &v)
			switch j.Type {
			case "float32":
				le.PutUint32(d, math.Float32bits(float32(v)))
			case "float64":
				le.PutUint64(d, math.Float64bits(v))
			case "float16":
				le.PutUint16(d, float16.Fromfloat32(float32(v)).Bits())
			case "bfloat16":
				le.PutUint16(d, bfloat16Bits(float32(v)))
			}
		case "uint64":
			var v uint64
			err = json.Unmarshal(raw, &v)
			le.PutUint64(d, v)
		default:
			var v int64
			err = json.Unmarshal(raw, &v)
			if lo, hi := intRange(j.Type); err == nil && (v < lo || v > hi) {
				err = fmt.Errorf("%d is out of the range of %s", v, j.Type)
			}
			switch j.Type {
			case "int64":
				le.PutUint64(d, uint64(v))
			case "int32", "uint32":
				le.PutUint32(d, uint32(v))
			case "int16", "uint16":
				le.PutUint16(d, uint16(v))
			case "int8", "uint8":
				d[0] = uint8(v)
			}
		}
		if err != nil {
			return fmt.Errorf("tensor data value %d: %w", i, err)
		}
	}
	*t = Tensor{Type: j.Type, Shape: j.Shape, Data: data}
	return nil
}

// bfloat16Bits is the bfloat16 nearest to v (round to nearest, ties to even), the top 16
// bits of a float32; a NaN stays a (quiet) NaN.
func bfloat16Bits(v float32) uint16 {
	b := math.Float32bits(v)
	if v != v {
		return uint16(b>>16) | 0x40
	}
	b += 0x7fff + (b>>16)&1
	return uint16(b >> 16)
}

// BFloat16Bits is the bfloat16 nearest to v, as its bits (round to nearest even).
func BFloat16Bits(v float32) uint16 { return bfloat16Bits(v) }

// BFloat16Value is the float32 value of a bfloat16's bits (exact).
func BFloat16Value(bits uint16) float32 { return math.Float32frombits(uint32(bits) << 16) }

// Float16Bits is the IEEE 754 half-precision float nearest to v, as its bits.
func Float16Bits(v float32) uint16 { return float16.Fromfloat32(v).Bits() }

// Float16Value is the float32 value of a float16's bits (exact).
func Float16Value(bits uint16) float32 { return float16.Frombits(bits).Float32() }

// intRange is the range of an integer tensor type of at most 32 bits (int64's otherwise).
func intRange(typ string) (lo, hi int64) {
	switch typ {
	case "int32":
		return math.MinInt32, math.MaxInt32
	case "uint32":
		return 0, math.MaxUint32
	case "int16":
		return math.MinInt16, math.MaxInt16
	case "uint16":
		return 0, math.MaxUint16
	case "int8":
		return math.MinInt8, math.MaxInt8
	case "uint8":
		return 0, math.MaxUint8
	}
	return math.MinInt64, math.MaxInt64
}
