// Package models holds the model kinds of ortbus: for each, how a request becomes input
// tensors (image decoding and preprocessing, the way the app's real models expect) and how
// output tensors become a reply (tags, embeddings, differences, boxes, a mask file).
//
// A Model is loaded once per worker and shared by all requests; its sessions are safe for
// concurrent runs. Work is split into Prepare (per item, concurrent: decode and
// preprocess) and Run (one runtime call for a batch of prepared items of the same op), so
// dynamic batching falls out of the same code path as a single request.
package models

import (
	"context"
	"fmt"
	"image"
	"math"
	"slices"

	"github.com/ortbus/ortbus/codec"
	"github.com/ortbus/ortbus/config"
	"github.com/ortbus/ortbus/images"
	"github.com/ortbus/ortbus/ort"
)

// Model is a loaded model of one kind.
type Model interface {
	// Name is the model's name in the config; Kind its kind.
	Name() string
	Kind() string
	// Ops lists the client ops this model serves.
	Ops() []string
	// Batchable reports whether items of op can be stacked into one runtime call: the
	// kind batches op and the network takes more than one item (MaxBatch is not 1).
	Batchable(op string) bool
	// MaxBatch is the most items one runtime call of a batchable op may stack, as the
	// network's inputs accept them (BatchCap): 1 when the kind batches nothing or the
	// batch dimension is fixed at 1, N when it is fixed at N, 0 when it is symbolic (no
	// limit of the network's own: the pool's max_batch decides). Limit applies it.
	MaxBatch() int
	// Prepare validates a request and turns it into one item's input (it decodes the
	// image, if the op takes one). Errors are *codec.Error.
	Prepare(op string, req *codec.WorkItem) (Item, error)
	// Run runs prepared items of one op as a single runtime call and returns one reply or
	// error per item, in order.
	Run(ctx context.Context, op string, items []Item) ([]codec.Replier, []error)
	// Sessions returns the model's runtime sessions (for the EP in use and accounting).
	Sessions() []*ort.Session
	// Warmup runs every session once on zero inputs with batch size n, so the runtime
	// allocates what a batch of n needs and its peak memory can be measured.
	Warmup(ctx context.Context, n int) error
	// Close releases the sessions.
	Close() error
}

// Item is one request prepared by a Model's Prepare; its content is the kind's own.
type Item any

// Env is what a model needs from its worker.
type Env struct {
	Runtime *ort.Runtime
	Session ort.SessionConfig
	Images  images.Policy
	// SpoolDir is where outputs without an out_path are written (segment masks).
	SpoolDir string
	// opened collects every session Open's opener made, so that Open closes them when
	// the opener fails after making some (a worker serves on past a failed model).
	opened *[]*ort.Session
}

// openers load each kind of config.Kinds from the model's folder.
var openers = map[string]func(env Env, m *config.Model, dir string) (Model, error){
	config.KindTaggerPixAI: openTagger,
	config.KindTaggerWD14:  openTagger,
	config.KindTaggerOppai: openOppai,
	config.KindCCIP:        openCCIP,
	config.KindDetect:      openDetector,
	config.KindSegment:     openSegmenter,
	config.KindRaw:         openRaw,
}

// Open loads a model of the kind its config names, once the kind's required files are
// found.
func Open(env Env, m *config.Model) (Model, error) {
	dir, err := Dir(m)
	if err != nil {
		return nil, err
	}
	kind, ok := config.KindOf(m.Kind)
	open := openers[m.Kind]
	if !ok || open == nil {
		return nil, codec.Errorf(codec.CodeUnknownModel, "model %s: kind %q is not supported by this worker", m.Name, m.Kind)
	}
	for _, role := range kind.Required {
		if _, err := mustFile(m, dir, role); err != nil {
			return nil, err
		}
	}
	var opened []*ort.Session
	env.opened = &opened
	mod, err := open(env, m, dir)
	if err != nil {
		for _, s := range opened {
			s.Close()
		}
		return nil, err
	}
	return mod, nil
}

