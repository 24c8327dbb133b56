package ort

import (
	"encoding/binary"
	"fmt"
	"reflect"
	"strings"

	onnx "github.com/yalue/onnxruntime_go"

	"github.com/ortbus/ortbus/codec"
)

// Tensor is a named tensor held in Go memory. Data is one of []float32, []float64,
// Float16, BFloat16, []int64, []int32, []int16, []int8, []uint64, []uint32, []uint16,
// []uint8, []bool or []string, with len = product of Shape; an empty Shape is a scalar
// (rank 0, one element).
type Tensor struct {
	Name  string
	Shape []int64
	Data  any
}

// Float16 is the data of a float16 tensor: each element's IEEE 754 half-precision bits.
type Float16 []uint16

// BFloat16 is the data of a bfloat16 tensor: each element's bits (a float32's top 16).
type BFloat16 []uint16

// Float32 returns the data as []float32, or nil if it is another type.
func (t Tensor) Float32() []float32 {
	v, _ := t.Data.([]float32)
	return v
}

func findTensor(ts []Tensor, name string) (Tensor, bool) {
	for _, t := range ts {
		if t.Name == name {
			return t, true
		}
	}
	return Tensor{}, false
}

func (t Tensor) value() (onnx.Value, error) {
	n := int64(1)
	for _, d := range t.Shape {
		if d < 0 {
			return nil, fmt.Errorf("shape %v has a negative dimension", t.Shape)
		}
		n *= d
	}
	rv := reflect.ValueOf(t.Data)
	if rv.Kind() != reflect.Slice {
		return nil, fmt.Errorf("unsupported tensor data %T", t.Data)
	}
	if l := int64(rv.Len()); l != n {
		return nil, fmt.Errorf("shape %v needs %d values, got %d", t.Shape, n, l)
	}
	if len(t.Shape) == 0 {
		return scalarValue(t.Data)
	}
	shape := onnx.NewShape(t.Shape...)
	switch d := t.Data.(type) {
	case []float32:
		return onnx.NewTensor(shape, d)
	case []float64:
		return onnx.NewTensor(shape, d)
	case []int64:
		return onnx.NewTensor(shape, d)
	case []int32:
		return onnx.NewTensor(shape, d)
	case []int16:
		return onnx.NewTensor(shape, d)
	case []int8:
		return onnx.NewTensor(shape, d)
	case []uint64:
		return onnx.NewTensor(shape, d)
	case []uint32:
		return onnx.NewTensor(shape, d)
	case []uint16:
		return onnx.NewTensor(shape, d)
	case []uint8:
		return onnx.NewTensor(shape, d)
	case []bool:
		return onnx.NewTensor(shape, d)
	case Float16:
		return halfValue(shape, d, onnx.TensorElementDataTypeFloat16)
	case BFloat16:
		return halfValue(shape, d, onnx.TensorElementDataTypeBFloat16)
	case []string:
		return stringValue(shape, d)
	}
	return nil, fmt.Errorf("unsupported tensor data %T", t.Data)
}

// stringValue is a string tensor of shape holding strs. onnxruntime_go hands each string
// to the runtime as a C string, so a NUL byte would silently cut it short: it is refused.
func stringValue(shape onnx.Shape, strs []string) (onnx.Value, error) {
	for i, s := range strs {
		if strings.IndexByte(s, 0) >= 0 {
			return nil, fmt.Errorf("string %d holds a NUL byte, which ONNX Runtime's string tensors (C strings, through onnxruntime_go) cannot carry", i)
		}
	}
	v, err := onnx.NewStringTensor(shape)
	if err != nil {
		return nil, err
	}
	if err := v.SetContents(strs); err != nil {
		v.Destroy()
		return nil, err
	}
	return v, nil
}

// errStringScalar: onnxruntime_go makes a string tensor only of a shape with dimensions.
var errStringScalar = fmt.Errorf("a rank-0 (scalar) string input is not supported (onnxruntime_go cannot make one); give it shape [1] in the model")

// halfValue is a float16 or bfloat16 tensor (no generic type of onnxruntime_go holds
// them): a CustomDataTensor over the elements' little-endian bytes. A zero-size tensor
// gets two bytes of backing all the same (CustomDataTensor refuses an empty buffer; the
// runtime reads none of it).
func halfValue(shape onnx.Shape, bits []uint16, typ onnx.TensorElementDataType) (onnx.Value, error) {
	b := make([]byte, 2*max(len(bits), 1))
	for i, v := range bits {
		binary.LittleEndian.PutUint16(b[2*i:], v)
	}
	return onnx.NewCustomDataTensor(shape, b, typ)
}

// errHalfScalar: onnxruntime_go makes a rank-0 value only of a Go numeric type.
var errHalfScalar = fmt.Errorf("a rank-0 (scalar) float16 or bfloat16 tensor is not supported yet (onnxruntime_go cannot make one); give it shape [1] in the model")

