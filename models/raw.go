package models

import (
	"context"
	"path/filepath"
	"slices"
	"strings"

	"github.com/ortbus/ortbus/codec"
	"github.com/ortbus/ortbus/config"
	"github.com/ortbus/ortbus/models/internal/lebytes"
	"github.com/ortbus/ortbus/npy"
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
	// files maps the outputs to write to their .npy paths (output_dir, output_paths).
	files map[string]string
}

// Prepare checks the request and reads its inputs: inline (inputs) or from .npy files
// (input_paths, under the image path rules), every input of the model exactly once. The
// output files asked for (output_dir, output_paths) are checked before any input is read:
// each inside an output root, its directory existing, nothing at its path yet.
func (r *raw) Prepare(op string, req *codec.WorkItem) (Item, error) {
	if err := r.checkOp(op); err != nil {
		return nil, err
	}
	it := &rawItem{want: req.Outputs}
	for _, w := range req.Outputs {
		if err := r.checkOutput(w); err != nil {
			return nil, err
		}
	}
	files, err := r.outputFiles(req)
	if err != nil {
		return nil, err
	}
	it.files = files
	for name := range req.InputPaths {
		if !slices.ContainsFunc(r.sess.Inputs, func(in ort.IOInfo) bool { return in.Name == name }) {
			return nil, codec.Errorf(codec.CodeBadRequest, "input_paths: the model has no input %q", name).With("field", "input_paths")
		}
	}
	for _, in := range r.sess.Inputs {
		t, inline := req.Inputs[in.Name]
		path, byPath := req.InputPaths[in.Name]
		from := ""
		switch {
		case inline && byPath:
			return nil, codec.Errorf(codec.CodeBadRequest, "input %q is given both inline (inputs) and by path (input_paths)", in.Name)
		case byPath:
			if t, err = r.env.Images.OpenTensor(path); err != nil {
				return nil, codec.AsError(err).With("input", in.Name)
			}
			from = " (" + path + ")"
		case t == nil:
			return nil, codec.Errorf(codec.CodeBadRequest, "missing input %q", in.Name)
		}
		if err := t.Validate(); err != nil {
			return nil, codec.Errorf(codec.CodeBadRequest, "input %q%s: %v", in.Name, from, err)
		}
		if t.Type != in.Type {
			return nil, codec.Errorf(codec.CodeBadRequest, "input %q%s is %s, the model wants %s", in.Name, from, t.Type, in.Type)
		}
		data := fromBytes(t.Type, t.Data)
		if t.Type == "string" {
			data = t.Strings
		}
		it.inputs = append(it.inputs, ort.Tensor{Name: in.Name, Shape: t.Shape, Data: data})
	}
	return it, nil
}

func (r *raw) hasOutput(name string) bool {
	return slices.ContainsFunc(r.sess.Outputs, func(o ort.IOInfo) bool { return o.Name == name })
}

// checkOutput refuses an output the request asks for that the model does not have, or
// that ortbus cannot return (a sequence, a map, …: the session never fetches it, so a
// request that does not ask for it still runs).
func (r *raw) checkOutput(name string) error {
	for _, o := range r.sess.Outputs {
		if o.Name != name {
			continue
		}
		if !r.sess.Returns(name) {
			return codec.Errorf(codec.CodeBadRequest, "output %q is of type %s, which ortbus cannot return", name, o.Type).With("output", name)
		}
		return nil
	}
	return codec.Errorf(codec.CodeBadRequest, "the model has no output %q", name)
}

// outputFiles returns the .npy path of each output the request asks to be written, each
// checked with CheckWritable: with output_dir, <output_dir>/<name>.npy for every wanted
// output (outputs, else all); with output_paths, the named outputs (which must be wanted)
// at their paths, no two at one path.
func (r *raw) outputFiles(req *codec.WorkItem) (map[string]string, error) {
	if req.OutputDir == "" && len(req.OutputPaths) == 0 {
		return nil, nil
	}
	if req.OutputDir != "" && len(req.OutputPaths) > 0 {
		return nil, codec.Errorf(codec.CodeBadRequest, "output_dir and output_paths exclude each other").With("field", "output_paths")
	}
	want := req.Outputs
	if len(want) == 0 {
		for _, o := range r.sess.Outputs {
			if r.sess.Returns(o.Name) {
				want = append(want, o.Name)
			}
		}
	}
	files := map[string]string{}
	if dir := req.OutputDir; dir != "" {
		if !filepath.IsAbs(dir) || filepath.Clean(dir) != dir {
			return nil, codec.Errorf(codec.CodeBadRequest, "output_dir %q is not an absolute, clean path", dir).With("field", "output_dir")
		}
		for _, name := range want {
			if name == "" || strings.ContainsAny(name, "/\x00") {
				return nil, codec.Errorf(codec.CodeBadRequest, "output %q cannot be a file name in output_dir; name its file with output_paths", name).With("field", "output_dir")
			}
			files[name] = filepath.Join(dir, name+".npy")
		}
	} else {
		seen := map[string]string{}
		for name, path := range req.OutputPaths {
			if !slices.Contains(want, name) {
				if !r.hasOutput(name) {
					return nil, codec.Errorf(codec.CodeBadRequest, "output_paths: the model has no output %q", name).With("field", "output_paths")
				}
				return nil, codec.Errorf(codec.CodeBadRequest, "output_paths: output %q is not one of the outputs asked for (%v)", name, req.Outputs).With("field", "output_paths")
			}
			if other, ok := seen[path]; ok {
				return nil, codec.Errorf(codec.CodeBadRequest, "output_paths: outputs %q and %q both go to %s", min(name, other), max(name, other), path).With("field", "output_paths")
			}
			seen[path] = name
			files[name] = path
		}
	}
	for name, path := range files {
		for _, o := range r.sess.Outputs {
			if o.Name == name && !npy.Writable(o.Type) {
				return nil, codec.Errorf(codec.CodeBadRequest, "output %q is %s, which has no .npy dtype: ask for it inline", name, o.Type).With("output", name)
			}
		}
		if _, err := r.env.Images.CheckWritable(path); err != nil {
			return nil, codec.AsError(err).With("output", name)
		}
	}
	return files, nil
}

