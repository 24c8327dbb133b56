package ort

import (
	"context"
	"errors"
	"fmt"
	"os"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

	onnx "github.com/yalue/onnxruntime_go"

	"github.com/ortbus/ortbus/codec"
)

// Provider is one execution provider with its options.
type Provider struct {
	// Name is cpu, cuda, openvino or tensorrt.
	Name string
	// Options are the provider's own options: for cuda and tensorrt e.g. device_id,
	// gpu_mem_limit, arena_extend_strategy; for openvino device_type (GPU, GPU.0, NPU,
	// AUTO:GPU,CPU, HETERO:GPU,CPU), precision, cache_dir, num_of_threads.
	Options map[string]string
}

// SessionConfig configures a session.
type SessionConfig struct {
	// Providers is the preferred EP followed by its fallbacks, tried in order with fresh
	// session options each time. One entry means strict: failure is provider_unavailable.
	Providers []Provider
	// IntraOpThreads and InterOpThreads (0 = the runtime's default).
	IntraOpThreads int
	InterOpThreads int
	// Entries are session configuration entries (AddSessionConfigEntry), e.g.
	// session.intra_op.allow_spinning.
	Entries map[string]string
	// Placement turns the runtime's profiler on until Session.Placement takes where the
	// nodes of the runs so far ran (placement.go): after the load's warm-up.
	Placement bool
}

// IOInfo describes one input or output of a model.
type IOInfo struct {
	Name  string
	Shape []int64 // -1 for a symbolic dimension
	Type  string  // float32, int64, bool, ...
}

// Session is a loaded model. Run is safe to call from several goroutines at once.
type Session struct {
	Path    string
	EP      string // the provider actually in use
	Inputs  []IOInfo
	Outputs []IOInfo // every output of the model, in model order

	mu sync.RWMutex // Run holds it shared, Close exclusively: no run outlives its session
	s  *onnx.DynamicAdvancedSession
	// fetch are the indices in Outputs of the outputs the session fetches: the tensors of
	// an element type ortbus can return (Returns). The others (a sequence, a map, an
	// optional, an element type it cannot copy) are never fetched, so that a model with
	// such an output still runs for the others.
	fetch []int
	// rname and rtype are, for each fetched output, its name and element type in the
	// session the runtime runs: its own, except for a float16 or bfloat16 output of an
	// open shape, which the session fetches cast to float32 (see halfcast.go).
	rname, rtype []string
	// scalar[i] is set once output fetch[i] is known to be rank 0: it is then given to the
	// runtime preallocated (see Run).
	scalar []atomic.Bool
	// rin are the names of Inputs in the session the runtime runs, and rank1[i] is set for
	// a rank-0 input that it takes with shape [1] (a float16, bfloat16 or string scalar,
	// which onnxruntime_go cannot make: see scalarin.go).
	rin   []string
	rank1 []bool
	// ros are RunOptions of finished runs, reused by the next runs with a context (one
	// cgo allocation and release less per item); one a run terminated is destroyed, not
	// reused. Close destroys them.
	ros chan *onnx.RunOptions
	// profiling is set while the runtime's profiler records (SessionConfig.Placement),
	// until Placement ends it.
	profiling atomic.Bool
}

// maxIdleRunOptions bounds a session's idle RunOptions: more than its concurrent runs
// (a worker's slots) are never kept.
const maxIdleRunOptions = 8

var sessionsCreated atomic.Uint64

// SessionsCreated counts the sessions this process has created, so a test can prove
// that models are loaded once and reused.
func SessionsCreated() uint64 { return sessionsCreated.Load() }

