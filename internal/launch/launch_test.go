package launch

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ortbus/ortbus/codec"
)

// sh starts a shell script as the process.
func sh(t *testing.T, script string, o Options) *Proc {
	t.Helper()
	p, err := Start("/bin/sh", []string{"-c", script}, o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Kill)
	return p
}

const ready = `echo '{"event":"ready","nats_url":"nats://x:1"}'`

// A ready line is read, the log keeps stderr and stdout, and SIGTERM stops the process
// with status 0.
func TestReadyAndStop(t *testing.T) {
	p := sh(t, `trap 'echo bye >&2; exit 0' TERM; echo "starting $X" >&2; `+ready+`; while :; do sleep 0.02; done`,
		Options{Name: "gw", Env: []string{"X=42"}})
	ev, err := p.Ready(context.Background(), 10*time.Second)
	if err != nil || ev.NATSURL != "nats://x:1" {
		t.Fatalf("ready %+v, %v", ev, err)
	}
	if !p.Alive() || p.PID() <= 0 {
		t.Fatalf("alive %v pid %d", p.Alive(), p.PID())
	}
	if err := p.Stop(10 * time.Second); err != nil {
		t.Fatal(err)
	}
	if p.Alive() || !p.State().Success() {
		t.Fatalf("state %v", p.State())
	}
	for _, want := range []string{"starting 42", `"event":"ready"`, "bye"} {
		if !strings.Contains(p.Log(), want) {
			t.Errorf("log %q has no %q", p.Log(), want)
		}
	}
	if err := p.Stop(time.Second); err != nil {
		t.Errorf("a second Stop: %v", err)
	}
}

// A failed line is the event; Ready fails with its error.
func TestFailed(t *testing.T) {
	e := codec.Errorf(codec.CodeRuntimeMissing, "no library")
	line := strings.TrimSpace(string(codec.Event{Event: codec.EventFailed, Error: e}.Line()))
	p := sh(t, `echo noise; echo '`+line+`'; exit 1`, Options{})
	ev, err := p.Event(context.Background(), 10*time.Second)
	if err != nil || ev.Event != codec.EventFailed || ev.Error == nil || ev.Error.Code != codec.CodeRuntimeMissing {
		t.Fatalf("event %+v, %v", ev, err)
	}
	if _, err := p.Ready(context.Background(), time.Second); err == nil || !strings.Contains(err.Error(), "no library") {
		t.Fatalf("Ready: %v", err)
	}
	st, err := p.Wait(10 * time.Second)
	if err != nil || st.ExitCode() != 1 {
		t.Fatalf("exit %v, %v", st, err)
	}
	if err := p.Stop(time.Second); err != nil {
		t.Errorf("Stop of an exited process: %v", err)
	}
}

// Without an event line: the exit, the bound or the context ends the wait.
func TestNoEvent(t *testing.T) {
	p := sh(t, `echo oops >&2; exit 3`, Options{Name: "w"})
	if _, err := p.Event(context.Background(), 10*time.Second); err == nil || !strings.Contains(err.Error(), "exit status 3") {
		t.Fatalf("exit before the line: %v", err)
	}
	if got := p.LogTail(1); got != "oops" {
		t.Errorf("log tail %q", got)
	}
	p = sh(t, `exec sleep 30`, Options{})
	if _, err := p.Event(context.Background(), 50*time.Millisecond); err == nil || !strings.Contains(err.Error(), "within 50ms") {
		t.Fatalf("bound: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := p.Event(ctx, time.Minute); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled: %v", err)
	}
	if _, err := p.Wait(50 * time.Millisecond); err == nil {
		t.Fatal("Wait returned while it runs")
	}
}

// A process that ignores SIGTERM is killed after the grace, with what it started (its
// process group).
func TestStopKillsGroup(t *testing.T) {
	p := sh(t, `trap '' TERM; sleep 30 & `+ready+`; wait`, Options{})
	if _, err := p.Ready(context.Background(), 10*time.Second); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	err := p.Stop(200 * time.Millisecond)
	if err == nil || !strings.Contains(err.Error(), "killed") {
		t.Fatalf("Stop: %v", err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("Stop took %v", d)
	}
	// Its members are gone once they are reaped (by init: their parent died with them).
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		err := syscall.Kill(-p.PID(), 0)
		if errors.Is(err, syscall.ESRCH) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the process group still has members: %v", err)
		}
	}
}

// With a log file, the log is the file's content; Tee gets it too.
func TestLogFile(t *testing.T) {
	dir := t.TempDir()
	tee, err := os.Create(filepath.Join(dir, "tee.log"))
	if err != nil {
		t.Fatal(err)
	}
	defer tee.Close()
	path := filepath.Join(dir, "p.log")
	p := sh(t, `echo one >&2; echo two >&2`, Options{LogFile: path, Tee: tee})
	if _, err := p.Wait(10 * time.Second); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(path)
	teed, _ := os.ReadFile(tee.Name())
	if err != nil || string(b) != "one\ntwo\n" || p.Log() != string(b) || string(teed) != string(b) {
		t.Fatalf("file %q (%v), Log %q, tee %q", b, err, p.Log(), teed)
	}
}

// WaitLog returns once the process logs the text (at once when it did already), not
// before, and fails when the process exits without logging it.
func TestWaitLog(t *testing.T) {
	for _, file := range []bool{false, true} {
		o := Options{}
		if file {
			o.LogFile = filepath.Join(t.TempDir(), "p.log")
		}
		r, w, err := os.Pipe()
		if err != nil {
			t.Fatal(err)
		}
		o.Stdin = r
		p := sh(t, `echo first >&2; read x; echo "job store open" >&2; read y`, o)
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := p.WaitLog(ctx, "first"); err != nil {
			t.Fatal(err)
		}
		over, stop := context.WithCancel(ctx)
		stop()
		if err := p.WaitLog(over, "job store open"); !errors.Is(err, context.Canceled) {
			t.Fatalf("file %v: WaitLog before the process logged the text: %v, want its context's end", file, err)
		}
		got := make(chan error, 1)
		go func() { got <- p.WaitLog(ctx, "job store open") }()
		w.Write([]byte("go\n"))
		if err := <-got; err != nil {
			t.Fatalf("file %v: %v", file, err)
		}
		w.Close()
		r.Close()
		if err := p.WaitLog(ctx, "never written"); err == nil || !strings.Contains(err.Error(), "exited") {
			t.Fatalf("file %v: WaitLog after the exit: %v, want exited", file, err)
		}
	}
}