// scalarValue is the rank-0 value (shape []) holding data's one element: onnx.NewTensor
// refuses a shape without dimensions, and a model input declared as a scalar (Silero
// VAD's int64 sample rate "sr", for one) wants rank 0.
func scalarValue(data any) (onnx.Value, error) {
	switch d := data.(type) {
	case []float32:
		return onnx.NewScalar(d[0])
	case []float64:
		return onnx.NewScalar(d[0])
	case []int64:
		return onnx.NewScalar(d[0])
	case []int32:
		return onnx.NewScalar(d[0])
	case []int16:
		return onnx.NewScalar(d[0])
	case []int8:
		return onnx.NewScalar(d[0])
	case []uint64:
		return onnx.NewScalar(d[0])
	case []uint32:
		return onnx.NewScalar(d[0])
	case []uint16:
		return onnx.NewScalar(d[0])
	case []uint8:
		return onnx.NewScalar(d[0])
	case []bool:
		return onnx.NewScalar(d[0])
	case Float16, BFloat16:
		return nil, errHalfScalar
	case []string:
		return nil, errStringScalar
	}
	return nil, fmt.Errorf("unsupported tensor data %T", data)
}

// Returnable reports whether Session.Run can return an output of type typ (an IOInfo's
// Type): a tensor of an element type that fromValue copies. Keep it in step with
// fromValue, newScalar and newEmpty.
func Returnable(typ string) bool { return codec.KnownType(typ) } // codec.TensorTypes

// isHalf reports whether typ is float16 or bfloat16.
func isHalf(typ string) bool { return typ == "float16" || typ == "bfloat16" }

// returnable reports whether Run returns output o: every tensor of a type ortbus knows.
// (A float16 or bfloat16 output is returned preallocated when preallocHalf, else through
// a Cast to float32 in a rewritten copy of the model: see halfcast.go.)
func returnable(o IOInfo) bool { return Returnable(o.Type) }

// preallocHalf reports whether a float16 or bfloat16 output can be given to the runtime
// preallocated: its shape fully known from the model, of rank 1 or more (onnxruntime_go
// v1.27 copies a runtime-allocated tensor of these types with one byte per element, half
// of each, which fails, and makes no rank-0 value of them).
func preallocHalf(o IOInfo) bool { return len(o.Shape) > 0 && !dynamic(o.Shape) }

// fromCast turns an output the session fetched cast to float32 (halfcast.go) back into
// its own type typ, float16 or bfloat16: exactly, each value being one of typ's.
func fromCast(t Tensor, typ string) (Tensor, error) {
	f, ok := t.Data.([]float32)
	if !ok {
		return t, fmt.Errorf("output %q: the runtime returned %T for its float32 cast", t.Name, t.Data)
	}
	// Each value is typ's own and rounds to itself. (Were the runtime ever to fold the
	// model's own float32 -> half Cast with ortbus's half -> float32 one, rounding to the
	// nearest here would still give the bits that Cast gives.)
	bits := make([]uint16, len(f))
	for i, v := range f {
		if typ == "bfloat16" {
			bits[i] = codec.BFloat16Bits(v)
		} else {
			bits[i] = codec.Float16Bits(v)
		}
	}
	if typ == "bfloat16" {
		t.Data = BFloat16(bits)
	} else {
		t.Data = Float16(bits)
	}
	return t, nil
}

// newScalar is a preallocated rank-0 output of element type typ.
func newScalar(typ string) (onnx.Value, error) {
	switch typ {
	case "float32":
		return onnx.NewScalar[float32](0)
	case "float64":
		return onnx.NewScalar[float64](0)
	case "int64":
		return onnx.NewScalar[int64](0)
	case "int32":
		return onnx.NewScalar[int32](0)
	case "int16":
		return onnx.NewScalar[int16](0)
	case "int8":
		return onnx.NewScalar[int8](0)
	case "uint64":
		return onnx.NewScalar[uint64](0)
	case "uint32":
		return onnx.NewScalar[uint32](0)
	case "uint16":
		return onnx.NewScalar[uint16](0)
	case "uint8":
		return onnx.NewScalar[uint8](0)
	case "bool":
		return onnx.NewScalar(false)
	case "float16", "bfloat16":
		return nil, errHalfScalar
	case "string":
		return nil, errStringScalar
	}
	return nil, fmt.Errorf("unsupported output type %s", typ)
}

