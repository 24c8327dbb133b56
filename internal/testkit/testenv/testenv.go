// Package testenv holds small helpers shared by the tests of the whole repository: where
// the repository is, where the fetched ONNX Runtime libraries are, a once-per-process
// directory of generated models, and the re-exec pattern for tests that must run in a
// process of their own.
//
// # Re-exec (one runtime per process)
//
// ONNX Runtime keeps process-global state, so a process loads one runtime library at most
// (see package ort). A test that loads a runtime therefore runs in a child process: the
// parent test re-runs the test binary for one test only, with ORTBUS_CHILD naming it, and
// judges the child by its exit status and output. The child test does the real work when
// InChild reports that it is the child, and returns at once otherwise:
//
//	func TestRuntimeParent(t *testing.T) {
//		for _, v := range testenv.Versions {
//			t.Run(v, func(t *testing.T) {
//				testenv.RunChild(t, "TestRuntimeChild", "MY_LIB="+testenv.RuntimeLib(t, v))
//			})
//		}
//	}
//
//	func TestRuntimeChild(t *testing.T) {
//		if !testenv.InChild("TestRuntimeChild") {
//			t.Skip("runs only as a child of TestRuntimeParent")
//		}
//		rt, err := ort.Load(os.Getenv("MY_LIB"))
//		...
//	}
//
// The child inherits the parent's environment (plus ORTBUS_CHILD, ORTBUS_TEST_MODELS and
// the extra variables), runs verbosely, and gets the parent's remaining test deadline. A
// binary built with -race stays -race in the child, since it is the same binary.
package testenv

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ortbus/ortbus/models/onnxgen"
)

// Versions are the ONNX Runtime versions the project supports and tests against; make
// prepare (scripts/fetch-runtime.sh .deps) fetches each into .deps/ort-VERSION/lib.
var Versions = []string{"1.30.0", "1.24.3"}

// ChildEnv is the environment variable that names the test a child process runs.
const ChildEnv = "ORTBUS_CHILD"

// ModelsEnv is the environment variable through which a parent hands its generated model
// directory to its children (and through which a caller may point tests at a directory
// of its own; Models regenerates into it, which leaves correct files untouched).
const ModelsEnv = "ORTBUS_TEST_MODELS"

// TaggerComputeLayers is the heavy tagger's layer count in the Models directory: one
// layer, enough to exercise the heavy graph while staying cheap.
const TaggerComputeLayers = 1

// RepoRoot returns the repository root: the nearest directory at or above the working
// directory that holds go.mod.
func RepoRoot(t testing.TB) string {
	t.Helper()
	dir, err := os.Getwd()
	if err != nil {
		t.Fatalf("testenv: working directory: %v", err)
	}
	for d := dir; ; {
		if st, err := os.Stat(filepath.Join(d, "go.mod")); err == nil && st.Mode().IsRegular() {
			return d
		}
		parent := filepath.Dir(d)
		if parent == d {
			t.Fatalf("testenv: no go.mod at or above %s", dir)
		}
		d = parent
	}
}

// RuntimeLibPath returns where the library of version is fetched to under root, whether
// or not it is there.
func RuntimeLibPath(root, version string) string {
	return filepath.Join(root, ".deps", "ort-"+version, "lib", "libonnxruntime.so.1")
}

// RuntimeLib returns the path of the fetched ONNX Runtime library of version
// (<repo>/.deps/ort-VERSION/lib/libonnxruntime.so.1). A missing library fails the test
// with the command that fetches it: the tests never skip silently for lack of it.
func RuntimeLib(t testing.TB, version string) string {
	t.Helper()
	p := RuntimeLibPath(RepoRoot(t), version)
	st, err := os.Stat(p)
	if err != nil || !st.Mode().IsRegular() {
		t.Fatalf("testenv: ONNX Runtime %s is not at %s: run `make prepare` (scripts/fetch-runtime.sh .deps)", version, p)
	}
	return p
}

var models struct {
	once    sync.Once
	mu      sync.Mutex // guards dir and created once set, for Child and CleanupModels
	dir     string
	created bool // made by this process, so CleanupModels may remove it
	err     error
}

// modelsDir returns the Models directory when this process has generated it, else "".
func modelsDir() (dir string, created bool) {
	models.mu.Lock()
	defer models.mu.Unlock()
	return models.dir, models.created
}

// Models returns a directory holding every onnxgen model (tagger/, tagger-heavy/ with
// TaggerComputeLayers layers, ccip/, detector/, isnetis/, tiny/). It is generated once per
// test process and shared by all its tests, which must treat it as read-only. A child
// started by Child or RunChild reuses its parent's directory. The directory is under
// os.TempDir; call CleanupModels from TestMain to remove it at exit.
func Models(t testing.TB) string {
	t.Helper()
	models.once.Do(func() {
		dir, created := os.Getenv(ModelsEnv), false
		if dir == "" {
			d, err := os.MkdirTemp("", "ortbus-testmodels-")
			if err != nil {
				models.err = err
				return
			}
			dir, created = d, true
		}
		err := onnxgen.Generate(dir, onnxgen.Options{TaggerComputeLayers: TaggerComputeLayers})
		models.mu.Lock()
		models.dir, models.created = dir, created
		models.mu.Unlock()
		if err != nil {
			models.err = fmt.Errorf("%s: %w", dir, err)
		}
	})
	if models.err != nil {
		t.Fatalf("testenv: generating models: %v", models.err)
	}
	dir, _ := modelsDir()
	return dir
}

