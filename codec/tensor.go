package codec

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math"
)

// Tensor is a named input or output of the raw infer op. In msgpack its data is bin
// (little-endian elements of Type); in JSON it is a number (or bool) array.
type Tensor struct {
	Type  string  `msgpack:"type" json:"type"` // float32, float64, int64, int32, uint8, bool
	Shape []int64 `msgpack:"shape" json:"shape"`
	Data  []byte  `msgpack:"data" json:"-"`
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

// ElemSize is the size in bytes of one element of a tensor type, or 0 if unknown.
func ElemSize(typ string) int {
	switch typ {
	case "float32", "int32":
		return 4
	case "float64", "int64":
		return 8
	case "uint8", "bool":
		return 1
	}
	return 0
}

// Validate checks the type, the shape and that the data length matches them.
func (t *Tensor) Validate() error {
	size := ElemSize(t.Type)
	if size == 0 {
		return fmt.Errorf("tensor type %q is not one of float32, float64, int64, int32, uint8, bool", t.Type)
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

type jsonTensor struct {
	Type  string            `json:"type"`
	Shape []int64           `json:"shape"`
	Data  []json.RawMessage `json:"data"`
}

// MarshalJSON writes the data as a number (or bool) array.
func (t *Tensor) MarshalJSON() ([]byte, error) {
	if err := t.Validate(); err != nil {
		return nil, err
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
		case "int64":
			vals[i] = int64(le.Uint64(b))
		case "int32":
			vals[i] = int32(le.Uint32(b))
		case "uint8":
			vals[i] = b[0]
		case "bool":
			vals[i] = b[0] != 0
		}
	}
	shape := t.Shape
	if shape == nil {
		shape = []int64{} // a scalar's shape is [], never null
	}
	return json.Marshal(struct {
		Type  string  `json:"type"`
		Shape []int64 `json:"shape"`
		Data  []any   `json:"data"`
	}{t.Type, shape, vals})
}

// UnmarshalJSON reads the data from a number (or bool) array.
func (t *Tensor) UnmarshalJSON(b []byte) error {
	var j jsonTensor
	if err := json.Unmarshal(b, &j); err != nil {
		return err
	}
	size := ElemSize(j.Type)
	if size == 0 {
		return fmt.Errorf("tensor type %q is not one of float32, float64, int64, int32, uint8, bool", j.Type)
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
		case "float32", "float64":
			var v float64
			err = json.Unmarshal(raw, &v)
			if j.Type == "float32" {
				le.PutUint32(d, math.Float32bits(float32(v)))
			} else {
				le.PutUint64(d, math.Float64bits(v))
			}
		default:
			var v int64
			err = json.Unmarshal(raw, &v)
			switch j.Type {
			case "int64":
				le.PutUint64(d, uint64(v))
			case "int32":
				le.PutUint32(d, uint32(int32(v)))
			case "uint8":
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
