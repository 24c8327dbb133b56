package ort

import (
	"fmt"
	"reflect"

	onnx "github.com/yalue/onnxruntime_go"
)

// Tensor is a named tensor held in Go memory. Data is one of []float32, []float64,
// []int64, []int32, []uint8 or []bool, with len = product of Shape; an empty Shape is a
// scalar (rank 0, one element).
type Tensor struct {
	Name  string
	Shape []int64
	Data  any
}

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
	case []uint8:
		return onnx.NewTensor(shape, d)
	case []bool:
		return onnx.NewTensor(shape, d)
	}
	return nil, fmt.Errorf("unsupported tensor data %T", t.Data)
}

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
	case []uint8:
		return onnx.NewScalar(d[0])
	case []bool:
		return onnx.NewScalar(d[0])
	}
	return nil, fmt.Errorf("unsupported tensor data %T", data)
}

// Returnable reports whether Session.Run can return an output of type typ (an IOInfo's
// Type): a tensor of an element type that fromValue copies. Keep it in step with
// fromValue, newScalar and newEmpty.
func Returnable(typ string) bool {
	switch typ {
	case "float32", "float64", "int64", "int32", "uint8", "bool":
		return true
	}
	return false
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
	case "uint8":
		return onnx.NewScalar[uint8](0)
	case "bool":
		return onnx.NewScalar(false)
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
	case "uint8":
		return onnx.NewEmptyTensor[uint8](s)
	case "bool":
		return onnx.NewEmptyTensor[bool](s)
	}
	return nil, fmt.Errorf("unsupported output type %s", typ)
}

// fromValue copies an output into Go memory. The shape and data are never nil: a rank-0
// output has the shape [] and one element, a zero-size one no element.
func fromValue(name string, v onnx.Value) (Tensor, error) {
	t := Tensor{Name: name, Shape: append([]int64{}, v.GetShape()...)}
	switch x := v.(type) {
	case *onnx.Tensor[float32]:
		t.Data = append([]float32{}, x.GetData()...)
	case *onnx.Tensor[float64]:
		t.Data = append([]float64{}, x.GetData()...)
	case *onnx.Tensor[int64]:
		t.Data = append([]int64{}, x.GetData()...)
	case *onnx.Tensor[int32]:
		t.Data = append([]int32{}, x.GetData()...)
	case *onnx.Tensor[uint8]:
		t.Data = append([]uint8{}, x.GetData()...)
	case *onnx.Tensor[bool]:
		t.Data = append([]bool{}, x.GetData()...)
	case *onnx.Scalar[float32]:
		t.Data = []float32{x.GetData()}
	case *onnx.Scalar[float64]:
		t.Data = []float64{x.GetData()}
	case *onnx.Scalar[int64]:
		t.Data = []int64{x.GetData()}
	case *onnx.Scalar[int32]:
		t.Data = []int32{x.GetData()}
	case *onnx.Scalar[uint8]:
		t.Data = []uint8{x.GetData()}
	case *onnx.Scalar[bool]:
		t.Data = []bool{x.GetData()}
	default:
		return t, fmt.Errorf("output %q has an unsupported type %T", name, v)
	}
	return t, nil
}
