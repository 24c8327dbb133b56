// Package onnxgen writes small ONNX models with deterministic weights and the
// input/output contracts of the real models the app uses (PixAI tagger, CCIP
// feature + metrics, YOLOv8-style person detector, isnetis segmenter), plus a
// tiny model for overhead benchmarks.
//
// The models are built in Go (no Python, no network) by a minimal ModelProto
// writer (this file) so that tests and the demo can assert exactly what a
// given image is tagged with, and so that every machine produces the same
// bytes. ref.go computes each model's output in pure Go, so a test can compare
// a runtime's answer with the expected one.
package onnxgen

import (
	"encoding/binary"
	"fmt"
	"math"
	"os"
	"path/filepath"

	"google.golang.org/protobuf/encoding/protowire"
)

// IR version and opset written into every model: IR 8 with the default ONNX
// domain at opset 17 loads in ONNX Runtime 1.24 and 1.30 alike.
const (
	IRVersion = 8
	Opset     = 17
)

// DataType is an ONNX TensorProto element type.
type DataType int32

// Element types (TensorProto.DataType values): every numeric type of ONNX Runtime, and
// string.
const (
	Float    DataType = 1
	Uint8    DataType = 2
	Int8     DataType = 3
	Uint16   DataType = 4
	Int16    DataType = 5
	Int32    DataType = 6
	Int64    DataType = 7
	String   DataType = 8
	Bool     DataType = 9
	Float16  DataType = 10
	Double   DataType = 11
	Uint32   DataType = 12
	Uint64   DataType = 13
	BFloat16 DataType = 16
)

// DataTypes maps ortbus's tensor type names (codec.Tensor's Type) to ONNX element types.
var DataTypes = map[string]DataType{
	"float32": Float, "float64": Double, "float16": Float16, "bfloat16": BFloat16,
	"int64": Int64, "int32": Int32, "int16": Int16, "int8": Int8,
	"uint64": Uint64, "uint32": Uint32, "uint16": Uint16, "uint8": Uint8, "bool": Bool,
	"string": String,
}

// Field numbers from onnx.proto (only those the writer needs).
const (
	// ModelProto
	modelIRVersion       = 1
	modelProducerName    = 2
	modelProducerVersion = 3
	modelGraph           = 7
	modelOpsetImport     = 8
	// OperatorSetIdProto
	opsetDomain  = 1
	opsetVersion = 2
	// GraphProto
	graphNode        = 1
	graphName        = 2
	graphInitializer = 5
	graphInput       = 11
	graphOutput      = 12
	// NodeProto
	nodeInput     = 1
	nodeOutput    = 2
	nodeName      = 3
	nodeOpType    = 4
	nodeAttribute = 5
	// AttributeProto
	attrName    = 1
	attrF       = 2
	attrI       = 3
	attrS       = 4
	attrT       = 5
	attrFloats  = 7
	attrInts    = 8
	attrStrings = 9
	attrType    = 20
	// TensorProto
	tensorDims     = 1
	tensorDataType = 2
	tensorName     = 8
	tensorRawData  = 9
	// ValueInfoProto
	valueName = 1
	valueType = 2
	// TypeProto / TypeProto.Tensor / TensorShapeProto / Dimension
	typeTensor     = 1
	tensorElemType = 1
	tensorShape    = 2
	shapeDim       = 1
	dimValue       = 1
	dimParam       = 2
	// TypeProto.sequence_type / TypeProto.Sequence
	typeSequence     = 4
	sequenceElemType = 1
)

// AttributeProto.AttributeType values.
const (
	attrTypeFloat   = 1
	attrTypeInt     = 2
	attrTypeString  = 3
	attrTypeTensor  = 4
	attrTypeFloats  = 6
	attrTypeInts    = 7
	attrTypeStrings = 8
)

// Tensor is a constant tensor: a graph initializer or a TENSOR attribute.
// Raw holds the little-endian element bytes (TensorProto.raw_data).
type Tensor struct {
	Name string
	Type DataType
	Dims []int64
	Raw  []byte
}

// FloatTensor returns a float32 tensor. It panics when len(data) does not
// match the product of dims (a programming error in a model definition).
func FloatTensor(name string, dims []int64, data []float32) Tensor {
	checkCount(name, dims, len(data))
	raw := make([]byte, 4*len(data))
	for i, v := range data {
		binary.LittleEndian.PutUint32(raw[4*i:], math.Float32bits(v))
	}
	return Tensor{Name: name, Type: Float, Dims: append([]int64(nil), dims...), Raw: raw}
}

