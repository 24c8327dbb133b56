// Package launch starts the ortbus binaries (gateway, ortworker, natsembed) as child
// processes for the tests, the bench and the demo: it reads the ready or failed event line
// a binary prints on its stdout (codec.ReadEvent), keeps its log (stderr), and stops it.
//
// A process runs in a process group of its own and dies with its parent (a parent-death
// SIGKILL), so that nothing it started outlives the caller. Stop sends SIGTERM to the
// process alone: a gateway stops its own workers (draining them), and signalling them too
// would take that part of its shutdown from it. Past the grace period, and in Kill, the
// whole group gets SIGKILL.
package launch

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/ortbus/ortbus/codec"
)

// pipeWait bounds how long, once the process has exited, its output pipes may stay open
// (held by something it started) before they are closed.
const pipeWait = 5 * time.Second

// Options of Start.
type Options struct {
	// Name names the process in errors (default: the binary's file name).
	Name string
	// Environ is the process's environment; nil: this process's.
	Environ []string
	// Env are more variables (KEY=value), after Environ.
	Env []string
	// LogFile, when set, is the file (created) that keeps the process's log; otherwise it
	// is kept in memory.
	LogFile string
	// Tee also receives the log as it comes (os.Stderr, a test's log); nil: nothing.
	Tee io.Writer
	// Stdin is the process's standard input; nil: none (the null device).
	Stdin io.Reader
}

// Proc is a started process.
type Proc struct {
	name    string
	cmd     *exec.Cmd
	started time.Time
	log     *logSink

	event    codec.Event   // its first event line
	gotEvent chan struct{} // closed once event is set
	exited   chan struct{} // closed once it exited and its output was read
	state    *os.ProcessState
}

// Start starts bin with args. The process's stdout is read for its first event line (and
// its lines kept in the log, with its stderr).
func Start(bin string, args []string, o Options) (*Proc, error) {
	p := &Proc{name: o.Name, log: &logSink{tee: o.Tee}, gotEvent: make(chan struct{}), exited: make(chan struct{})}
	if p.name == "" {
		p.name = filepath.Base(bin)
	}
	if o.LogFile != "" {
		f, err := os.Create(o.LogFile)
		if err != nil {
			return nil, err
		}
		p.log.file, p.log.path = f, o.LogFile
	}
	p.cmd = exec.Command(bin, args...)
	p.cmd.Env = append(o.Environ, o.Env...)
	if o.Environ == nil {
		p.cmd.Env = append(os.Environ(), o.Env...)
	}
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	out := &lineWriter{line: p.stdoutLine}
	p.cmd.Stdin, p.cmd.Stdout, p.cmd.Stderr = o.Stdin, out, p.log
	p.cmd.WaitDelay = pipeWait
	p.started = time.Now()
	if err := p.cmd.Start(); err != nil {
		p.log.close()
		return nil, fmt.Errorf("start %s: %w", p.name, err)
	}
	go func() {
		p.cmd.Wait()
		out.flush()
		p.state = p.cmd.ProcessState
		p.log.close()
		close(p.exited)
	}()
	return p, nil
}

// stdoutLine keeps the first event line that settles the start (ready or failed; an
// ortworker's "loading" lines come before it), and every line in the log.
func (p *Proc) stdoutLine(line []byte) {
	p.log.Write(append(line, '\n'))
	select {
	case <-p.gotEvent:
		return
	default:
	}
	if ev, ok := codec.ReadEvent(line); ok && ev.Settles() {
		p.event = ev
		close(p.gotEvent)
	}
}

// PID is the process id (and its process group's).
func (p *Proc) PID() int { return p.cmd.Process.Pid }

// Started is when the process was started.
func (p *Proc) Started() time.Time { return p.started }

// Exited is closed once the process has exited (and its output is read).
func (p *Proc) Exited() <-chan struct{} { return p.exited }

// State is the process's exit state; nil while it runs.
func (p *Proc) State() *os.ProcessState {
	select {
	case <-p.exited:
		return p.state
	default:
		return nil
	}
}

// Alive reports whether the process still runs.
func (p *Proc) Alive() bool { return p.State() == nil }

// Event waits for the process's first event line (ready or failed). It fails when the
// process exits without one, when bound passes, or when ctx is done.
func (p *Proc) Event(ctx context.Context, bound time.Duration) (codec.Event, error) {
	timer := time.NewTimer(bound)
	defer timer.Stop()
	select {
	case <-p.gotEvent:
		return p.event, nil
	case <-p.exited:
		select { // the line came before the exit
		case <-p.gotEvent:
			return p.event, nil
		default:
		}
		return codec.Event{}, fmt.Errorf("%s exited (%v) without a ready or failed line", p.name, p.state)
	case <-timer.C:
		return codec.Event{}, fmt.Errorf("%s printed no ready or failed line within %v", p.name, bound)
	case <-ctx.Done():
		return codec.Event{}, fmt.Errorf("%s: waiting for its ready line: %w", p.name, ctx.Err())
	}
}