// CleanupModels removes the Models directory if this process created it. It is meant for
// TestMain, after m.Run (RunMain does both).
func CleanupModels() {
	if dir, created := modelsDir(); created && dir != "" {
		os.RemoveAll(dir)
	}
}

// RunMain runs m's tests, then CleanupModels, and returns m.Run's exit code: the whole
// TestMain of a package whose tests use Models is
//
//	func TestMain(m *testing.M) { os.Exit(testenv.RunMain(m)) }
func RunMain(m *testing.M) int {
	defer CleanupModels()
	return m.Run()
}

// InChild reports whether this process is a child started by Child to run the test name.
func InChild(name string) bool {
	return os.Getenv(ChildEnv) == name
}

// ChildResult is what a child process did.
type ChildResult struct {
	Output   string        // stdout and stderr, interleaved
	ExitCode int           // -1 when it did not exit normally (killed, not started)
	Err      error         // nil when it exited 0 and ran the test
	Duration time.Duration // wall time
}

// childGrace is how long before the parent's own deadline a child is stopped, so the
// parent can still report it.
const childGrace = 5 * time.Second

// Child re-runs the test binary (os.Args[0]) for the top-level test name only
// (-test.run=^name$, verbose), with the environment of this process plus ChildEnv=name,
// ModelsEnv (when this process has generated Models) and env ("KEY=value" entries, which
// win over inherited ones). It returns the child's combined output and exit status; Err
// is set when the child failed, was killed, or ran no test (a misspelt name). The child
// gets the parent's remaining deadline less a few seconds, and is killed when the test's
// context ends.
func Child(t testing.TB, name string, env ...string) ChildResult {
	t.Helper()
	if InChild(name) {
		t.Fatalf("testenv: %s is already the child; a child must not start itself", name)
	}
	ctx := t.Context()
	args := []string{"-test.run=^" + name + "$", "-test.v=true", "-test.count=1"}
	if dl, ok := deadline(t); ok {
		left := time.Until(dl) - childGrace
		if left < time.Second {
			left = time.Second
		}
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, left+childGrace/2)
		defer cancel()
		args = append(args, "-test.timeout="+left.String())
	}
	cmd := exec.CommandContext(ctx, os.Args[0], args...)
	cmd.Env = childEnv(name, env)
	cmd.WaitDelay = time.Second
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	start := time.Now()
	err := cmd.Run()
	res := ChildResult{Output: out.String(), ExitCode: -1, Duration: time.Since(start)}
	if cmd.ProcessState != nil {
		res.ExitCode = cmd.ProcessState.ExitCode()
	}
	switch {
	case err != nil:
		res.Err = fmt.Errorf("child %s: %w", name, err)
	case strings.Contains(res.Output, "no tests to run"):
		res.Err = fmt.Errorf("child %s: no test matched -test.run=^%s$", name, name)
	case strings.Contains(res.Output, "--- SKIP: "+name+" "):
		res.Err = fmt.Errorf("child %s: skipped", name)
	}
	if ctxErr := ctx.Err(); ctxErr != nil && res.Err != nil {
		res.Err = errors.Join(res.Err, fmt.Errorf("stopped: %w", ctxErr))
	}
	return res
}

// RunChild runs Child and fails t (with the child's output) when the child failed; on
// success the output is logged (seen with -v). It returns the result.
func RunChild(t testing.TB, name string, env ...string) ChildResult {
	t.Helper()
	res := Child(t, name, env...)
	if res.Err != nil {
		t.Errorf("%v (exit %d, %v)\n--- child output ---\n%s--- end of child output ---", res.Err, res.ExitCode, res.Duration.Round(time.Millisecond), res.Output)
	} else {
		t.Logf("child %s passed in %v\n%s", name, res.Duration.Round(time.Millisecond), res.Output)
	}
	return res
}

func deadline(t testing.TB) (time.Time, bool) {
	if d, ok := t.(interface{ Deadline() (time.Time, bool) }); ok {
		return d.Deadline()
	}
	return time.Time{}, false
}

// childEnv is os.Environ with ChildEnv, ModelsEnv and extra set, later entries winning.
func childEnv(name string, extra []string) []string {
	set := map[string]string{ChildEnv: name}
	order := []string{ChildEnv}
	if dir, _ := modelsDir(); dir != "" {
		set[ModelsEnv] = dir
		order = append(order, ModelsEnv)
	}
	for _, kv := range extra {
		k, v, _ := strings.Cut(kv, "=")
		if _, ok := set[k]; !ok {
			order = append(order, k)
		}
		set[k] = v
	}
	var out []string
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		if _, ok := set[k]; !ok {
			out = append(out, kv)
		}
	}
	for _, k := range order {
		out = append(out, k+"="+set[k])
	}
	return out
}

// CheckFor is the one polling wait of the repository's tests (nats-server's checkFor): it
// calls f until f returns nil, at most one try every `every` (a try that took longer is
// followed by the next at once), and fails t with what and f's last error once total has
// passed since the first try. f runs on the caller's goroutine, so it may call t.Fatal
// itself.
//
// Waits for an event (a reply, a claim, a process exit) do not poll: they read channels
// with a deadline. CheckFor is for state that has no push event (status, /metrics, a
// stream's state).
func CheckFor(t testing.TB, what string, total, every time.Duration, f func() error) {
	t.Helper()
	deadline := time.Now().Add(total)
	for {
		try := time.Now()
		err := f()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v: %v", what, total, err)
		}
		if d := every - time.Since(try); d > 0 {
			time.Sleep(d)
		}
	}
}