// Int64Tensor returns an int64 tensor; it panics on a dims/data mismatch.
func Int64Tensor(name string, dims []int64, data []int64) Tensor {
	checkCount(name, dims, len(data))
	raw := make([]byte, 8*len(data))
	for i, v := range data {
		binary.LittleEndian.PutUint64(raw[8*i:], uint64(v))
	}
	return Tensor{Name: name, Type: Int64, Dims: append([]int64(nil), dims...), Raw: raw}
}

func checkCount(name string, dims []int64, n int) {
	want := int64(1)
	for _, d := range dims {
		want *= d
	}
	if want != int64(n) {
		panic(fmt.Sprintf("onnxgen: tensor %q: dims %v hold %d elements, got %d", name, dims, want, n))
	}
}

// Attr is one node attribute. Build it with AttrFloat, AttrInt, AttrString,
// AttrFloats, AttrInts or AttrTensor.
type Attr struct {
	name   string
	typ    int
	f      float32
	i      int64
	s      string
	t      *Tensor
	floats []float32
	ints   []int64
	strs   []string
}

// AttrFloat is a FLOAT attribute.
func AttrFloat(name string, v float32) Attr { return Attr{name: name, typ: attrTypeFloat, f: v} }

// AttrInt is an INT attribute.
func AttrInt(name string, v int64) Attr { return Attr{name: name, typ: attrTypeInt, i: v} }

// AttrString is a STRING attribute.
func AttrString(name, v string) Attr { return Attr{name: name, typ: attrTypeString, s: v} }

// AttrFloats is a FLOATS attribute.
func AttrFloats(name string, v ...float32) Attr {
	return Attr{name: name, typ: attrTypeFloats, floats: append([]float32(nil), v...)}
}

// AttrInts is an INTS attribute (e.g. kernel_shape, axes, perm).
func AttrInts(name string, v ...int64) Attr {
	return Attr{name: name, typ: attrTypeInts, ints: append([]int64(nil), v...)}
}

// AttrStrings is a STRINGS attribute (e.g. StringNormalizer's stopwords).
func AttrStrings(name string, v ...string) Attr {
	return Attr{name: name, typ: attrTypeStrings, strs: append([]string(nil), v...)}
}

// AttrTensor is a TENSOR attribute (e.g. Constant's value).
func AttrTensor(name string, t Tensor) Attr { return Attr{name: name, typ: attrTypeTensor, t: &t} }

// dim is one dimension of a graph input/output: a fixed size or a symbolic
// name such as "N" (a dynamic batch).
type dim struct {
	value int64
	param string
}

type valueInfo struct {
	name    string
	typ     DataType
	dims    []dim
	noShape bool // no TensorShapeProto at all: the rank is unknown (not rank 0)
	seq     bool // a sequence of such tensors, not a tensor
}

type node struct {
	op      string
	name    string
	inputs  []string
	outputs []string
	attrs   []Attr
}

// Graph builds one ONNX model: inputs, outputs, initializers and nodes, in
// the order they are added (nodes must be added in topological order, which
// is what building a graph front to back gives). The zero value is not
// usable; call NewGraph. Methods panic on programming errors (a shape given
// with an unsupported type, a tensor whose data does not fill its dims), not
// on anything that depends on run-time input.
type Graph struct {
	name    string
	inputs  []valueInfo
	outputs []valueInfo
	inits   []Tensor
	nodes   []node
	seq     int
}

// NewGraph returns an empty graph with the given name.
func NewGraph(name string) *Graph { return &Graph{name: name} }

// AddInput declares a graph input. Each of dims is an int / int64 (a fixed
// size) or a string (a symbolic dimension such as "N").
func (g *Graph) AddInput(name string, typ DataType, dims ...any) {
	g.inputs = append(g.inputs, valueInfo{name: name, typ: typ, dims: toDims(name, dims)})
}

// AddInputNoShape declares a graph input of element type typ without a shape: its rank
// is unknown, so a value of any rank is accepted.
func (g *Graph) AddInputNoShape(name string, typ DataType) {
	g.inputs = append(g.inputs, valueInfo{name: name, typ: typ, noShape: true})
}

// AddOutput declares a graph output; dims as for AddInput. No dims declares a rank-0
// (scalar) output.
func (g *Graph) AddOutput(name string, typ DataType, dims ...any) {
	g.outputs = append(g.outputs, valueInfo{name: name, typ: typ, dims: toDims(name, dims)})
}

// AddOutputSequence declares a graph output that is a sequence of tensors of element
// type typ (e.g. SequenceConstruct's), not a tensor.
func (g *Graph) AddOutputSequence(name string, typ DataType) {
	g.outputs = append(g.outputs, valueInfo{name: name, typ: typ, noShape: true, seq: true})
}

// AddOutputNoShape declares a graph output of element type typ without a shape, so that
// its rank is unknown until the runtime infers it (or runs the model).
func (g *Graph) AddOutputNoShape(name string, typ DataType) {
	g.outputs = append(g.outputs, valueInfo{name: name, typ: typ, noShape: true})
}

