package ort

// Where a session's nodes run, from ONNX Runtime's own report: its profiler. A session
// made with SessionConfig.Placement records, for each node a run executes, the EP whose
// kernel ran it (the trace's "provider"); Placement ends the profiling (OrtApi's
// SessionEndProfiling, which onnxruntime_go does not wrap: called here through the
// library's OrtGetApiBase), reads the trace and counts nodes by EP. The profiler then
// records nothing more: later runs pay nothing for it.

/*
#cgo LDFLAGS: -ldl
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

// The OrtApi struct is a table of function pointers that ONNX Runtime only ever appends
// to (its C API's ABI guarantee), so the slots of the functions used here are fixed for
// every library of API 24 and later: GetErrorMessage 2, AllocatorFree 76,
// GetAllocatorWithDefaultOptions 78, ReleaseStatus 93, SessionEndProfiling 110 (from
// onnxruntime_c_api.h of ORT_API_VERSION 24, offsetof(OrtApi, f) / sizeof(void *)).
typedef void *ovk_status;
typedef struct {
	const void *(*GetApi)(uint32_t version);
	const char *(*GetVersionString)(void);
} ort_api_base;
typedef const ort_api_base *(*ort_get_api_base_fn)(void);
typedef const char *(*ort_get_error_message_fn)(const ovk_status);
typedef ovk_status (*ort_allocator_free_fn)(void *allocator, void *p);
typedef ovk_status (*ort_get_allocator_fn)(void **out);
typedef void (*ort_release_status_fn)(ovk_status);
typedef ovk_status (*ort_end_profiling_fn)(void *session, void *allocator, char **out);

enum { ORT_SLOT_GET_ERROR_MESSAGE = 2, ORT_SLOT_ALLOCATOR_FREE = 76, ORT_SLOT_GET_ALLOCATOR = 78,
	ORT_SLOT_RELEASE_STATUS = 93, ORT_SLOT_END_PROFILING = 110, ORT_API_VERSION_USED = 24 };

static void ort_copy(char *dst, size_t size, const char *src) {
	if (src == NULL) src = "unknown error";
	size_t n = strnlen(src, size - 1);
	memcpy(dst, src, n);
	dst[n] = 0;
}

// ort_end_profiling ends session's profiling; the trace file's path goes to path (size
// bytes), an error to err. lib is the path of the library already loaded (RTLD_NOLOAD).
static int ort_end_profiling(const char *lib, void *session, char *path, char *err, size_t size) {
	void *h = dlopen(lib, RTLD_NOW | RTLD_NOLOAD);
	if (h == NULL) { ort_copy(err, size, dlerror()); return 1; }
	ort_get_api_base_fn base = (ort_get_api_base_fn)dlsym(h, "OrtGetApiBase");
	int rc = 1;
	if (base == NULL) { ort_copy(err, size, "OrtGetApiBase not found"); goto out; }
	void *const *api = (void *const *)base()->GetApi(ORT_API_VERSION_USED);
	if (api == NULL) { ort_copy(err, size, "OrtApi version 24 not offered"); goto out; }
	ort_get_error_message_fn msg = (ort_get_error_message_fn)api[ORT_SLOT_GET_ERROR_MESSAGE];
	ort_release_status_fn release = (ort_release_status_fn)api[ORT_SLOT_RELEASE_STATUS];
	void *alloc = NULL;
	ovk_status st = ((ort_get_allocator_fn)api[ORT_SLOT_GET_ALLOCATOR])(&alloc);
	if (st != NULL) { ort_copy(err, size, msg(st)); release(st); goto out; }
	char *out = NULL;
	st = ((ort_end_profiling_fn)api[ORT_SLOT_END_PROFILING])(session, alloc, &out);
	if (st != NULL) { ort_copy(err, size, msg(st)); release(st); goto out; }
	ort_copy(path, size, out ? out : "");
	if (out != NULL) {
		st = ((ort_allocator_free_fn)api[ORT_SLOT_ALLOCATOR_FREE])(alloc, out);
		if (st != NULL) release(st);
	}
	rc = 0;
out:
	dlclose(h); // RTLD_NOLOAD took a reference: give it back
	return rc;
}
*/
import "C"

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"unsafe"

	onnx "github.com/yalue/onnxruntime_go"
)

// Placement is where a session's nodes ran, as ONNX Runtime's profiler recorded them:
// the nodes its runs executed (after the runtime's graph optimisations: fused nodes count
// once, and the copies it inserts between devices count too), by EP.
type Placement struct {
	// NodesByEP counts nodes by EP (ortbus's names: cpu, webgpu, cuda, …).
	NodesByEP map[string]int `json:"nodes_by_ep"`
	// Ops lists, by EP, the op types of its nodes (sorted, each once).
	Ops map[string][]string `json:"ops"`
}

// Off returns the op types of the nodes that ran on an EP other than ep, "op (EP)" each,
// sorted.
func (p *Placement) Off(ep string) []string {
	var out []string
	if p == nil {
		return nil
	}
	for e, ops := range p.Ops {
		if e == ep {
			continue
		}
		for _, op := range ops {
			out = append(out, op+" ("+e+")")
		}
	}
	slices.Sort(out)
	return out
}

// Add adds q's counts to p.
func (p *Placement) Add(q *Placement) {
	if q == nil {
		return
	}
	if p.NodesByEP == nil {
		p.NodesByEP, p.Ops = map[string]int{}, map[string][]string{}
	}
	for e, n := range q.NodesByEP {
		p.NodesByEP[e] += n
	}
	for e, ops := range q.Ops {
		for _, op := range ops {
			if !slices.Contains(p.Ops[e], op) {
				p.Ops[e] = append(p.Ops[e], op)
			}
		}
		slices.Sort(p.Ops[e])
	}
}