// newEmpty is a preallocated output of element type typ and a known shape (at least one
// dimension; a zero dimension makes it empty).
func newEmpty(typ string, shape []int64) (onnx.Value, error) {
	s := onnx.NewShape(shape...)
	switch typ {
	case "float32":
		return onnx.NewEmptyTensor[float32](s)
	case "float64":
		return onnx.NewEmptyTensor[float64](s)
	case "int64":
		return onnx.NewEmptyTensor[int64](s)
	case "int32":
		return onnx.NewEmptyTensor[int32](s)
	case "int16":
		return onnx.NewEmptyTensor[int16](s)
	case "int8":
		return onnx.NewEmptyTensor[int8](s)
	case "uint64":
		return onnx.NewEmptyTensor[uint64](s)
	case "uint32":
		return onnx.NewEmptyTensor[uint32](s)
	case "uint16":
		return onnx.NewEmptyTensor[uint16](s)
	case "uint8":
		return onnx.NewEmptyTensor[uint8](s)
	case "bool":
		return onnx.NewEmptyTensor[bool](s)
	case "float16":
		return halfValue(s, make([]uint16, s.FlattenedSize()), onnx.TensorElementDataTypeFloat16)
	case "bfloat16":
		return halfValue(s, make([]uint16, s.FlattenedSize()), onnx.TensorElementDataTypeBFloat16)
	case "string":
		return onnx.NewStringTensor(s)
	}
	return nil, fmt.Errorf("unsupported output type %s", typ)
}

// fromValue copies an output of element type typ into Go memory. The shape and data are
// never nil: a rank-0 output has the shape [] and one element, a zero-size one no element.
//
// A tensor's data is onnxruntime_go's own copy of the runtime's output (a Go slice that
// outlives the value's Destroy): it is taken as it is, not copied again.
func fromValue(name, typ string, v onnx.Value) (Tensor, error) {
	t := Tensor{Name: name, Shape: append([]int64{}, v.GetShape()...)}
	switch x := v.(type) {
	case *onnx.Tensor[float32]:
		t.Data = x.GetData()
	case *onnx.Tensor[float64]:
		t.Data = x.GetData()
	case *onnx.Tensor[int64]:
		t.Data = x.GetData()
	case *onnx.Tensor[int32]:
		t.Data = x.GetData()
	case *onnx.Tensor[int16]:
		t.Data = x.GetData()
	case *onnx.Tensor[int8]:
		t.Data = x.GetData()
	case *onnx.Tensor[uint64]:
		t.Data = x.GetData()
	case *onnx.Tensor[uint32]:
		t.Data = x.GetData()
	case *onnx.Tensor[uint16]:
		t.Data = x.GetData()
	case *onnx.Tensor[uint8]:
		t.Data = x.GetData()
	case *onnx.Tensor[bool]:
		t.Data = x.GetData()
	case *onnx.Scalar[float32]:
		t.Data = []float32{x.GetData()}
	case *onnx.Scalar[float64]:
		t.Data = []float64{x.GetData()}
	case *onnx.Scalar[int64]:
		t.Data = []int64{x.GetData()}
	case *onnx.Scalar[int32]:
		t.Data = []int32{x.GetData()}
	case *onnx.Scalar[int16]:
		t.Data = []int16{x.GetData()}
	case *onnx.Scalar[int8]:
		t.Data = []int8{x.GetData()}
	case *onnx.Scalar[uint64]:
		t.Data = []uint64{x.GetData()}
	case *onnx.Scalar[uint32]:
		t.Data = []uint32{x.GetData()}
	case *onnx.Scalar[uint16]:
		t.Data = []uint16{x.GetData()}
	case *onnx.Scalar[uint8]:
		t.Data = []uint8{x.GetData()}
	case *onnx.Scalar[bool]:
		t.Data = []bool{x.GetData()}
	case *onnx.StringTensor:
		// GetContents sizes its offsets by the shape's FlattenedSize, which is 0 for rank
		// 0 (it would index an empty slice): a scalar is read as its one element.
		var err error
		if len(t.Shape) == 0 {
			var one string
			one, err = x.GetElement(0)
			t.Data = []string{one}
		} else {
			t.Data, err = x.GetContents()
		}
		if err != nil {
			return t, fmt.Errorf("output %q: %w", name, err)
		}
	case *onnx.CustomDataTensor:
		if !isHalf(typ) || len(t.Shape) == 0 {
			return t, fmt.Errorf("output %q has an unsupported type %s", name, typ)
		}
		n := onnx.Shape(t.Shape).FlattenedSize()
		b := x.GetData()
		if int64(len(b)) < 2*n {
			return t, fmt.Errorf("output %q: %d bytes of data for %d %s elements", name, len(b), n, typ)
		}
		bits := make([]uint16, n)
		for i := range bits {
			bits[i] = binary.LittleEndian.Uint16(b[2*i:])
		}
		if typ == "float16" {
			t.Data = Float16(bits)
		} else {
			t.Data = BFloat16(bits)
		}
	default:
		return t, fmt.Errorf("output %q has an unsupported type %T", name, v)
	}
	return t, nil
}
