package ort

import (
	"fmt"
	"os"
	"path/filepath"

	"google.golang.org/protobuf/encoding/protowire"
)

// Float16 and bfloat16 outputs whose shape the model leaves open.
//
// onnxruntime_go v1.27 copies an output the runtime allocated, of an element type it has no
// Go type for (float16, bfloat16), with one byte per element (createTensorFromOrtValue's
// default case copies shape.FlattenedSize() bytes into a CustomDataTensor, which the
// runtime then refuses as too small), and it makes no rank-0 value of those types. An
// output of a fixed shape is given to the runtime preallocated (newEmpty); one whose shape
// is only known after the run (a symbolic dimension, an unknown rank, rank 0) cannot be.
// Its exported API gives no other way to the runtime's bytes (GetBoundOutputValues goes
// through the same copy; an OrtValue's pointer is unexported).
//
// So the session is loaded from a copy of the model, rewritten in memory, in which each
// such output "y" feeds one more node, Cast(to=FLOAT) -> "y.ortbus_float32", which is the
// graph output in its place. The runtime returns that as a float32 tensor it allocates,
// which onnxruntime_go copies like any; Run turns it back into the output's type. Both
// steps are exact: every float16 and bfloat16 value is a float32 value, and converting it
// back gives the same bits (bfloat16 is a float32's top 16 bits; float16 is rounded to the
// nearest, which is itself), NaNs staying NaNs. The file on disk is never changed. A model
// with external data is loaded with session.model_external_initializers_file_folder_path
// set to its directory, where ONNX Runtime would have looked for it.

// castSuffix names the float32 output made for a half output.
const castSuffix = ".ortbus_float32"

// onnxFloat is TensorProto.FLOAT, the Cast's "to".
const onnxFloat = 1

// Field numbers of onnx.proto.
const (
	pbModelGraph       = 7
	pbGraphNode        = 1
	pbGraphOutput      = 12
	pbNodeInput        = 1
	pbNodeOutput       = 2
	pbNodeName         = 3
	pbNodeOpType       = 4
	pbNodeAttribute    = 5
	pbAttrName         = 1
	pbAttrI            = 3
	pbAttrType         = 20
	pbAttrTypeInt      = 2
	pbValueName        = 1
	pbValueType        = 2
	pbTypeTensor       = 1
	pbTensorTypeElem   = 1
	pbExternalDataPath = "session.model_external_initializers_file_folder_path"
)

// rewriteModel reads the model at path and returns it rewritten in memory: each output
// named in outs cast to float32 as above, and each input named in ins that the graph
// declares of rank 0 given a shape [1] and reshaped to a scalar (scalarin.go). It returns
// the name each of those outputs, and each input so rewritten, has in the rewritten model.
func rewriteModel(path string, outs, ins []string) (model []byte, outNames, inNames map[string]string, err error) {
	model, err = os.ReadFile(path)
	if err != nil {
		return nil, nil, nil, err
	}
	renamed := map[string]string{}
	for _, o := range outs {
		renamed[o] = o + castSuffix
	}
	inNames = map[string]string{}
	var out []byte
	graphs := 0
	err = fields(model, func(num protowire.Number, typ protowire.Type, raw, val []byte) error {
		if num != pbModelGraph || typ != protowire.BytesType {
			out = append(out, raw...)
			return nil
		}
		graphs++
		g, err := castGraph(val, outs, renamed)
		if err != nil {
			return err
		}
		if len(ins) > 0 {
			if g, inNames, err = scalarGraph(g, ins); err != nil {
				return err
			}
		}
		out = protowire.AppendTag(out, pbModelGraph, protowire.BytesType)
		out = protowire.AppendBytes(out, g)
		return nil
	})
	if err != nil {
		return nil, nil, nil, fmt.Errorf("rewriting %s: %w", path, err)
	}
	if graphs != 1 {
		return nil, nil, nil, fmt.Errorf("rewriting %s: %d graphs in the model", path, graphs)
	}
	return out, renamed, inNames, nil
}

// castGraph rewrites a GraphProto: each renamed output's name and element type, and one
// Cast node per renamed output, appended.
func castGraph(graph []byte, outs []string, renamed map[string]string) ([]byte, error) {
	out, found, err := renameValues(graph, pbGraphOutput, renamed, castValueInfo)
	if err != nil {
		return nil, err
	}
	for _, from := range outs {
		to := renamed[from]
		if !found[from] {
			return nil, fmt.Errorf("the graph has no output %q", from)
		}
		var attr []byte
		attr = protowire.AppendTag(attr, pbAttrName, protowire.BytesType)
		attr = protowire.AppendString(attr, "to")
		attr = protowire.AppendTag(attr, pbAttrI, protowire.VarintType)
		attr = protowire.AppendVarint(attr, onnxFloat)
		attr = protowire.AppendTag(attr, pbAttrType, protowire.VarintType)
		attr = protowire.AppendVarint(attr, pbAttrTypeInt)
		out = appendNode(out, []string{from}, to, "ortbus_cast_"+from, "Cast", attr)
	}
	return out, nil
}

// castValueInfo is a ValueInfoProto renamed to name, its tensor element type FLOAT (its
// shape and everything else kept).
func castValueInfo(v []byte, name string) ([]byte, error) {
	var elem []byte
	elem = protowire.AppendTag(elem, pbTensorTypeElem, protowire.VarintType)
	elem = protowire.AppendVarint(elem, onnxFloat)
	return rewriteValueInfo(v, name, func(tt []byte) ([]byte, error) {
		return withField(tt, pbTensorTypeElem, elem)
	})
}