// base holds what every kind shares.
type base struct {
	name, kind string
	ops, batch []string // the kind's (config.Kinds)
	sessions   []*ort.Session
	// batched is the session the kind's batchable ops stack their items into: the first
	// one the model opens (every kind opens it first: a tagger's or detector's only
	// session, ccip's feature network; ccip's metrics network, run by compare over
	// [1+N, dim], is never batched). Its inputs decide MaxBatch.
	batched *ort.Session
	env     Env
}

// newBase is the base of a model of a kind of config.Kinds.
func newBase(env Env, m *config.Model) base {
	k, _ := config.KindOf(m.Kind)
	return base{name: m.Name, kind: m.Kind, ops: k.Ops, batch: k.Batch, env: env}
}

func (b *base) Name() string             { return b.name }
func (b *base) Kind() string             { return b.kind }
func (b *base) Ops() []string            { return b.ops }
func (b *base) Sessions() []*ort.Session { return b.sessions }

// Batchable is the kind's — whether config.Kinds lists op among its batched ops — unless
// the network takes one item at a time (MaxBatch 1).
func (b *base) Batchable(op string) bool { return slices.Contains(b.batch, op) && b.MaxBatch() != 1 }

// MaxBatch is 1 for a kind that batches nothing, else BatchCap of its batched session's
// inputs (0, no limit of its own, before a session is open).
func (b *base) MaxBatch() int {
	if len(b.batch) == 0 {
		return 1
	}
	if b.batched == nil {
		return 0
	}
	return BatchCap(b.batched.Inputs)
}

// BatchCap is the batch rule, in one place: the most items one runtime call may stack
// into a network with these inputs, read from each input's first (batch) dimension.
//
//   - a fixed first dimension N (a YOLOv8 export's [1,3,640,640]: 1) caps it at N, the
//     smallest over the inputs; 1 means no batching;
//   - an input of rank 0 has no batch dimension: 1;
//   - symbolic first dimensions (negative: "N", "batch") give 0: no limit of the
//     network's own, the pool's max_batch (and memory) decide;
//   - a network without inputs: 0.
//
// The worker batches a model only up to Limit(m, max_batch): measure (its status's
// max_batch and its warm-up at that batch) and the queue's gathering both take it.
func BatchCap(inputs []ort.IOInfo) int {
	limit := 0
	for _, in := range inputs {
		n := 0
		switch {
		case len(in.Shape) == 0:
			n = 1
		case in.Shape[0] > 0:
			n = int(min(in.Shape[0], int64(math.MaxInt32)))
		case in.Shape[0] == 0:
			n = 1 // an empty batch dimension stacks nothing: one item at a time
		}
		if n > 0 && (limit == 0 || n < limit) {
			limit = n
		}
	}
	return limit
}

// Limit is the most items of m one runtime call stacks in a pool batching up to max
// items (max_batch, already lowered by the model's config and memory): most, lowered to
// m's own MaxBatch when m has one; at least 1.
func Limit(m interface{ MaxBatch() int }, most int) int {
	if c := m.MaxBatch(); c > 0 && c < most {
		most = c
	}
	return max(1, most)
}

func (b *base) Close() error {
	var first error
	for _, s := range b.sessions {
		if err := s.Close(); err != nil && first == nil {
			first = err
		}
	}
	return first
}

func (b *base) Warmup(ctx context.Context, n int) error {
	for _, s := range b.sessions {
		var ins []ort.Tensor
		for _, in := range s.Inputs {
			t, err := zeros(in, n)
			if err != nil {
				return fmt.Errorf("warm-up of %s: %w", b.name, err)
			}
			ins = append(ins, t)
		}
		if _, err := s.Run(ctx, ins); err != nil {
			return fmt.Errorf("warm-up of %s at batch %d: %w", b.name, n, err)
		}
	}
	return nil
}