// NewSession loads the model at path with the first provider of cfg that can be used.
func (r *Runtime) NewSession(path string, cfg SessionConfig) (*Session, error) {
	if st, err := os.Stat(path); err != nil || !st.Mode().IsRegular() {
		return nil, codec.Errorf(codec.CodeFileNotFound, "model file %s does not exist or is not a regular file", path).With("path", path)
	}
	ins, outs, err := onnx.GetInputOutputInfo(path)
	if err != nil {
		// The runtime itself refuses the file (not a model, an operator it does not know,
		// an opset it does not have): this model cannot be served, whatever the EP.
		return nil, codec.Errorf(codec.CodeModelUnavailable, "ONNX Runtime cannot load %s: %v", path, err).With("path", path)
	}
	s := &Session{Path: path, Inputs: ioInfos(ins), Outputs: ioInfos(outs), ros: make(chan *onnx.RunOptions, maxIdleRunOptions)}
	// The plans to load, in order: with every output ortbus can return, open-shaped
	// halves cast to float32, and rank-0 half and string inputs taken with shape [1], in a
	// rewritten copy of the model; if that copy cannot be made or loaded, one with the
	// outputs' rewrite alone; then the file as it is, without those outputs (as ortbus did
	// before it could return them) and refusing those inputs at Run.
	var open, scalars []string
	for _, o := range s.Outputs {
		if returnable(o) && isHalf(o.Type) && !preallocHalf(o) {
			open = append(open, o.Name)
		}
	}
	for _, in := range s.Inputs {
		if scalarInput(in) {
			scalars = append(scalars, in.Name)
		}
	}
	type plan struct {
		model   []byte
		renamed map[string]string // outputs
		inputs  map[string]string
	}
	plans := []plan{{}}
	if len(open) > 0 || len(scalars) > 0 {
		plans = nil
		if len(scalars) > 0 {
			if model, renamed, inputs, err := rewriteModel(path, open, scalars); err == nil && len(inputs) > 0 {
				plans = append(plans, plan{model, renamed, inputs})
			}
		}
		if len(open) > 0 {
			if model, renamed, _, err := rewriteModel(path, open, nil); err == nil {
				plans = append(plans, plan{model, renamed, nil})
			}
		}
		plans = append(plans, plan{renamed: map[string]string{}})
	}
	var first error
	for k, pl := range plans {
		s.rin, s.rank1 = names(s.Inputs), make([]bool, len(s.Inputs))
		for i, in := range s.Inputs {
			if to, ok := pl.inputs[in.Name]; ok {
				s.rin[i], s.rank1[i] = to, true
			}
		}
		s.fetch, s.rname, s.rtype = nil, nil, nil
		for i, o := range s.Outputs {
			if !returnable(o) || pl.renamed != nil && isHalf(o.Type) && !preallocHalf(o) && pl.renamed[o.Name] == "" {
				continue
			}
			s.fetch = append(s.fetch, i)
			if to, ok := pl.renamed[o.Name]; ok {
				s.rname, s.rtype = append(s.rname, to), append(s.rtype, "float32")
			} else {
				s.rname, s.rtype = append(s.rname, o.Name), append(s.rtype, o.Type)
			}
		}
		s.scalar = make([]atomic.Bool, len(s.fetch))
		err := s.check()
		if err == nil {
			err = s.load(pl.model, cfg)
		}
		if err == nil {
			sessionsCreated.Add(1)
			return s, nil
		}
		if k == 0 {
			first = err
		}
	}
	return nil, first
}

// load creates the runtime's session of s (from model when not nil, else from s.Path)
// with the first provider of cfg that can be used.
func (s *Session) load(model []byte, cfg SessionConfig) error {
	provs := cfg.Providers
	if len(provs) == 0 {
		provs = []Provider{{Name: "cpu"}}
	}
	var tried []string
	for _, p := range provs {
		sess, err := newSession(s.Path, model, s.rin, s.rname, p, cfg)
		if err == nil {
			s.s, s.EP = sess, p.Name
			s.profiling.Store(cfg.Placement)
			return nil
		}
		tried = append(tried, p.Name+": "+err.Error())
	}
	first := provs[0]
	return codec.Errorf(codec.CodeProviderUnavailable, "execution provider %s unavailable: %s", first.Name, strings.Join(tried, "; ")).
		With("ep", first.Name).With("error", tried[0]).With("tried", tried)
}

