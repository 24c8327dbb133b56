// Package llmtenant runs the LLM tenant (tenants/llm/tenant.mjs: llama.cpp through
// node-llama-cpp, serving a GGUF model) as a child process for the tests and the benches:
// it starts it, sends it generation requests, frees and reloads its model, reads its
// events, and stops it.
//
// The tenant speaks JSON lines: operations on its stdin, events on its stdout (Event;
// the script's header documents both). Its operations run one at a time in its own
// order, so the events of one kind come in the order of their causes: a generation's
// event is matched to it by id, a freed or resumed event to the oldest waiting Free or
// Resume. Every event also goes to Options.OnEvent, which sees those that nobody here
// caused (a free that `ortbus lease --on-pressure` asked for with SIGUSR1).
//
// The process runs in a process group of its own and gets SIGKILL if this process dies;
// Close kills the group (node-llama-cpp forks a short-lived binary test at load).
package llmtenant

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"syscall"

	"github.com/prometheus/procfs"
)

// Paths of the tenant under a repository: the script, and the node_modules that
// scripts/fetch-llm-tenant.sh (`make llm-tenant`) installs node-llama-cpp into.
func Script(repo string) string  { return filepath.Join(repo, "tenants", "llm", "tenant.mjs") }
func Modules(repo string) string { return filepath.Join(repo, ".deps", "llm-tenant", "node_modules") }

// InstalledFile is written last by the install: its presence means the install finished.
func InstalledFile(repo string) string {
	return filepath.Join(repo, ".deps", "llm-tenant", "INSTALLED")
}

// Missing is what the tenant lacks under repo to run ("" when nothing): node, the script,
// the install.
func Missing(repo string) string {
	if _, err := exec.LookPath("node"); err != nil {
		return "node is not on PATH (Node.js 20 or newer runs the LLM tenant)"
	}
	for _, p := range []string{Script(repo), filepath.Join(Modules(repo), "node-llama-cpp", "package.json"), InstalledFile(repo)} {
		if st, err := os.Stat(p); err != nil || !st.Mode().IsRegular() {
			return p + " is missing: run `make llm-tenant` (scripts/fetch-llm-tenant.sh .deps)"
		}
	}
	return ""
}

// Options of Start.
type Options struct {
	Node    string // the node executable; "" is node on PATH
	Script  string // tenant.mjs (Script(repo))
	Modules string // node_modules holding node-llama-cpp (Modules(repo))
	Model   string // the GGUF file (`ortbus models gen-llm`, gguf.GenerateLlama)
	GPU     string // cpu ("" too), vulkan or cuda: the tenant's -gpu
	Threads int    // CPU threads; 0 is 1
	Context int    // context tokens; 0 is the tenant's default (512)
	Mmap    bool   // map the weights from the file instead of reading them in
	// Env are more variables (KEY=value) after this process's environment, e.g.
	// GGML_VK_VISIBLE_DEVICES=0 for the Vulkan backend on lavapipe.
	Env []string
	// Stderr also receives the tenant's stderr (llama.cpp's messages); nil: only the
	// last StderrTail bytes are kept, for errors.
	Stderr io.Writer
	// OnEvent, when set, is called with every event, in order, from the goroutine that
	// reads them: it must return quickly.
	OnEvent func(Event)
	// Wrap, when set, is a command that runs the tenant: the tenant's command line
	// (node, its arguments) is appended to it, e.g. {"bin/ortbus", "lease", "--device",
	// "cpu", "--bytes", "160MiB", "--on-pressure", "kill -USR1 $ORTBUS_LEASE_PID", "--"}.
	// The wrapper must pass stdin and stdout through (ortbus lease does). Signals (Free,
	// Resume BySignal) and RSS go to the tenant's own process (the pid of its ready
	// event), not to the wrapper.
	Wrap []string
}

// baseEnv is the tenant's environment beside this process's (Options.Env wins):
//   - no download of llama.cpp, ever (the install turned scripts off; this is for any
//     code path of node-llama-cpp's that would look);
//   - a fixed glibc mmap threshold. glibc raises its threshold to the size of each
//     mmapped block it frees (up to 32 MiB), so after the first unload the weights and
//     the KV cache of a model reloaded come from its heap, and a second unload gives
//     nothing back to the system (measured: the tiny model's second free left the
//     resident set as it was). A fixed threshold keeps every large block mmapped, so
//     every free really frees.
var baseEnv = []string{"NODE_LLAMA_CPP_SKIP_DOWNLOAD=true", "MALLOC_MMAP_THRESHOLD_=131072"}