func toDims(name string, dims []any) []dim {
	out := make([]dim, len(dims))
	for i, d := range dims {
		switch v := d.(type) {
		case int:
			out[i] = dim{value: int64(v)}
		case int64:
			out[i] = dim{value: v}
		case string:
			out[i] = dim{param: v}
		default:
			panic(fmt.Sprintf("onnxgen: %q: dimension %d has type %T (want int, int64 or string)", name, i, d))
		}
	}
	return out
}

// AddInitializer adds a constant tensor to the graph and returns its name.
func (g *Graph) AddInitializer(t Tensor) string {
	g.inits = append(g.inits, t)
	return t.Name
}

// AddFloat adds a float32 initializer and returns its name. An empty name
// gets a generated one.
func (g *Graph) AddFloat(name string, dims []int64, data []float32) string {
	if name == "" {
		name = g.fresh("const")
	}
	return g.AddInitializer(FloatTensor(name, dims, data))
}

// AddInt64 adds an int64 initializer and returns its name (generated when
// name is empty).
func (g *Graph) AddInt64(name string, dims []int64, data []int64) string {
	if name == "" {
		name = g.fresh("const")
	}
	return g.AddInitializer(Int64Tensor(name, dims, data))
}

// Scalar adds a rank-0 float32 initializer with a generated name and returns
// the name; broadcasting makes it usable with any float tensor.
func (g *Graph) Scalar(v float32) string {
	return g.AddFloat("", nil, []float32{v})
}

// AddNode appends a node with explicit output names.
func (g *Graph) AddNode(op string, inputs, outputs []string, attrs ...Attr) {
	g.nodes = append(g.nodes, node{
		op:      op,
		name:    g.fresh(op),
		inputs:  append([]string(nil), inputs...),
		outputs: append([]string(nil), outputs...),
		attrs:   attrs,
	})
}

// Op appends a single-output node whose output gets a generated name, and
// returns that name, so a graph reads like nested calls:
//
//	y := g.Op("Sigmoid", []string{g.Op("MatMul", []string{x, w})})
func (g *Graph) Op(op string, inputs []string, attrs ...Attr) string {
	out := g.fresh(op + "_out")
	g.AddNode(op, inputs, []string{out}, attrs...)
	return out
}

// fresh returns a name unique within the graph (a per-graph counter, so the
// names, and therefore the bytes, are the same on every run).
func (g *Graph) fresh(prefix string) string {
	g.seq++
	return fmt.Sprintf("%s_%d", prefix, g.seq)
}

// Bytes serialises the graph as an ONNX ModelProto (IR 8, opset 17).
func (g *Graph) Bytes() []byte {
	var graph []byte
	for _, n := range g.nodes {
		graph = protowire.AppendTag(graph, graphNode, protowire.BytesType)
		graph = protowire.AppendBytes(graph, encodeNode(n))
	}
	graph = appendString(graph, graphName, g.name)
	for _, t := range g.inits {
		graph = protowire.AppendTag(graph, graphInitializer, protowire.BytesType)
		graph = protowire.AppendBytes(graph, encodeTensor(t))
	}
	for _, v := range g.inputs {
		graph = protowire.AppendTag(graph, graphInput, protowire.BytesType)
		graph = protowire.AppendBytes(graph, encodeValueInfo(v))
	}
	for _, v := range g.outputs {
		graph = protowire.AppendTag(graph, graphOutput, protowire.BytesType)
		graph = protowire.AppendBytes(graph, encodeValueInfo(v))
	}

	var opset []byte
	opset = appendString(opset, opsetDomain, "")
	opset = appendVarint(opset, opsetVersion, Opset)

	var model []byte
	model = appendVarint(model, modelIRVersion, IRVersion)
	model = appendString(model, modelProducerName, "ortbus-onnxgen")
	model = appendString(model, modelProducerVersion, "1")
	model = protowire.AppendTag(model, modelGraph, protowire.BytesType)
	model = protowire.AppendBytes(model, graph)
	model = protowire.AppendTag(model, modelOpsetImport, protowire.BytesType)
	model = protowire.AppendBytes(model, opset)
	return model
}

// WriteFile writes the model to path, creating the parent directory. The
// file is written to a temporary name and renamed into place, so a reader
// never sees half a model.
func (g *Graph) WriteFile(path string) error {
	return writeFileAtomic(path, g.Bytes())
}

