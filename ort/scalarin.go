package ort

import (
	"fmt"
	"slices"

	"google.golang.org/protobuf/encoding/protowire"
)

// Rank-0 float16, bfloat16 and string inputs.
//
// onnxruntime_go v1.27 makes no rank-0 value of those types: NewScalar takes only Go's
// numeric types, and NewCustomDataTensor and NewStringTensor refuse a shape without
// dimensions. So, as for the outputs of halfcast.go, the session is loaded from a copy of
// the model rewritten in memory: each such input "x" becomes the graph input
// "x.ortbus_rank1" of shape [1] (its element type kept), followed by one more node,
// Reshape("x.ortbus_rank1", shape) -> "x", whose shape is an empty int64 initializer:
// the node makes the scalar "x" the graph reads, with the one element given. Run gives
// the runtime that element with shape [1]. The transformation is exact (Reshape moves no
// bits), and a value of any other shape is refused before the run, as the runtime
// refuses a wrong rank. An input the model declares without a shape (an unknown rank,
// which onnxruntime_go reports with no dimensions too) is left as it is: its values may
// be of any rank. Should the copy fail to load (an opset without Reshape's shape input, a
// name already taken), the model is loaded without it and such an input is refused with
// bad_request, as before.

// rank1Suffix names the [1]-shaped input made for a rank-0 one.
const rank1Suffix = ".ortbus_rank1"

// scalarShapeName names the empty int64 initializer, the shape of the Reshapes.
const scalarShapeName = "ortbus_scalar_shape"

// onnxInt64 is TensorProto.INT64.
const onnxInt64 = 7

// Field numbers of onnx.proto, beyond halfcast.go's.
const (
	pbGraphInitializer = 5
	pbGraphInput       = 11
	pbTensorTypeShape  = 2
	pbShapeDim         = 1
	pbDimValue         = 1
	pbTensorDims       = 1
	pbTensorDataType   = 2
	pbTensorName       = 8
)

// scalarInput reports whether input in, if the model declares it of rank 0, is given to
// the runtime with shape [1] through a rewritten model: a float16, bfloat16 or string
// input without dimensions.
func scalarInput(in IOInfo) bool {
	return len(in.Shape) == 0 && (isHalf(in.Type) || in.Type == "string")
}

// scalarGraph rewrites a GraphProto as above for each input named in ins that it declares
// of rank 0 (a shape without dimensions), and returns it with those inputs' names in the
// rewritten graph (none when the graph declares none of them of rank 0: then the graph is
// returned as it is). A name the rewrite would add that the graph already has is an error.
func scalarGraph(graph []byte, ins []string) ([]byte, map[string]string, error) {
	renamed := map[string]string{}
	taken := map[string]bool{}
	err := fields(graph, func(num protowire.Number, typ protowire.Type, _, val []byte) error {
		if typ != protowire.BytesType {
			return nil
		}
		switch num {
		case pbGraphInput, pbGraphOutput:
			name, err := valueName(val)
			if err != nil {
				return err
			}
			taken[name] = true
			if num == pbGraphInput && slices.Contains(ins, name) {
				rank0, err := declaredRank0(val)
				if err != nil {
					return fmt.Errorf("input %q: %w", name, err)
				}
				if rank0 {
					renamed[name] = name + rank1Suffix
				}
			}
		case pbGraphInitializer:
			return fields(val, func(num protowire.Number, typ protowire.Type, _, val []byte) error {
				if num == pbTensorName && typ == protowire.BytesType {
					taken[string(val)] = true
				}
				return nil
			})
		case pbGraphNode:
			return fields(val, func(num protowire.Number, typ protowire.Type, _, val []byte) error {
				if num == pbNodeOutput && typ == protowire.BytesType {
					taken[string(val)] = true
				}
				return nil
			})
		}
		return nil
	})
	if err != nil || len(renamed) == 0 {
		return graph, nil, err
	}
	if taken[scalarShapeName] {
		return nil, nil, fmt.Errorf("the graph already has a value %q", scalarShapeName)
	}
	var order []string // the inputs rewritten, in the order of ins
	for _, in := range ins {
		if to, ok := renamed[in]; ok && !slices.Contains(order, in) {
			if taken[to] {
				return nil, nil, fmt.Errorf("the graph already has a value %q", to)
			}
			order = append(order, in)
		}
	}

	// The Reshapes come first among the nodes (nodes are in topological order).
	var nodes []byte
	for _, in := range order {
		nodes = appendNode(nodes, []string{renamed[in], scalarShapeName}, in, "ortbus_reshape_"+in, "Reshape")
	}
	out, _, err := renameValues(graph, pbGraphInput, renamed, rank1ValueInfo)
	if err != nil {
		return nil, nil, err
	}
	out, err = insertBefore(out, pbGraphNode, nodes)
	if err != nil {
		return nil, nil, err
	}
	// The shape of the Reshapes: an int64 tensor of dimensions [0], no element.
	var shape []byte
	shape = protowire.AppendTag(shape, pbTensorDims, protowire.VarintType)
	shape = protowire.AppendVarint(shape, 0)
	shape = protowire.AppendTag(shape, pbTensorDataType, protowire.VarintType)
	shape = protowire.AppendVarint(shape, onnxInt64)
	shape = appendStr(shape, pbTensorName, scalarShapeName)
	out = protowire.AppendTag(out, pbGraphInitializer, protowire.BytesType)
	out = protowire.AppendBytes(out, shape)
	return out, renamed, nil
}