// zeros is an all-zero input: symbolic batch dimension n, other symbolic dimensions 64;
// a fixed dimension as declared (0 included), no dimension for a scalar input.
func zeros(in ort.IOInfo, n int) (ort.Tensor, error) {
	shape := make([]int64, len(in.Shape))
	for i, d := range in.Shape {
		switch {
		case d >= 0:
			shape[i] = d
		case i == 0:
			shape[i] = int64(n)
		default:
			shape[i] = 64
		}
	}
	// The shape comes from the model file: bounded like any tensor's (codec.Elements).
	elems, err := codec.Elements(shape)
	if err != nil {
		return ort.Tensor{}, fmt.Errorf("warm-up input %s: %w", in.Name, err)
	}
	size := int(elems)
	t := ort.Tensor{Name: in.Name, Shape: shape}
	switch in.Type {
	case "float32":
		t.Data = make([]float32, size)
	case "float64":
		t.Data = make([]float64, size)
	case "int64":
		t.Data = make([]int64, size)
	case "int32":
		t.Data = make([]int32, size)
	case "int16":
		t.Data = make([]int16, size)
	case "int8":
		t.Data = make([]int8, size)
	case "uint64":
		t.Data = make([]uint64, size)
	case "uint32":
		t.Data = make([]uint32, size)
	case "uint16":
		t.Data = make([]uint16, size)
	case "uint8":
		t.Data = make([]uint8, size)
	case "bool":
		t.Data = make([]bool, size)
	case "float16":
		t.Data = make(ort.Float16, size)
	case "bfloat16":
		t.Data = make(ort.BFloat16, size)
	case "string":
		t.Data = make([]string, size) // empty strings
	default:
		return t, fmt.Errorf("input %s has type %s", in.Name, in.Type)
	}
	return t, nil
}

func (b *base) checkOp(op string) error {
	if !slices.Contains(b.ops, op) {
		return codec.Errorf(codec.CodeUnknownOp, "model %s (%s) does not serve op %q (it serves %v)", b.name, b.kind, op, b.ops)
	}
	return nil
}

// session opens one of the model's ONNX files.
func (b *base) session(path string) (*ort.Session, error) {
	s, err := b.env.Runtime.NewSession(path, b.env.Session)
	if err != nil {
		if e, ok := err.(*codec.Error); ok {
			return nil, e.With("model", b.name)
		}
		return nil, fmt.Errorf("model %s: %w", b.name, err)
	}
	b.sessions = append(b.sessions, s)
	if b.batched == nil {
		b.batched = s
	}
	if b.env.opened != nil {
		*b.env.opened = append(*b.env.opened, s)
	}
	return s, nil
}

// image loads the request's image under the worker's path policy with libvips, as spec
// says (images.Policy.Load): upright, sRGB, 8-bit, straight to the kind's size where spec
// gives one. Info has the whole image's upright size.
func (b *base) image(req *codec.WorkItem, spec images.LoadSpec) (image.Image, images.Info, error) {
	if req.Path == "" {
		return nil, images.Info{}, codec.Errorf(codec.CodeBadRequest, "path is required for this op")
	}
	return b.env.Images.Load(req.Path, spec)
}

// stack concatenates per-item tensors of equal size along a new first (batch) axis.
func stack(items [][]float32, shape []int64) ort.Tensor {
	if len(items) == 1 { // one item is its own batch: no copy
		return ort.Tensor{Shape: append([]int64{1}, shape...), Data: items[0]}
	}
	per := len(items[0])
	data := make([]float32, 0, per*len(items))
	for _, it := range items {
		data = append(data, it...)
	}
	return ort.Tensor{Shape: append([]int64{int64(len(items))}, shape...), Data: data}
}

// fail returns the same error for every item of a batch.
func fail(n int, err error) ([]codec.Replier, []error) {
	errs := make([]error, n)
	for i := range errs {
		errs[i] = err
	}
	return make([]codec.Replier, n), errs
}

// dimOr returns shape[i] when it is a fixed size, else def.
func dimOr(shape []int64, i int, def int) int {
	if i < len(shape) && shape[i] > 0 {
		return int(shape[i])
	}
	return def
}
