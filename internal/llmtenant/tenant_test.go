package llmtenant

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// fake starts testdata/fake-tenant.sh in mode under sh, in place of node and tenant.mjs.
func fake(t *testing.T, mode string, onEvent func(Event)) (*Tenant, error) {
	t.Helper()
	script, err := filepath.Abs("testdata/fake-tenant.sh")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	tn, err := Start(ctx, Options{Node: "sh", Script: script, Modules: "unused", Model: mode, OnEvent: onEvent})
	if tn != nil {
		t.Cleanup(tn.Close)
	}
	return tn, err
}

// TestStartFails: a tenant that exits before its ready event, or reports a failed load,
// is an error of Start saying why (its stderr, its error event).
func TestStartFails(t *testing.T) {
	if _, err := fake(t, "exit-early", nil); err == nil || !strings.Contains(err.Error(), "cannot find the binding") || !strings.Contains(err.Error(), "exit status 3") {
		t.Errorf("exit before ready: %v, want the exit status and the stderr", err)
	}
	if _, err := fake(t, "load-failed", nil); err == nil || !strings.Contains(err.Error(), "load_failed: NoBinaryFoundError") {
		t.Errorf("failed load: %v, want the error event", err)
	}
}

// TestEventsMatched: lines that are no events are set aside and the tenant goes on; a
// generation gets its own event (an error about another id goes to OnEvent only); a
// generation given up on is withdrawn; an error event is an *Error; Stop returns the
// exit event.
func TestEventsMatched(t *testing.T) {
	seen := make(chan Event, 64)
	tn, err := fake(t, "serve", func(ev Event) { seen <- ev })
	if err != nil {
		t.Fatal(err)
	}
	if got := tn.ProtocolErrors(); len(got) != 3 || !strings.Contains(got[0], "over") || !strings.Contains(got[2], "surprise") {
		t.Fatalf("protocol errors %q, want the long line, the garbage, the unknown event", got)
	}
	if tn.Ready().ModelBytes != 2 || tn.Ready().PID != tn.PID() {
		t.Fatalf("ready %+v, pid %d", tn.Ready(), tn.PID())
	}
	ctx := context.Background()
	ev, err := tn.Generate(ctx, Request{Prompt: "p"})
	if err != nil || ev.ID != "g1" || len(ev.Output) != 1 {
		t.Fatalf("Generate: %+v, %v", ev, err)
	}
	for _, want := range []string{EventReady, EventError, EventRequest} {
		if got := <-seen; got.Event != want || want == EventError && got.ID != "nobody" {
			t.Fatalf("OnEvent got %+v, want a %s event (the error about id nobody)", got, want)
		}
	}
	gone, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := tn.Generate(gone, Request{ID: "s", Prompt: "silent"}); !errors.Is(err, context.Canceled) {
		t.Fatalf("Generate with a cancelled context: %v", err)
	}
	tn.mu.Lock()
	left := len(tn.pending)
	tn.mu.Unlock()
	if left != 0 {
		t.Fatalf("%d generations still waiting after the cancelled one", left)
	}
	if ev, err := tn.Free(ctx, ByStdin); err != nil || ev.RSSBeforeBytes != 9 {
		t.Fatalf("Free: %+v, %v", ev, err)
	}
	if ev, err := tn.Resume(ctx, ByStdin); err != nil || ev.LoadMS != 3 {
		t.Fatalf("Resume: %+v, %v", ev, err)
	}
	var te *Error
	if _, err := tn.Generate(ctx, Request{Prompt: "refuse"}); !errors.As(err, &te) || te.Code != CodeUnloaded {
		t.Fatalf("a refused generation: %v, want an *Error with code %s", err, CodeUnloaded)
	}
	exit, err := tn.Stop(ctx)
	if err != nil || exit.Reason != "stop" {
		t.Fatalf("Stop: %+v, %v", exit, err)
	}
	tn.Close() // after the exit: nothing to do
	if _, err := tn.Free(ctx, BySignal); !errors.Is(err, ErrExited) {
		t.Fatalf("Free after the exit: %v, want ErrExited", err)
	}
}

// TestExitWhileWaiting: a generation waiting when the tenant dies gets ErrExited.
func TestExitWhileWaiting(t *testing.T) {
	tn, err := fake(t, "serve", nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tn.Generate(context.Background(), Request{Prompt: "die"}); !errors.Is(err, ErrExited) {
		t.Fatalf("Generate as the tenant exits: %v, want ErrExited", err)
	}
	if _, err := tn.Stop(context.Background()); err == nil {
		t.Fatal("Stop of a tenant that exited without an exit event: no error")
	}
}

func TestMissing(t *testing.T) {
	repo := t.TempDir()
	if why := Missing(repo); !strings.Contains(why, "make llm-tenant") {
		t.Fatalf("empty repo: %q", why)
	}
	for _, p := range []string{Script(repo), filepath.Join(Modules(repo), "node-llama-cpp", "package.json"), InstalledFile(repo)} {
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if why := Missing(repo); why != "" && !strings.Contains(why, "node is not on PATH") {
		t.Fatalf("complete repo: %q", why)
	}
}
