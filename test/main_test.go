// Package test holds the integration tests of ortbus: they build the real binaries, start
// real processes on a real NATS server, load real ONNX Runtime libraries and the models
// that onnxgen generates, and judge the system only by what crosses the bus and by how the
// processes exit.
//
// A wait for something that must happen is on an event (a reply, a heartbeat, a claim, a
// process exit) with a generous deadline that only bounds a failure, or polls state that
// has no push event (status, /metrics) every pollEvery through checkFor (wait_test.go).
// Fixed sleeps remain only in hostile_test.go, as the grace it gives something that must
// not happen (a second reply, a crash) or a log to catch up.
//
// What is expensive to start and only receives requests is shared by the tests, started
// on first use and stopped after the last test: the workers of sharedWorkers
// (shared_test.go) and the gateway of sharedGateway (gateway_shared_test.go, through
// atExit).
package test

import (
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/ortbus/ortbus/internal/testkit/testenv"
	"github.com/ortbus/ortbus/natsd"
)

// pkgEnv is what TestMain prepares once for the whole package.
var pkgEnv struct {
	tmp     string // the package's temporary directory (symlinks resolved)
	bin     string // the ortworker binary
	natsURL string // the package's NATS server
}

func TestMain(m *testing.M) {
	os.Exit(runMain(m))
}

func runMain(m *testing.M) int {
	tmp, err := os.MkdirTemp("", "ortbus-test-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "test: temp dir:", err)
		return 1
	}
	defer os.RemoveAll(tmp)
	if pkgEnv.tmp, err = filepath.EvalSymlinks(tmp); err != nil {
		fmt.Fprintln(os.Stderr, "test: temp dir:", err)
		return 1
	}
	defer testenv.CleanupModels()
	// Everything the tests and the processes they start write to the temporary directory
	// (Chromium's profiles, segment masks of a stack without a spool, the runtime's
	// placement traces of a worker killed mid-load) goes under the package's own, removed
	// at the end: a run leaves nothing in /tmp, whatever a process did not clean up.
	ownTmp := filepath.Join(pkgEnv.tmp, "tmp")
	if err := os.Mkdir(ownTmp, 0o700); err != nil {
		fmt.Fprintln(os.Stderr, "test: temp dir:", err)
		return 1
	}
	os.Setenv("TMPDIR", ownTmp)

	// The binary under test, built once (without -race: only the test process needs it).
	if pkgEnv.bin, err = buildBinary("ortworker"); err != nil {
		fmt.Fprintln(os.Stderr, "test:", err)
		return 1
	}

	opts, err := natsd.ParseArgs([]string{"-p", "-1"})
	if err != nil {
		fmt.Fprintln(os.Stderr, "test: NATS options:", err)
		return 1
	}
	srv, err := natsd.Start(opts)
	if err != nil {
		fmt.Fprintln(os.Stderr, "test: NATS server:", err)
		return 1
	}
	defer srv.Shutdown()
	pkgEnv.natsURL = srv.ClientURL()

	code := m.Run()
	if !runExitHooks(code != 0) && code == 0 {
		code = 1
	}
	stopShared(code != 0)
	return code
}

// exitHooks are what atExit registered.
var exitHooks struct {
	mu sync.Mutex
	fs []func(failed bool) error
}

// atExit registers f to run after every test of the package (TestMain), the last
// registered first; failed says whether the run failed. An error from f is printed and
// fails the run: a shared fixture's teardown is part of what the tests check.
func atExit(f func(failed bool) error) {
	exitHooks.mu.Lock()
	defer exitHooks.mu.Unlock()
	exitHooks.fs = append(exitHooks.fs, f)
}

// runExitHooks runs the hooks of atExit and reports whether they all succeeded.
func runExitHooks(failed bool) bool {
	exitHooks.mu.Lock()
	fs := exitHooks.fs
	exitHooks.fs = nil
	exitHooks.mu.Unlock()
	ok := true
	for i := len(fs) - 1; i >= 0; i-- {
		if err := fs[i](failed); err != nil {
			fmt.Fprintln(os.Stderr, "test: after the tests:", err)
			ok = false
		}
	}
	return ok
}