// StderrTail is how much of the tenant's stderr is kept for error messages.
const StderrTail = 8 << 10

func (o *Options) args() []string {
	a := []string{o.Script, "-modules", o.Modules, "-model", o.Model}
	if o.GPU != "" {
		a = append(a, "-gpu", o.GPU)
	}
	threads := max(o.Threads, 1)
	a = append(a, "-threads", strconv.Itoa(threads))
	if o.Context > 0 {
		a = append(a, "-ctx", strconv.Itoa(o.Context))
	}
	if o.Mmap {
		a = append(a, "-mmap")
	}
	return a
}

// Tenant is a started tenant.
type Tenant struct {
	cmd     *exec.Cmd
	stdin   io.WriteCloser
	wmu     sync.Mutex // one line written at a time
	stderr  *tail
	onEvent func(Event)
	ready   Event

	mu       sync.Mutex
	pending  map[string]chan Event // generations by id
	freed    []chan Event          // Free calls waiting, oldest first
	resumed  []chan Event
	exit     *Event   // the exit event, once read
	protoErr []string // lines that were no event (the first few)
	nextID   uint64

	// own is a pidfd of the tenant's own process when a wrapper started it (its pid is
	// not the started one): Close kills and waits for that very process, never a later
	// one with the same pid, even after the wrapper is gone. -1 when none.
	own int

	first chan Event    // the first event (ready, or the load's error)
	done  chan struct{} // closed once stdout is read to its end and the process reaped
	state *os.ProcessState
}

// Start starts the tenant and waits for its ready event (the model loaded), as long as
// ctx allows: a Vulkan backend's first start compiles its shaders for minutes on lavapipe.
// A tenant that fails to load is stopped, and its error says why (its error event, or its
// stderr's end).
func Start(ctx context.Context, o Options) (*Tenant, error) {
	node := o.Node
	if node == "" {
		node = "node"
	}
	argv := append(append(slices.Clone(o.Wrap), node), o.args()...)
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env = append(append(os.Environ(), baseEnv...), o.Env...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	t := &Tenant{cmd: cmd, stderr: &tail{max: StderrTail, tee: o.Stderr}, onEvent: o.OnEvent,
		pending: map[string]chan Event{}, first: make(chan Event, 1), done: make(chan struct{}), own: -1}
	cmd.Stderr = t.stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	t.stdin = stdin
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("llmtenant: start %s: %w", argv[0], err)
	}
	go t.read(stdout)
	select {
	case ev := <-t.first:
		if ev.Event == EventReady && ev.PID > 0 {
			t.ready = ev
			t.own = openOwn(ev.PID, cmd.Process.Pid)
			return t, nil
		}
		if ev.Event == EventReady { // no pid to signal: kill(0) would reach this process's group
			t.Close()
			return nil, fmt.Errorf("llmtenant: the tenant's ready event has no pid: %+v", ev)
		}
		t.Close()
		return nil, fmt.Errorf("llmtenant: the tenant did not load: %s: %s", ev.Code, ev.Message)
	case <-t.done:
		return nil, fmt.Errorf("llmtenant: the tenant exited (%v) before it was ready: %s", t.exitState(), t.stderr.String())
	case <-ctx.Done():
		t.Close()
		return nil, fmt.Errorf("llmtenant: waiting for the tenant to load: %w (stderr: %s)", ctx.Err(), t.stderr.String())
	}
}

// read reads the events until stdout ends, then reaps the process and wakes every waiter.
func (t *Tenant) read(stdout io.Reader) {
	r := bufio.NewReaderSize(stdout, 64<<10)
	firstSent := false
	for {
		line, err := readLine(r, MaxLine)
		if errors.Is(err, errLineTooLong) {
			t.protocolError(fmt.Sprintf("a line over %d bytes", MaxLine))
			continue
		}
		if err != nil {
			break
		}
		ev, err := decodeEvent(line)
		if err != nil {
			t.protocolError(err.Error())
			continue
		}
		if !firstSent {
			firstSent = true
			t.first <- ev
		}
		t.dispatch(ev)
	}
	io.Copy(io.Discard, stdout)
	t.cmd.Wait()
	t.mu.Lock()
	t.state = t.cmd.ProcessState
	t.mu.Unlock()
	close(t.done)
}

