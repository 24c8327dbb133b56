package ort

import (
	"context"
	"errors"
	"fmt"
	"os"
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
	Outputs []IOInfo

	mu sync.RWMutex // Run holds it shared, Close exclusively: no run outlives its session
	s  *onnx.DynamicAdvancedSession
}

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
		return nil, fmt.Errorf("read model %s: %w", path, err)
	}
	s := &Session{Path: path, Inputs: ioInfos(ins), Outputs: ioInfos(outs)}
	provs := cfg.Providers
	if len(provs) == 0 {
		provs = []Provider{{Name: "cpu"}}
	}
	var tried []string
	for _, p := range provs {
		sess, err := newSession(path, s.Inputs, s.Outputs, p, cfg)
		if err == nil {
			s.s, s.EP = sess, p.Name
			sessionsCreated.Add(1)
			return s, nil
		}
		tried = append(tried, p.Name+": "+err.Error())
	}
	first := provs[0]
	return nil, codec.Errorf(codec.CodeProviderUnavailable, "execution provider %s unavailable: %s", first.Name, strings.Join(tried, "; ")).
		With("ep", first.Name).With("error", tried[0]).With("tried", tried)
}

// newSession builds fresh session options for one provider attempt: a failed append can
// leave entries behind, so options are never reused across attempts.
func newSession(path string, ins, outs []IOInfo, p Provider, cfg SessionConfig) (*onnx.DynamicAdvancedSession, error) {
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
	if err := appendProvider(opts, p); err != nil {
		return nil, err
	}
	return onnx.NewDynamicAdvancedSession(path, names(ins), names(outs), opts)
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
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.s == nil {
		return nil
	}
	err := s.s.Destroy()
	s.s = nil
	return err
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

// Run runs the model on the named inputs and returns every output in model order. When
// ctx is cancelled the run is stopped through ONNX Runtime's terminate flag and Run
// returns a cancelled *codec.Error.
func (s *Session) Run(ctx context.Context, inputs []Tensor) ([]Tensor, error) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.s == nil {
		return nil, codec.Errorf(codec.CodeInternal, "session of %s is closed", s.Path)
	}
	vals := make([]onnx.Value, len(s.Inputs))
	defer func() {
		for _, v := range vals {
			if v != nil {
				v.Destroy()
			}
		}
	}()
	for i, in := range s.Inputs {
		t, ok := findTensor(inputs, in.Name)
		if !ok {
			return nil, codec.Errorf(codec.CodeBadRequest, "missing input %q (model inputs: %s)", in.Name, strings.Join(names(s.Inputs), ", "))
		}
		v, err := t.value()
		if err != nil {
			return nil, codec.Errorf(codec.CodeBadRequest, "input %q: %v", in.Name, err)
		}
		vals[i] = v
	}
	outs := make([]onnx.Value, len(s.Outputs))
	defer func() {
		for _, v := range outs {
			if v != nil {
				v.Destroy()
			}
		}
	}()
	if err := s.run(ctx, vals, outs); err != nil {
		return nil, err
	}
	res := make([]Tensor, len(outs))
	for i, v := range outs {
		t, err := fromValue(s.Outputs[i].Name, v)
		if err != nil {
			return nil, err
		}
		res[i] = t
	}
	return res, nil
}

func (s *Session) run(ctx context.Context, in, out []onnx.Value) error {
	if ctx.Done() == nil {
		return s.s.Run(in, out)
	}
	if err := ctx.Err(); err != nil {
		return codec.Errorf(codec.CodeCancelled, "cancelled before running: %v", err)
	}
	ro, err := onnx.NewRunOptions()
	if err != nil {
		return err
	}
	defer ro.Destroy()
	// Terminate on cancel or deadline without a goroutine per run: the AfterFunc runs
	// only if ctx ends first, and never once the run has returned (ro is destroyed then).
	var mu sync.Mutex
	finished := false
	stop := context.AfterFunc(ctx, func() {
		mu.Lock()
		defer mu.Unlock()
		if !finished {
			ro.Terminate()
		}
	})
	err = s.s.RunWithOptions(in, out, ro)
	if !stop() {
		mu.Lock()
		finished = true
		mu.Unlock()
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
		out[i] = IOInfo{Name: x.Name, Shape: append([]int64(nil), x.Dimensions...), Type: typeName(x.DataType)}
	}
	return out
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
	case onnx.TensorElementDataTypeUint8:
		return "uint8"
	case onnx.TensorElementDataTypeBool:
		return "bool"
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
