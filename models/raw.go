package models

import (
	"context"
	"encoding/binary"
	"math"
	"slices"

	"github.com/ortbus/ortbus/codec"
	"github.com/ortbus/ortbus/config"
	"github.com/ortbus/ortbus/ort"
)

// raw serves infer: named tensors in, named tensors out, no pre- or post-processing.
type raw struct {
	base
	sess *ort.Session
}

func openRaw(env Env, m *config.Model, dir string) (Model, error) {
	r := &raw{base: newBase(env, m)}
	mp, err := mustFile(m, dir, "model")
	if err != nil {
		return nil, err
	}
	if r.sess, err = r.session(mp); err != nil {
		return nil, err
	}
	return r, nil
}

type rawItem struct {
	inputs []ort.Tensor
	want   []string
}

func (r *raw) Prepare(op string, req *codec.WorkItem) (Item, error) {
	if err := r.checkOp(op); err != nil {
		return nil, err
	}
	it := &rawItem{want: req.Outputs}
	for _, in := range r.sess.Inputs {
		t, ok := req.Inputs[in.Name]
		if !ok || t == nil {
			return nil, codec.Errorf(codec.CodeBadRequest, "missing input %q", in.Name)
		}
		if err := t.Validate(); err != nil {
			return nil, codec.Errorf(codec.CodeBadRequest, "input %q: %v", in.Name, err)
		}
		if t.Type != in.Type {
			return nil, codec.Errorf(codec.CodeBadRequest, "input %q is %s, the model wants %s", in.Name, t.Type, in.Type)
		}
		it.inputs = append(it.inputs, ort.Tensor{Name: in.Name, Shape: t.Shape, Data: fromBytes(t.Type, t.Data)})
	}
	for _, w := range req.Outputs {
		if !slices.ContainsFunc(r.sess.Outputs, func(o ort.IOInfo) bool { return o.Name == w }) {
			return nil, codec.Errorf(codec.CodeBadRequest, "the model has no output %q", w)
		}
	}
	return it, nil
}

func (r *raw) Run(ctx context.Context, op string, items []Item) ([]codec.Replier, []error) {
	replies := make([]codec.Replier, len(items))
	errs := make([]error, len(items))
	for i, x := range items {
		it := x.(*rawItem)
		outs, err := r.sess.Run(ctx, it.inputs)
		if err != nil {
			errs[i] = err
			continue
		}
		rep := &codec.InferReply{Outputs: map[string]*codec.Tensor{}}
		for _, o := range outs {
			if len(it.want) == 0 || slices.Contains(it.want, o.Name) {
				rep.Outputs[o.Name] = toCodec(o)
			}
		}
		replies[i] = rep
	}
	return replies, errs
}

func fromBytes(typ string, b []byte) any {
	le := binary.LittleEndian
	switch typ {
	case "float32":
		v, _ := codec.BytesFloat32(b)
		return v
	case "float64":
		v := make([]float64, len(b)/8)
		for i := range v {
			v[i] = math.Float64frombits(le.Uint64(b[8*i:]))
		}
		return v
	case "int64":
		v := make([]int64, len(b)/8)
		for i := range v {
			v[i] = int64(le.Uint64(b[8*i:]))
		}
		return v
	case "int32":
		v := make([]int32, len(b)/4)
		for i := range v {
			v[i] = int32(le.Uint32(b[4*i:]))
		}
		return v
	case "bool":
		v := make([]bool, len(b))
		for i := range v {
			v[i] = b[i] != 0
		}
		return v
	}
	return append([]uint8(nil), b...)
}

func toCodec(t ort.Tensor) *codec.Tensor {
	le := binary.LittleEndian
	out := &codec.Tensor{Shape: t.Shape}
	switch d := t.Data.(type) {
	case []float32:
		out.Type, out.Data = "float32", codec.Float32Bytes(d)
	case []float64:
		out.Type, out.Data = "float64", make([]byte, 8*len(d))
		for i, v := range d {
			le.PutUint64(out.Data[8*i:], math.Float64bits(v))
		}
	case []int64:
		out.Type, out.Data = "int64", make([]byte, 8*len(d))
		for i, v := range d {
			le.PutUint64(out.Data[8*i:], uint64(v))
		}
	case []int32:
		out.Type, out.Data = "int32", make([]byte, 4*len(d))
		for i, v := range d {
			le.PutUint32(out.Data[4*i:], uint32(v))
		}
	case []bool:
		out.Type, out.Data = "bool", make([]byte, len(d))
		for i, v := range d {
			if v {
				out.Data[i] = 1
			}
		}
	case []uint8:
		out.Type, out.Data = "uint8", append([]byte(nil), d...)
	}
	return out
}