func (r *raw) Run(ctx context.Context, op string, items []Item) ([]codec.Replier, []error) {
	replies := make([]codec.Replier, len(items))
	errs := make([]error, len(items))
	for i, x := range items {
		replies[i], errs[i] = r.one(ctx, x.(*rawItem))
	}
	return replies, errs
}

// one runs one item: the wanted outputs inline, or written as new .npy files (in the
// model's output order; an output already written stays if a later one fails).
func (r *raw) one(ctx context.Context, it *rawItem) (codec.Replier, error) {
	outs, err := r.sess.Run(ctx, it.inputs)
	if err != nil {
		return nil, err
	}
	rep := &codec.InferReply{Outputs: map[string]*codec.Tensor{}}
	for _, o := range outs {
		if len(it.want) > 0 && !slices.Contains(it.want, o.Name) {
			continue
		}
		t := toCodec(o)
		if t.Type == "string" {
			// ONNX Runtime's strings are bytes; the contract's are UTF-8 (msgpack str).
			if err := t.Validate(); err != nil {
				return nil, codec.Errorf(codec.CodeInternal, "output %q: %v: the protocol carries only valid UTF-8 strings", o.Name, err).With("output", o.Name)
			}
		}
		path, ok := it.files[o.Name]
		if !ok {
			rep.Outputs[o.Name] = t
			continue
		}
		if err := r.env.Images.CreateTensor(path, t); err != nil {
			return nil, codec.AsError(err).With("output", o.Name)
		}
		if rep.OutputPaths == nil {
			rep.OutputPaths = map[string]string{}
		}
		rep.OutputPaths[o.Name] = path
	}
	return rep, nil
}

// fromBytes is the little-endian elements b of a tensor of type typ as ort's data: a view
// of b, not a copy, on a little-endian host when b is aligned (lebytes), so a request's
// tensor goes to the runtime without an element-wise pass. b is the request's own and
// is not changed. Bools are copied (a byte other than 0 or 1 is no Go bool).
func fromBytes(typ string, b []byte) any {
	switch typ {
	case "float32":
		return lebytes.View[float32](b)
	case "float64":
		return lebytes.View[float64](b)
	case "float16":
		return ort.Float16(lebytes.View[uint16](b))
	case "bfloat16":
		return ort.BFloat16(lebytes.View[uint16](b))
	case "int64":
		return lebytes.View[int64](b)
	case "int32":
		return lebytes.View[int32](b)
	case "int16":
		return lebytes.View[int16](b)
	case "int8":
		return lebytes.View[int8](b)
	case "uint64":
		return lebytes.View[uint64](b)
	case "uint32":
		return lebytes.View[uint32](b)
	case "uint16":
		return lebytes.View[uint16](b)
	case "bool":
		v := make([]bool, len(b))
		for i, x := range b {
			v[i] = x != 0
		}
		return v
	}
	return b
}

// toCodec is t as the contract's tensor; its shape is never nil ([] for a scalar, which
// JSON writes as [] and not null).
func toCodec(t ort.Tensor) *codec.Tensor {
	out := &codec.Tensor{Shape: append([]int64{}, t.Shape...)}
	// The bytes are a view of the output's elements (lebytes), which are the reply's own.
	switch d := t.Data.(type) {
	case []float32:
		out.Type, out.Data = "float32", lebytes.Bytes(d)
	case []float64:
		out.Type, out.Data = "float64", lebytes.Bytes(d)
	case ort.Float16:
		out.Type, out.Data = "float16", lebytes.Bytes([]uint16(d))
	case ort.BFloat16:
		out.Type, out.Data = "bfloat16", lebytes.Bytes([]uint16(d))
	case []int64:
		out.Type, out.Data = "int64", lebytes.Bytes(d)
	case []int32:
		out.Type, out.Data = "int32", lebytes.Bytes(d)
	case []int16:
		out.Type, out.Data = "int16", lebytes.Bytes(d)
	case []int8:
		out.Type, out.Data = "int8", lebytes.Bytes(d)
	case []uint64:
		out.Type, out.Data = "uint64", lebytes.Bytes(d)
	case []uint32:
		out.Type, out.Data = "uint32", lebytes.Bytes(d)
	case []uint16:
		out.Type, out.Data = "uint16", lebytes.Bytes(d)
	case []bool:
		b := make([]byte, len(d))
		for i, v := range d {
			if v {
				b[i] = 1
			}
		}
		out.Type, out.Data = "bool", b
	case []uint8:
		out.Type, out.Data = "uint8", d
	case []string:
		out.Type, out.Strings = "string", d
	}
	return out
}