// Ready is Event that fails unless the line is a ready line.
func (p *Proc) Ready(ctx context.Context, bound time.Duration) (codec.Event, error) {
	ev, err := p.Event(ctx, bound)
	if err == nil && ev.Event != codec.EventReady {
		err = fmt.Errorf("%s failed to start: %v", p.name, ev.Error)
		if ev.Error == nil {
			err = fmt.Errorf("%s: want a ready line, got %+v", p.name, ev)
		}
	}
	return ev, err
}

// Wait waits for the process to exit, at most bound, and returns its exit state.
func (p *Proc) Wait(bound time.Duration) (*os.ProcessState, error) {
	select {
	case <-p.exited:
		return p.state, nil
	case <-time.After(bound):
		return nil, fmt.Errorf("%s did not exit within %v", p.name, bound)
	}
}

// Signal sends sig to the process (not its group).
func (p *Proc) Signal(sig os.Signal) error { return p.cmd.Process.Signal(sig) }

// Stop stops the process: SIGTERM, then, if it has not exited within grace, SIGKILL to its
// process group. It returns nil if the process exited with status 0 after SIGTERM, or had
// exited before; an error says what went wrong otherwise.
func (p *Proc) Stop(grace time.Duration) error {
	if !p.Alive() {
		return nil
	}
	p.Signal(syscall.SIGTERM)
	if _, err := p.Wait(grace); err != nil {
		p.Kill()
		return fmt.Errorf("%s did not exit within %v of SIGTERM; killed it", p.name, grace)
	}
	if !p.state.Success() {
		return fmt.Errorf("%s exited with %v after SIGTERM, want status 0", p.name, p.state)
	}
	return nil
}

// Kill sends SIGKILL to the process's group, if the process still runs, and waits for its
// exit.
func (p *Proc) Kill() {
	if !p.Alive() {
		return
	}
	// Not once it is reaped: its pid, and so its group id, may then be another's.
	syscall.Kill(-p.PID(), syscall.SIGKILL)
	<-p.exited
}

// WaitLog waits for the process to log text (logged already, or later): an event the
// process itself announces, such as the gateway's "job store open". It fails if the
// process exits first, or when ctx ends.
func (p *Proc) WaitLog(ctx context.Context, text string) error {
	seen := p.log.watch(text)
	if seen == nil {
		return nil
	}
	select {
	case <-seen:
	case <-ctx.Done():
		return fmt.Errorf("%s has not logged %q: %w", p.name, text, ctx.Err())
	}
	if !strings.Contains(p.log.String(), text) {
		return fmt.Errorf("%s exited (%v) before it logged %q", p.name, p.State(), text)
	}
	return nil
}

// Log is the process's log so far (its stderr and stdout lines); with Options.LogFile,
// what that file holds.
func (p *Proc) Log() string { return p.log.String() }

// LogTail is the last n lines of Log.
func (p *Proc) LogTail(n int) string {
	lines := strings.Split(strings.TrimRight(p.Log(), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// logSink keeps a process's log in memory or in a file, and copies it to tee.
type logSink struct {
	mu     sync.Mutex
	buf    bytes.Buffer
	file   *os.File
	path   string
	tee    io.Writer
	closed bool
	// watches wait for a text in a write to come (WaitLog); each is closed and dropped
	// once a write holds its text, or at close.
	watches []logWatch
}

type logWatch struct {
	text string
	seen chan struct{}
}

func (l *logSink) Write(b []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return 0, errors.New("log closed")
	}
	l.watches = slices.DeleteFunc(l.watches, func(w logWatch) bool {
		if bytes.Contains(b, []byte(w.text)) {
			close(w.seen)
			return true
		}
		return false
	})
	if l.tee != nil {
		l.tee.Write(b)
	}
	if l.file != nil {
		return l.file.Write(b)
	}
	return l.buf.Write(b)
}

func (l *logSink) close() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.closed = true
	if l.file != nil {
		l.file.Close()
	}
	for _, w := range l.watches {
		close(w.seen)
	}
	l.watches = nil
}

// watch returns a channel closed once a write (one log record: the binaries write each
// with one call) holds text, or the log is closed; nil if the log already holds it.
func (l *logSink) watch(text string) <-chan struct{} {
	l.mu.Lock()
	defer l.mu.Unlock()
	have := l.buf.String()
	if l.path != "" {
		b, _ := os.ReadFile(l.path)
		have = string(b)
	}
	if strings.Contains(have, text) {
		return nil
	}
	w := logWatch{text: text, seen: make(chan struct{})}
	if l.closed {
		close(w.seen)
	} else {
		l.watches = append(l.watches, w)
	}
	return w.seen
}

func (l *logSink) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.path != "" {
		b, _ := os.ReadFile(l.path)
		return string(b)
	}
	return l.buf.String()
}

// lineWriter calls line for every line written to it (without its newline).
type lineWriter struct {
	mu   sync.Mutex
	part []byte
	line func([]byte)
}

func (w *lineWriter) Write(b []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.part = append(w.part, b...)
	for {
		i := bytes.IndexByte(w.part, '\n')
		if i < 0 {
			break
		}
		w.line(w.part[:i:i])
		w.part = w.part[i+1:]
	}
	return len(b), nil
}

// flush passes on a last line without a newline.
func (w *lineWriter) flush() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.part) > 0 {
		w.line(w.part)
		w.part = nil
	}
}