// tensorType calls f with the TypeProto.Tensor of a ValueInfoProto, if it has one.
func tensorType(v []byte, f func(tt []byte) error) error {
	return fields(v, func(num protowire.Number, typ protowire.Type, _, val []byte) error {
		if num != pbValueType || typ != protowire.BytesType {
			return nil
		}
		return fields(val, func(num protowire.Number, typ protowire.Type, _, val []byte) error {
			if num != pbTypeTensor || typ != protowire.BytesType {
				return nil
			}
			return f(val)
		})
	})
}

// declaredRank0 reports whether a ValueInfoProto is a tensor with a shape of no
// dimension (not one without a shape, whose rank is unknown).
func declaredRank0(v []byte) (bool, error) {
	shapes, dims := 0, 0
	err := tensorType(v, func(tt []byte) error {
		return fields(tt, func(num protowire.Number, typ protowire.Type, _, val []byte) error {
			if num != pbTensorTypeShape || typ != protowire.BytesType {
				return nil
			}
			shapes++
			return fields(val, func(num protowire.Number, _ protowire.Type, _, _ []byte) error {
				if num == pbShapeDim {
					dims++
				}
				return nil
			})
		})
	})
	return shapes == 1 && dims == 0, err
}

// insertBefore is the message b with fields (tags included) inserted before its first
// field numbered num, or appended when it has none.
func insertBefore(b []byte, num protowire.Number, add []byte) ([]byte, error) {
	var out []byte
	placed := false
	err := fields(b, func(n protowire.Number, _ protowire.Type, raw, _ []byte) error {
		if n == num && !placed {
			out, placed = append(out, add...), true
		}
		out = append(out, raw...)
		return nil
	})
	if !placed {
		out = append(out, add...)
	}
	return out, err
}

// rank1ValueInfo is a ValueInfoProto of a tensor renamed to name, its shape [1] (its
// element type and everything else kept).
func rank1ValueInfo(v []byte, name string) ([]byte, error) {
	var dim, shape, field []byte
	dim = protowire.AppendTag(dim, pbDimValue, protowire.VarintType)
	dim = protowire.AppendVarint(dim, 1)
	shape = protowire.AppendTag(shape, pbShapeDim, protowire.BytesType)
	shape = protowire.AppendBytes(shape, dim)
	field = protowire.AppendTag(field, pbTensorTypeShape, protowire.BytesType)
	field = protowire.AppendBytes(field, shape)
	return rewriteValueInfo(v, name, func(tt []byte) ([]byte, error) {
		return withField(tt, pbTensorTypeShape, field)
	})
}