// newSession builds fresh session options for one provider attempt: a failed append can
// leave entries behind, so options are never reused across attempts. The session is of
// model when not nil (a rewritten copy of the file at path), else of the file at path.
func newSession(path string, model []byte, ins, outs []string, p Provider, cfg SessionConfig) (*onnx.DynamicAdvancedSession, error) {
	opts, err := onnx.NewSessionOptions()
	if err != nil {
		return nil, err
	}
	defer opts.Destroy()
	if cfg.IntraOpThreads > 0 {
		if err := opts.SetIntraOpNumThreads(cfg.IntraOpThreads); err != nil {
			return nil, err
		}
	}
	if cfg.InterOpThreads > 0 {
		if err := opts.SetInterOpNumThreads(cfg.InterOpThreads); err != nil {
			return nil, err
		}
	}
	for k, v := range cfg.Entries {
		if err := opts.AddSessionConfigEntry(k, v); err != nil {
			return nil, fmt.Errorf("session config %s=%s: %w", k, v, err)
		}
	}
	if cfg.Placement {
		if err := enableProfiling(opts); err != nil {
			return nil, fmt.Errorf("profiling (for the placement): %w", err)
		}
	}
	if err := appendProvider(opts, p); err != nil {
		return nil, err
	}
	if model != nil {
		if _, set := cfg.Entries[pbExternalDataPath]; !set {
			if err := opts.AddSessionConfigEntry(pbExternalDataPath, modelDir(path)); err != nil {
				return nil, fmt.Errorf("session config %s: %w", pbExternalDataPath, err)
			}
		}
		return onnx.NewDynamicAdvancedSessionWithONNXData(model, ins, outs, opts)
	}
	return onnx.NewDynamicAdvancedSession(path, ins, outs, opts)
}

func appendProvider(opts *onnx.SessionOptions, p Provider) error {
	switch p.Name {
	case "cpu", "":
		return nil
	case "cuda":
		co, err := onnx.NewCUDAProviderOptions()
		if err != nil {
			return err
		}
		defer co.Destroy()
		o := withDefault(p.Options, "device_id", "0")
		if err := co.Update(o); err != nil {
			return err
		}
		return opts.AppendExecutionProviderCUDA(co)
	case "tensorrt":
		to, err := onnx.NewTensorRTProviderOptions()
		if err != nil {
			return err
		}
		defer to.Destroy()
		if err := to.Update(withDefault(p.Options, "device_id", "0")); err != nil {
			return err
		}
		return opts.AppendExecutionProviderTensorRT(to)
	case "openvino":
		return opts.AppendExecutionProviderOpenVINO(p.Options)
	case "webgpu":
		return opts.AppendExecutionProvider("WebGPU", p.Options)
	}
	return fmt.Errorf("unknown execution provider %q", p.Name)
}

func withDefault(m map[string]string, k, v string) map[string]string {
	out := map[string]string{k: v}
	for a, b := range m {
		out[a] = b
	}
	return out
}