// writeFileAtomic writes data to path through a temporary file in the same
// directory and a rename.
func writeFileAtomic(path string, data []byte) error {
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("onnxgen: create directory for %s: %w", path, err)
	}
	f, err := os.CreateTemp(dir, "."+filepath.Base(path)+".tmp*")
	if err != nil {
		return fmt.Errorf("onnxgen: write %s: %w", path, err)
	}
	tmp := f.Name()
	_, werr := f.Write(data)
	cerr := f.Close()
	if werr == nil {
		werr = cerr
	}
	if werr == nil {
		werr = os.Chmod(tmp, 0o644)
	}
	if werr == nil {
		werr = os.Rename(tmp, path)
	}
	if werr != nil {
		os.Remove(tmp)
		return fmt.Errorf("onnxgen: write %s: %w", path, werr)
	}
	return nil
}

func encodeNode(n node) []byte {
	var b []byte
	for _, in := range n.inputs {
		b = appendString(b, nodeInput, in)
	}
	for _, out := range n.outputs {
		b = appendString(b, nodeOutput, out)
	}
	b = appendString(b, nodeName, n.name)
	b = appendString(b, nodeOpType, n.op)
	for _, a := range n.attrs {
		b = protowire.AppendTag(b, nodeAttribute, protowire.BytesType)
		b = protowire.AppendBytes(b, encodeAttr(a))
	}
	return b
}

// encodeAttr writes an AttributeProto. Repeated scalars are written unpacked
// (proto2's default for onnx.proto); parsers accept either form.
func encodeAttr(a Attr) []byte {
	var b []byte
	b = appendString(b, attrName, a.name)
	switch a.typ {
	case attrTypeFloat:
		b = appendFloat(b, attrF, a.f)
	case attrTypeInt:
		b = appendVarint(b, attrI, uint64(a.i))
	case attrTypeString:
		b = appendString(b, attrS, a.s)
	case attrTypeTensor:
		b = protowire.AppendTag(b, attrT, protowire.BytesType)
		b = protowire.AppendBytes(b, encodeTensor(*a.t))
	case attrTypeFloats:
		for _, f := range a.floats {
			b = appendFloat(b, attrFloats, f)
		}
	case attrTypeInts:
		for _, i := range a.ints {
			b = appendVarint(b, attrInts, uint64(i))
		}
	case attrTypeStrings:
		for _, s := range a.strs {
			b = appendString(b, attrStrings, s)
		}
	}
	b = appendVarint(b, attrType, uint64(a.typ))
	return b
}

func encodeTensor(t Tensor) []byte {
	var b []byte
	for _, d := range t.Dims {
		b = appendVarint(b, tensorDims, uint64(d))
	}
	b = appendVarint(b, tensorDataType, uint64(t.Type))
	b = appendString(b, tensorName, t.Name)
	b = protowire.AppendTag(b, tensorRawData, protowire.BytesType)
	b = protowire.AppendBytes(b, t.Raw)
	return b
}

func encodeValueInfo(v valueInfo) []byte {
	var shape []byte
	for _, d := range v.dims {
		var db []byte
		if d.param != "" {
			db = appendString(db, dimParam, d.param)
		} else {
			db = appendVarint(db, dimValue, uint64(d.value))
		}
		shape = protowire.AppendTag(shape, shapeDim, protowire.BytesType)
		shape = protowire.AppendBytes(shape, db)
	}
	var tt []byte
	tt = appendVarint(tt, tensorElemType, uint64(v.typ))
	if !v.noShape {
		tt = protowire.AppendTag(tt, tensorShape, protowire.BytesType)
		tt = protowire.AppendBytes(tt, shape)
	}

	var typ []byte
	typ = protowire.AppendTag(typ, typeTensor, protowire.BytesType)
	typ = protowire.AppendBytes(typ, tt)
	if v.seq {
		var seq []byte // TypeProto.Sequence{elem_type: the tensor's TypeProto}
		seq = protowire.AppendTag(seq, sequenceElemType, protowire.BytesType)
		seq = protowire.AppendBytes(seq, typ)
		typ = protowire.AppendTag(nil, typeSequence, protowire.BytesType)
		typ = protowire.AppendBytes(typ, seq)
	}

	var b []byte
	b = appendString(b, valueName, v.name)
	b = protowire.AppendTag(b, valueType, protowire.BytesType)
	b = protowire.AppendBytes(b, typ)
	return b
}

func appendString(b []byte, field protowire.Number, s string) []byte {
	b = protowire.AppendTag(b, field, protowire.BytesType)
	return protowire.AppendString(b, s)
}

func appendVarint(b []byte, field protowire.Number, v uint64) []byte {
	b = protowire.AppendTag(b, field, protowire.VarintType)
	return protowire.AppendVarint(b, v)
}

func appendFloat(b []byte, field protowire.Number, f float32) []byte {
	b = protowire.AppendTag(b, field, protowire.Fixed32Type)
	return protowire.AppendFixed32(b, math.Float32bits(f))
}
