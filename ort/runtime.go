package ort

import (
	"os"
	"sync"

	onnx "github.com/yalue/onnxruntime_go"

	"github.com/ortbus/ortbus/codec"
)

// Runtime is the ONNX Runtime library loaded into this process.
type Runtime struct {
	Path    string
	Version string
}

var (
	mu      sync.Mutex
	current *Runtime
)

// Load loads the runtime library at path into this process and initialises its
// environment. A process holds one runtime: loading a second, different library fails
// (the ORT core keeps process-global state); loading the same one again returns it.
// A library that cannot be loaded is a runtime_missing error carrying the loader's text.
func Load(path string) (*Runtime, error) {
	mu.Lock()
	defer mu.Unlock()
	if current != nil {
		if sameFile(current.Path, path) {
			return current, nil
		}
		return nil, codec.Errorf(codec.CodeInternal, "cannot load %s: this process already runs %s (%s); one runtime per process", path, current.Path, current.Version)
	}
	if err := checkLibrary(path); err != nil {
		return nil, codec.Errorf(codec.CodeRuntimeMissing, "ONNX Runtime library %s: %v", path, err).With("searched", []string{path})
	}
	onnx.SetSharedLibraryPath(path)
	if err := onnx.InitializeEnvironment(onnx.WithLogLevelError()); err != nil {
		return nil, codec.Errorf(codec.CodeRuntimeMissing, "loading ONNX Runtime %s: %v", path, err).With("searched", []string{path})
	}
	current = &Runtime{Path: path, Version: onnx.GetVersion()}
	return current, nil
}

// Current is the runtime loaded into this process, nil before Load.
func Current() *Runtime {
	mu.Lock()
	defer mu.Unlock()
	return current
}

// LoadSpec finds the library of spec and loads it.
func LoadSpec(spec Spec) (*Runtime, error) {
	p, err := spec.Find()
	if err != nil {
		return nil, err
	}
	rt, err := Load(p)
	if err != nil {
		if e := codec.AsError(err); e.Code == codec.CodeRuntimeMissing {
			e.With("searched", spec.Candidates())
		}
		return nil, err
	}
	return rt, nil
}

// Close unloads the runtime. Sessions must be closed first.
func (r *Runtime) Close() error {
	mu.Lock()
	defer mu.Unlock()
	if current != r {
		return nil
	}
	current = nil
	return onnx.DestroyEnvironment()
}

func sameFile(a, b string) bool {
	sa, err1 := os.Stat(a)
	sb, err2 := os.Stat(b)
	return err1 == nil && err2 == nil && os.SameFile(sa, sb)
}