// Close releases the session.
func (s *Session) Close() error {
	if s == nil {
		return nil
	}
	if s.profiling.Load() {
		s.Placement() // ends the profiling and removes its trace: no file left behind
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.s == nil {
		return nil
	}
	err := s.s.Destroy()
	s.s = nil
	for {
		select {
		case ro := <-s.ros:
			ro.Destroy()
		default:
			return err
		}
	}
}

// Input returns the input named name, or the first input when name is "".
func (s *Session) Input(name string) (IOInfo, bool) {
	for _, in := range s.Inputs {
		if name == "" || in.Name == name {
			return in, true
		}
	}
	return IOInfo{}, false
}

// check refuses, at load, a model that Run could never run: one without an output ortbus
// can return, or one without inputs whose outputs' shapes are not all known (such a model
// is run through an I/O binding, which needs every output preallocated).
func (s *Session) check() error {
	if len(s.fetch) == 0 {
		return codec.Errorf(codec.CodeModelUnavailable, "model %s has no output ortbus can return (outputs: %s)", s.Path, describe(s.Outputs)).With("path", s.Path)
	}
	for _, i := range s.fetch {
		// A shape the model file fixes is what an output made before the run takes: bounded
		// like any tensor's.
		if o := s.Outputs[i]; !dynamic(o.Shape) {
			if _, err := codec.Elements(o.Shape); err != nil {
				return codec.Errorf(codec.CodeModelUnavailable, "model %s: output %q: %v", s.Path, o.Name, err).With("path", s.Path)
			}
		}
	}
	if len(s.Inputs) > 0 {
		return nil
	}
	for _, i := range s.fetch {
		if o := s.Outputs[i]; dynamic(o.Shape) {
			return codec.Errorf(codec.CodeModelUnavailable, "model %s has no inputs and its output %q has a dynamic shape %v: ortbus runs a model without inputs only when the runtime knows each output's shape", s.Path, o.Name, o.Shape).With("path", s.Path)
		}
		if o := s.Outputs[i]; o.Type == "string" && len(o.Shape) == 0 {
			return codec.Errorf(codec.CodeModelUnavailable, "model %s has no inputs and its output %q is a rank-0 string: onnxruntime_go cannot preallocate one", s.Path, o.Name).With("path", s.Path)
		}
	}
	return nil
}

// Returns reports whether Run returns the output named name (see Session.fetch).
func (s *Session) Returns(name string) bool {
	for _, i := range s.fetch {
		if s.Outputs[i].Name == name {
			return true
		}
	}
	return false
}

// Run runs the model on the named inputs and returns its outputs in model order: every
// output Returns reports, the others left out. When ctx is cancelled the run is stopped
// through ONNX Runtime's terminate flag and Run returns a cancelled *codec.Error.
//
// Shapes: a rank-0 (scalar) input or output, a zero-size dimension, and a model without
// inputs all run (a rank-0 float16, bfloat16 or string input through a rewritten model:
// scalarin.go). onnxruntime_go cannot copy a rank-0 output that the runtime allocated
// (its tensors need a dimension), so a rank-0 output is given to the runtime
// preallocated. The runtime reports an output of unknown rank with no dimensions too, as
// if it were rank 0, so such an output is first left to the runtime to allocate; when
// that run shows it is rank 0 (its copy fails), it is marked so and the run is done again
// with it preallocated — once per output for the life of the session. A model without
// inputs is run through an I/O binding with every output preallocated (onnxruntime_go's
// plain run needs at least one input); that run cannot be terminated midway.
func (s *Session) Run(ctx context.Context, inputs []Tensor) ([]Tensor, error) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.s == nil {
		return nil, codec.Errorf(codec.CodeInternal, "session of %s is closed", s.Path)
	}
	vals := make([]onnx.Value, len(s.Inputs))
	defer destroy(vals)
	for i, in := range s.Inputs {
		t, ok := findTensor(inputs, in.Name)
		if !ok {
			return nil, codec.Errorf(codec.CodeBadRequest, "missing input %q (model inputs: %s)", in.Name, strings.Join(names(s.Inputs), ", "))
		}
		if s.rank1[i] {
			// A scalar the rewritten model takes as [1] (scalarin.go).
			if len(t.Shape) != 0 {
				return nil, codec.Errorf(codec.CodeBadRequest, "input %q: the model wants a rank-0 (scalar) tensor, shape [], got shape %v", in.Name, t.Shape)
			}
			t.Shape = []int64{1}
		}
		v, err := t.value()
		if err != nil {
			return nil, codec.Errorf(codec.CodeBadRequest, "input %q: %v", in.Name, err)
		}
		vals[i] = v
	}
	for range len(s.fetch) + 1 { // each retry learns one more rank-0 output
		outs, err := s.outputs()
		if err != nil {
			destroy(outs)
			return nil, err
		}
		if len(vals) == 0 {
			err = s.runBound(ctx, outs)
		} else {
			err = s.run(ctx, vals, outs)
		}
		if err != nil {
			retry := s.learnScalar(outs)
			destroy(outs)
			if retry {
				continue
			}
			return nil, err
		}
		res, err := s.results(outs)
		destroy(outs)
		return res, err
	}
	return nil, codec.Errorf(codec.CodeInternal, "run of %s: the shapes of its outputs could not be learnt", s.Path)
}

// outputs are the output values of one run: a preallocated scalar for each output known
// to be rank 0; for a model without inputs, a preallocated tensor of its known shape for
// every other output (check made sure there is one); nil, for the runtime to allocate,
// otherwise.
func (s *Session) outputs() ([]onnx.Value, error) {
	outs := make([]onnx.Value, len(s.fetch))
	for j, i := range s.fetch {
		o, typ := s.Outputs[i], s.rtype[j]
		var err error
		switch {
		case s.scalar[j].Load() || len(s.Inputs) == 0 && len(o.Shape) == 0:
			outs[j], err = newScalar(typ)
		case len(s.Inputs) == 0 || isHalf(typ):
			outs[j], err = newEmpty(typ, o.Shape) // a half's shape is known (preallocHalf)
		}
		if err != nil {
			return outs, codec.Errorf(codec.CodeInternal, "output %q: %v", o.Name, err)
		}
	}
	return outs, nil
}