// ErrNoPlacement is Placement's error for a session made without SessionConfig.Placement,
// or whose placement was taken already.
var ErrNoPlacement = errors.New("the session does not record its placement (SessionConfig.Placement), or gave it already")

// maxProfileBytes bounds the profiler's trace read: a warm-up's runs write a few events
// per node.
const maxProfileBytes = 64 << 20

var profileSeq atomic.Uint64

// profilePrefix is a fresh prefix for a session's trace file (the runtime appends the
// time and ".json").
func profilePrefix() string {
	return filepath.Join(os.TempDir(), fmt.Sprintf("ortbus-placement-%d-%d", os.Getpid(), profileSeq.Add(1)))
}

// Placement ends the session's profiling and returns where the nodes of the runs so far
// ran (call it after a warm-up run; no run: no node). It can be called once; the trace
// file is removed.
func (s *Session) Placement() (*Placement, error) {
	if s == nil || !s.profiling.CompareAndSwap(true, false) {
		return nil, ErrNoPlacement
	}
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.s == nil {
		return nil, errors.New("the session is closed")
	}
	rt := Current()
	if rt == nil {
		return nil, errors.New("no runtime loaded")
	}
	// onnxruntime_go v1.27.0: a DynamicAdvancedSession holds an *AdvancedSession whose
	// first field is the *OrtSession (go.mod pins the version; ort_test checks the layout
	// by ending a real session's profiling).
	adv := *(*unsafe.Pointer)(unsafe.Pointer(s.s))
	if adv == nil {
		return nil, errors.New("the session has no runtime session")
	}
	ortSession := *(*unsafe.Pointer)(adv)
	lib := C.CString(rt.Path)
	defer C.free(unsafe.Pointer(lib))
	const size = 4096
	buf := (*C.char)(C.calloc(2, size))
	defer C.free(unsafe.Pointer(buf))
	path, cerr := buf, (*C.char)(unsafe.Add(unsafe.Pointer(buf), size))
	if C.ort_end_profiling(lib, ortSession, path, cerr, size) != 0 {
		return nil, fmt.Errorf("ending the profiling: %s", C.GoString(cerr))
	}
	file := C.GoString(path)
	if file == "" {
		return nil, errors.New("the runtime wrote no profile")
	}
	defer os.Remove(file)
	f, err := os.Open(file)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return parsePlacement(io.LimitReader(f, maxProfileBytes))
}

// parsePlacement reads a profiler trace (a JSON array of events) and counts its node
// events' nodes by provider: each node once (its kernel_time event names it).
func parsePlacement(r io.Reader) (*Placement, error) {
	var events []struct {
		Cat  string `json:"cat"`
		Name string `json:"name"`
		Args struct {
			OpName   string `json:"op_name"`
			Provider string `json:"provider"`
		} `json:"args"`
	}
	if err := json.NewDecoder(r).Decode(&events); err != nil {
		return nil, fmt.Errorf("reading the runtime's profile: %w", err)
	}
	p := &Placement{NodesByEP: map[string]int{}, Ops: map[string][]string{}}
	seen := map[string]bool{}
	for _, e := range events {
		node, ok := strings.CutSuffix(e.Name, "_kernel_time")
		if e.Cat != "Node" || !ok || e.Args.Provider == "" || seen[node] {
			continue
		}
		seen[node] = true
		ep := EPName(e.Args.Provider)
		p.NodesByEP[ep]++
		if op := e.Args.OpName; op != "" && !slices.Contains(p.Ops[ep], op) {
			p.Ops[ep] = append(p.Ops[ep], op)
		}
	}
	for _, e := range slices.Collect(maps.Keys(p.Ops)) {
		slices.Sort(p.Ops[e])
	}
	return p, nil
}

// EPName is ortbus's name of an ONNX Runtime provider: CPUExecutionProvider is cpu,
// WebGpuExecutionProvider webgpu, CUDAExecutionProvider cuda, and so on (lower case,
// without "ExecutionProvider").
func EPName(provider string) string {
	switch provider {
	case "CPUExecutionProvider":
		return "cpu"
	case "WebGpuExecutionProvider":
		return "webgpu"
	case "CUDAExecutionProvider":
		return "cuda"
	case "TensorrtExecutionProvider":
		return "tensorrt"
	case "OpenVINOExecutionProvider":
		return "openvino"
	}
	return strings.ToLower(strings.TrimSuffix(provider, "ExecutionProvider"))
}

// enableProfiling turns the runtime's profiler on in opts, for Placement.
func enableProfiling(opts *onnx.SessionOptions) error {
	return opts.EnableProfiling(profilePrefix())
}

// DisableCPUFallback is ONNX Runtime's session entry that makes creating a session fail
// when any node would be placed on the CPU EP beside the session's own.
const DisableCPUFallback = "session.disable_cpu_ep_fallback"

// CheckNoCPUFallback asks ONNX Runtime itself whether every node of the model at path
// is placed on provider p (a session made with DisableCPUFallback, then closed): nil when
// it is, else the runtime's refusal. It cannot name the nodes (the runtime does not);
// Placement, after a run, does.
func (r *Runtime) CheckNoCPUFallback(path string, p Provider) error {
	s, err := r.NewSession(path, SessionConfig{Providers: []Provider{p}, IntraOpThreads: 1, InterOpThreads: 1, Entries: map[string]string{DisableCPUFallback: "1"}})
	if err != nil {
		return err
	}
	return s.Close()
}