func (t *Tenant) protocolError(what string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if len(t.protoErr) < 16 {
		t.protoErr = append(t.protoErr, what)
	}
}

// dispatch hands ev to its waiter, if any, and to OnEvent.
func (t *Tenant) dispatch(ev Event) {
	t.mu.Lock()
	var to chan Event
	switch ev.Event {
	case EventRequest, EventError:
		if ch, ok := t.pending[ev.ID]; ok && ev.ID != "" {
			to = ch
			delete(t.pending, ev.ID)
		}
	case EventFreed:
		if len(t.freed) > 0 {
			to, t.freed = t.freed[0], t.freed[1:]
		}
	case EventResumed:
		if len(t.resumed) > 0 {
			to, t.resumed = t.resumed[0], t.resumed[1:]
		}
	case EventExit:
		t.exit = &ev
	}
	t.mu.Unlock()
	if to != nil {
		to <- ev // buffered: never blocks
	}
	if t.onEvent != nil {
		t.onEvent(ev)
	}
}

// Ready is the tenant's ready event.
func (t *Tenant) Ready() Event { return t.ready }

// PID is the tenant's process id, from its ready event: the process that signals and RSS
// reach (the started process's child when Options.Wrap is set).
func (t *Tenant) PID() int { return t.ready.PID }

// Done is closed once the tenant has exited and its output is read.
func (t *Tenant) Done() <-chan struct{} { return t.done }

// ProtocolErrors are the first lines of the tenant's stdout that were no event.
func (t *Tenant) ProtocolErrors() []string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return append([]string(nil), t.protoErr...)
}

// Stderr is the end of the tenant's stderr.
func (t *Tenant) Stderr() string { return t.stderr.String() }

// RSS is the tenant's resident set now (/proc/PID/stat), measured here, not reported.
func (t *Tenant) RSS() (int64, error) {
	p, err := procfs.NewProc(t.PID())
	if err != nil {
		return 0, err
	}
	st, err := p.Stat()
	if err != nil {
		return 0, err
	}
	return int64(st.ResidentMemory()), nil
}

// ErrExited is returned by a call whose answer can no longer come: the tenant exited.
var ErrExited = errors.New("llmtenant: the tenant exited")

// Error is a tenant's error event, as an error.
type Error struct {
	Code    string
	Message string
}

func (e *Error) Error() string { return "llmtenant: " + e.Code + ": " + e.Message }

// WriteLine writes one line (a newline is added) to the tenant's stdin as it is: for
// tests of the tenant's own input handling. Generate, Free and Resume write theirs.
func (t *Tenant) WriteLine(line []byte) error {
	t.wmu.Lock()
	defer t.wmu.Unlock()
	_, err := t.stdin.Write(append(bytes.Clone(line), '\n'))
	return err
}

func (t *Tenant) send(v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	return t.WriteLine(b)
}

// wait waits for ch's event, the tenant's exit, or ctx's end; unwait (under t.mu)
// withdraws ch when the event will not be waited for.
func (t *Tenant) wait(ctx context.Context, ch chan Event, what string, unwait func()) (Event, error) {
	result := func(ev Event) (Event, error) {
		if ev.Event == EventError {
			return ev, &Error{Code: ev.Code, Message: ev.Message}
		}
		return ev, nil
	}
	select {
	case ev := <-ch:
		return result(ev)
	case <-t.done:
		select { // the event came before the end
		case ev := <-ch:
			return result(ev)
		default:
		}
		return Event{}, fmt.Errorf("%w (%v) before %s: %s", ErrExited, t.exitState(), what, t.stderr.String())
	case <-ctx.Done():
		t.mu.Lock()
		unwait()
		t.mu.Unlock()
		return Event{}, fmt.Errorf("llmtenant: waiting for %s: %w", what, ctx.Err())
	}
}

func (t *Tenant) exitState() *os.ProcessState {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.state
}

// tail keeps the last max bytes written to it, and copies them to tee.
type tail struct {
	mu  sync.Mutex
	max int
	buf []byte
	tee io.Writer
}

func (w *tail) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.tee != nil {
		w.tee.Write(p)
	}
	w.buf = append(w.buf, p...)
	if len(w.buf) > w.max {
		w.buf = append(w.buf[:0], w.buf[len(w.buf)-w.max:]...)
	}
	return len(p), nil
}

func (w *tail) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return string(bytes.TrimSpace(w.buf))
}