// learnScalar looks at the outputs of a failed run for one the runtime allocated and
// onnxruntime_go could not copy (it leaves a nil tensor there): if that output has no
// dimensions as reported, it is rank 0; it is marked so, and learnScalar reports that
// the run should be done again. A run that failed otherwise is not retried. (That failed
// copy leaks the runtime's values of the outputs after it, in onnxruntime_go: once per
// rank-0 output of unknown rank, for the life of the session.)
func (s *Session) learnScalar(outs []onnx.Value) bool {
	for j, v := range outs {
		if v == nil || !isNil(v) {
			continue
		}
		if len(s.Outputs[s.fetch[j]].Shape) != 0 || s.rtype[j] == "string" || s.scalar[j].Swap(true) {
			return false
		}
		return true
	}
	return false
}

// results copies the outputs of a run into Go memory.
func (s *Session) results(outs []onnx.Value) ([]Tensor, error) {
	res := make([]Tensor, len(outs))
	for j, v := range outs {
		o := s.Outputs[s.fetch[j]]
		if v == nil || isNil(v) {
			return nil, codec.Errorf(codec.CodeInternal, "the runtime returned no value for output %q", o.Name)
		}
		t, err := fromValue(o.Name, s.rtype[j], v)
		if err != nil {
			return nil, err
		}
		if o.Type != s.rtype[j] {
			if t, err = fromCast(t, o.Type); err != nil {
				return nil, err
			}
		}
		res[j] = t
	}
	return res, nil
}

// runBound runs a model without inputs through an I/O binding, every output bound to its
// preallocated value. RunWithBinding takes no run options, so ctx is only checked first.
func (s *Session) runBound(ctx context.Context, outs []onnx.Value) error {
	if err := ctx.Err(); err != nil {
		return codec.Errorf(codec.CodeCancelled, "cancelled before running: %v", err)
	}
	b, err := s.s.CreateIoBinding()
	if err != nil {
		return err
	}
	defer b.Destroy()
	for j, v := range outs {
		if err := b.BindOutput(s.rname[j], v); err != nil {
			return err
		}
	}
	return s.s.RunWithBinding(b)
}

// destroy releases the values of a run. onnxruntime_go may leave a nil tensor in an
// interface (an output it failed to copy): that is skipped, never destroyed.
func destroy(vals []onnx.Value) {
	for _, v := range vals {
		if v != nil && !isNil(v) {
			v.Destroy()
		}
	}
}

// isNil reports whether v holds a nil pointer.
func isNil(v onnx.Value) bool {
	rv := reflect.ValueOf(v)
	return rv.Kind() == reflect.Pointer && rv.IsNil()
}

func describe(infos []IOInfo) string {
	parts := make([]string, len(infos))
	for i, x := range infos {
		parts[i] = x.Name + ": " + x.Type
	}
	return strings.Join(parts, ", ")
}

func (s *Session) run(ctx context.Context, in, out []onnx.Value) error {
	if ctx.Done() == nil {
		return s.s.Run(in, out)
	}
	if err := ctx.Err(); err != nil {
		return codec.Errorf(codec.CodeCancelled, "cancelled before running: %v", err)
	}
	var ro *onnx.RunOptions
	select {
	case ro = <-s.ros:
	default:
		var err error
		if ro, err = onnx.NewRunOptions(); err != nil {
			return err
		}
	}
	// Terminate on cancel or deadline without a goroutine per run: the AfterFunc runs
	// only if ctx ends first, and never once the run has returned (ro is reused or
	// destroyed then).
	var mu sync.Mutex
	finished, terminated := false, false
	stop := context.AfterFunc(ctx, func() {
		mu.Lock()
		defer mu.Unlock()
		if !finished {
			ro.Terminate()
			terminated = true
		}
	})
	err := s.s.RunWithOptions(in, out, ro)
	if !stop() {
		mu.Lock()
		finished = true
		mu.Unlock()
	}
	if terminated {
		ro.Destroy()
	} else {
		select {
		case s.ros <- ro:
		default:
			ro.Destroy()
		}
	}
	if err != nil && ctx.Err() != nil {
		if errors.Is(ctx.Err(), context.DeadlineExceeded) {
			return codec.Errorf(codec.CodeDeadlineExceeded, "run terminated at the deadline")
		}
		return codec.Errorf(codec.CodeCancelled, "run terminated: %v", ctx.Err())
	}
	return err
}