// renameValues rewrites a GraphProto: each ValueInfoProto of field num (pbGraphInput or
// pbGraphOutput) whose name renamed maps is replaced by f's rewrite of it under its new
// name, everything else kept. It returns which of renamed's names it found.
func renameValues(graph []byte, num protowire.Number, renamed map[string]string, f func(v []byte, name string) ([]byte, error)) ([]byte, map[string]bool, error) {
	what := "output"
	if num == pbGraphInput {
		what = "input"
	}
	var out []byte
	found := map[string]bool{}
	err := fields(graph, func(n protowire.Number, typ protowire.Type, raw, val []byte) error {
		if n != num || typ != protowire.BytesType {
			out = append(out, raw...)
			return nil
		}
		name, err := valueName(val)
		if err != nil {
			return err
		}
		to, ok := renamed[name]
		if !ok {
			out = append(out, raw...)
			return nil
		}
		found[name] = true
		v, err := f(val, to)
		if err != nil {
			return fmt.Errorf("%s %q: %w", what, name, err)
		}
		out = protowire.AppendTag(out, num, protowire.BytesType)
		out = protowire.AppendBytes(out, v)
		return nil
	})
	if err != nil {
		return nil, nil, err
	}
	return out, found, nil
}

// rewriteValueInfo is a ValueInfoProto of a tensor renamed to name, its TypeProto.Tensor
// replaced by what f makes of it (everything else kept).
func rewriteValueInfo(v []byte, name string, f func(tt []byte) ([]byte, error)) ([]byte, error) {
	var out []byte
	tensors := 0
	err := fields(v, func(num protowire.Number, typ protowire.Type, raw, val []byte) error {
		switch {
		case num == pbValueName && typ == protowire.BytesType:
			out = appendStr(out, pbValueName, name)
		case num == pbValueType && typ == protowire.BytesType:
			var tp []byte
			err := fields(val, func(num protowire.Number, typ protowire.Type, raw, val []byte) error {
				if num != pbTypeTensor || typ != protowire.BytesType {
					tp = append(tp, raw...)
					return nil
				}
				tensors++
				tt, err := f(val)
				tp = protowire.AppendTag(tp, pbTypeTensor, protowire.BytesType)
				tp = protowire.AppendBytes(tp, tt)
				return err
			})
			if err != nil {
				return err
			}
			out = protowire.AppendTag(out, pbValueType, protowire.BytesType)
			out = protowire.AppendBytes(out, tp)
		default:
			out = append(out, raw...)
		}
		return nil
	})
	if err == nil && tensors != 1 {
		err = fmt.Errorf("not a tensor type")
	}
	return out, err
}

// withField is the message b with every field numbered num left out and field (its tag
// included) appended.
func withField(b []byte, num protowire.Number, field []byte) ([]byte, error) {
	var out []byte
	err := fields(b, func(n protowire.Number, _ protowire.Type, raw, _ []byte) error {
		if n != num {
			out = append(out, raw...)
		}
		return nil
	})
	return append(out, field...), err
}

// valueName is the name of a ValueInfoProto.
func valueName(v []byte) (string, error) {
	var name string
	err := fields(v, func(num protowire.Number, typ protowire.Type, _, val []byte) error {
		if num == pbValueName && typ == protowire.BytesType {
			name = string(val)
		}
		return nil
	})
	return name, err
}

// appendNode appends to a GraphProto b a NodeProto: op of inputs ins and one output out,
// named name, with the attributes (AttributeProtos) attrs.
func appendNode(b []byte, ins []string, out, name, op string, attrs ...[]byte) []byte {
	var node []byte
	for _, in := range ins {
		node = appendStr(node, pbNodeInput, in)
	}
	node = appendStr(node, pbNodeOutput, out)
	node = appendStr(node, pbNodeName, name)
	node = appendStr(node, pbNodeOpType, op)
	for _, a := range attrs {
		node = protowire.AppendTag(node, pbNodeAttribute, protowire.BytesType)
		node = protowire.AppendBytes(node, a)
	}
	b = protowire.AppendTag(b, pbGraphNode, protowire.BytesType)
	return protowire.AppendBytes(b, node)
}

func appendStr(b []byte, num protowire.Number, s string) []byte {
	b = protowire.AppendTag(b, num, protowire.BytesType)
	return protowire.AppendString(b, s)
}

// fields calls f for each field of the protobuf message b: its number, wire type, raw
// bytes (tag included) and, for a length-delimited field, its contents.
func fields(b []byte, f func(num protowire.Number, typ protowire.Type, raw, val []byte) error) error {
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return protowire.ParseError(n)
		}
		m := protowire.ConsumeFieldValue(num, typ, b[n:])
		if m < 0 {
			return protowire.ParseError(m)
		}
		var val []byte
		if typ == protowire.BytesType {
			val, _ = protowire.ConsumeBytes(b[n:])
		}
		if err := f(num, typ, b[:n+m], val); err != nil {
			return err
		}
		b = b[n+m:]
	}
	return nil
}

// modelDir is where ONNX Runtime looks for the external data of the model at path.
func modelDir(path string) string { return filepath.Dir(path) }
