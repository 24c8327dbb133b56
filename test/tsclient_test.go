package test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/ortbus/ortbus/codec"
	"github.com/ortbus/ortbus/internal/testkit/testenv"
)

// tsSuiteBound bounds the whole Bun suite (it takes about a minute on two cores); past it
// the suite and every process it started are killed and the test fails.
const tsSuiteBound = 8 * time.Minute

// runTSClient runs the TypeScript client's Bun tests (clients/ts/test/*.test.ts) against
// real processes: the Bun harness starts gateways (with their workers on both fetched ONNX
// Runtime versions) and natsembed from binaries built here, and calls them through the
// client. Bun itself comes from npm (the `bun` package's platform binary, its postinstall
// run for that package only), installed into clients/ts/node_modules from the committed
// package-lock.json when missing. The client's types are checked with tsc first.
func runTSClient(t *testing.T) {
	if testing.Short() {
		t.Skip("the Bun suite starts real gateways for about a minute; skipped with -short")
	}
	repo := testenv.RepoRoot(t)
	dir := filepath.Join(repo, "clients", "ts")
	for _, v := range testenv.Versions {
		testenv.RuntimeLib(t, v) // fails with the command that fetches it
	}
	bun := tsInstall(t, dir)

	// The binaries the Bun harness runs, built from this tree (without -race: the suite
	// measures latencies), the package's own (testBinary puts them in one directory).
	var binDir string
	for _, name := range []string{"gateway", "ortworker", "natsembed", "ortbus"} {
		binDir = filepath.Dir(testBinary(t, name))
	}

	if err := tsRun(t, dir, 2*time.Minute, nil, filepath.Join(dir, "node_modules", ".bin", "tsc"), "--noEmit", "-p", "."); err != nil {
		t.Fatal(err)
	}
	// The suite's temporary directories (configs, models, fixtures, gateway logs) live here:
	// removed with the test, their logs shown when the suite fails.
	tmp := t.TempDir()
	start := time.Now()
	err := tsRun(t, dir, tsSuiteBound, []string{"ORTBUS_REPO=" + repo, "ORTBUS_BIN_DIR=" + binDir, "ORTBUS_TS_TMP=" + tmp}, bun, "test", "--no-orphans")
	if err != nil {
		tsShowLogs(t, tmp)
		t.Fatal(err)
	}
	t.Logf("Bun suite passed in %v", time.Since(start).Round(time.Millisecond))
}

// TestTSClientErrorCodes checks that the TypeScript client knows every stable error code
// of the contract, in codec's order: a code it lacks would reach the app as internal.
func TestTSClientErrorCodes(t *testing.T) {
	src, err := os.ReadFile(filepath.Join(testenv.RepoRoot(t), "clients", "ts", "src", "errors.ts"))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?s)export const ORTBUS_ERROR_CODES = \[(.*?)\] as const;`).FindSubmatch(src)
	if m == nil {
		t.Fatal("clients/ts/src/errors.ts: no `export const ORTBUS_ERROR_CODES = [...] as const;`")
	}
	var ts []string
	for _, q := range regexp.MustCompile(`"([a-z_]+)"`).FindAllSubmatch(m[1], -1) {
		ts = append(ts, string(q[1]))
	}
	var want []string
	for _, c := range codec.Codes {
		want = append(want, string(c))
	}
	if !slices.Equal(ts, want) {
		t.Errorf("ORTBUS_ERROR_CODES of clients/ts/src/errors.ts:\n%v\nwant codec.Codes:\n%v", ts, want)
	}
}

// tsShowLogs logs the last lines of every log the suite's processes wrote under dir.
func tsShowLogs(t *testing.T, dir string) {
	t.Helper()
	filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(p, ".log") {
			return nil
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return nil
		}
		lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
		t.Logf("last lines of %s:\n%s", p, strings.Join(lines[max(0, len(lines)-80):], "\n"))
		return nil
	})
}

// tsInstall makes sure clients/ts/node_modules holds the dependencies and a Bun that runs,
// installing them with `npm ci` (scripts off, per clients/ts/.npmrc) and then running the
// bun package's own postinstall, which puts the platform binary in place. It returns the
// bun executable.
func tsInstall(t *testing.T, dir string) string {
	t.Helper()
	bun := filepath.Join(dir, "node_modules", "bun", "bin", "bun.exe")
	if tsBunRuns(bun) && tsExists(filepath.Join(dir, "node_modules", "@nats-io", "transport-node")) &&
		tsExists(filepath.Join(dir, "node_modules", "@msgpack", "msgpack")) && tsExists(filepath.Join(dir, "node_modules", ".bin", "tsc")) &&
		tsExists(filepath.Join(dir, "node_modules", "@opentelemetry", "api")) {
		return bun
	}
	if _, err := exec.LookPath("npm"); err != nil {
		t.Fatalf("npm is needed to install Bun and the client's dependencies (clients/ts): %v", err)
	}
	if err := tsRun(t, dir, 5*time.Minute, nil, "npm", "ci", "--no-audit", "--no-fund"); err != nil {
		t.Fatal(err)
	}
	if err := tsRun(t, filepath.Join(dir, "node_modules", "bun"), time.Minute, nil, "node", "install.js"); err != nil {
		t.Fatal(err)
	}
	if !tsBunRuns(bun) {
		t.Fatalf("%s does not run after npm ci and the bun package's postinstall", bun)
	}
	return bun
}

func tsExists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}

// tsBunRuns reports whether bun prints its version (the unpatched placeholder does not).
func tsBunRuns(bun string) bool {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, bun, "--version").Output()
	return err == nil && len(strings.TrimSpace(string(out))) > 0 && !strings.Contains(string(out), "postinstall")
}

// tsRun runs a command in dir with extra environment, streaming its output into the test
// log line by line; it returns an error if the command fails or outlives bound. The
// command runs in a process group of its own, which is killed when it ends (so nothing it
// started — a gateway, natsembed — outlives it), and it dies with the test process.
func tsRun(t *testing.T, dir string, bound time.Duration, env []string, name string, args ...string) error {
	t.Helper()
	what := name + " " + strings.Join(args, " ")
	cmd := exec.Command(name, args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), env...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	cmd.WaitDelay = 10 * time.Second // a descendant holding the output open cannot block Wait
	pr, pw := io.Pipe()
	cmd.Stdout, cmd.Stderr = pw, pw
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start %s: %w", what, err)
	}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		sc := bufio.NewScanner(pr)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			t.Log(sc.Text())
		}
		io.Copy(io.Discard, pr)
	}()
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	var err error
	timedOut := false
	select {
	case err = <-done:
	case <-time.After(bound):
		timedOut = true
		syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		err = <-done
	}
	// Whatever the command left running in its group (it should have stopped all).
	syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
	pw.Close()
	wg.Wait()
	switch {
	case timedOut:
		return fmt.Errorf("%s did not finish within %v; killed it and its process group", what, bound)
	case err != nil:
		return fmt.Errorf("%s failed: %w", what, err)
	}
	return nil
}