func names(infos []IOInfo) []string {
	out := make([]string, len(infos))
	for i, in := range infos {
		out[i] = in.Name
	}
	return out
}

func ioInfos(in []onnx.InputOutputInfo) []IOInfo {
	out := make([]IOInfo, len(in))
	for i, x := range in {
		typ := typeName(x.DataType)
		if x.OrtValueType != onnx.ONNXTypeTensor {
			typ = valueKind(x.OrtValueType)
		}
		out[i] = IOInfo{Name: x.Name, Shape: append([]int64(nil), x.Dimensions...), Type: typ}
	}
	return out
}

// valueKind names an input or output that is not a tensor.
func valueKind(t onnx.ONNXType) string {
	switch t {
	case onnx.ONNXTypeSequence:
		return "sequence"
	case onnx.ONNXTypeMap:
		return "map"
	case onnx.ONNXTypeOptional:
		return "optional"
	case onnx.ONNXTypeSparseTensor:
		return "sparse_tensor"
	case onnx.ONNXTypeOpaque:
		return "opaque"
	}
	return "onnx_type" + strconv.Itoa(int(t))
}

func typeName(t onnx.TensorElementDataType) string {
	switch t {
	case onnx.TensorElementDataTypeFloat:
		return "float32"
	case onnx.TensorElementDataTypeDouble:
		return "float64"
	case onnx.TensorElementDataTypeInt64:
		return "int64"
	case onnx.TensorElementDataTypeInt32:
		return "int32"
	case onnx.TensorElementDataTypeInt16:
		return "int16"
	case onnx.TensorElementDataTypeInt8:
		return "int8"
	case onnx.TensorElementDataTypeUint64:
		return "uint64"
	case onnx.TensorElementDataTypeUint32:
		return "uint32"
	case onnx.TensorElementDataTypeUint16:
		return "uint16"
	case onnx.TensorElementDataTypeFloat16:
		return "float16"
	case onnx.TensorElementDataTypeBFloat16:
		return "bfloat16"
	case onnx.TensorElementDataTypeUint8:
		return "uint8"
	case onnx.TensorElementDataTypeBool:
		return "bool"
	case onnx.TensorElementDataTypeString:
		return "string"
	}
	return "type" + strconv.Itoa(int(t))
}

// ProbeProvider reports whether provider p can be appended to fresh session options of
// this runtime, returning the runtime's own error text when it cannot.
func (r *Runtime) ProbeProvider(p Provider) error {
	opts, err := onnx.NewSessionOptions()
	if err != nil {
		return err
	}
	defer opts.Destroy()
	return appendProvider(opts, p)
}

// ProbeChain reports whether any provider of cfg's chain (the preferred EP, then its
// fallbacks) can be appended to fresh session options of this runtime: nil when one can,
// else a provider_unavailable *codec.Error carrying each one's error, as NewSession's.
// It loads no model: a pool whose whole chain is unusable (a provider library missing)
// is told apart from a model that one provider refuses.
func (r *Runtime) ProbeChain(cfg SessionConfig) error {
	provs := cfg.Providers
	if len(provs) == 0 {
		return nil
	}
	var tried []string
	for _, p := range provs {
		err := r.ProbeProvider(p)
		if err == nil {
			return nil
		}
		tried = append(tried, p.Name+": "+err.Error())
	}
	first := provs[0]
	return codec.Errorf(codec.CodeProviderUnavailable, "execution provider %s unavailable: %s", first.Name, strings.Join(tried, "; ")).
		With("ep", first.Name).With("error", tried[0]).With("tried", tried)
}

// dynamic reports whether a shape has a dimension the model leaves open (negative).
func dynamic(shape []int64) bool {
	return slices.ContainsFunc(shape, func(d int64) bool { return d < 0 })
}
