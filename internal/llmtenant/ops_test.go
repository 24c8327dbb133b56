package llmtenant

import (
	"context"
	"errors"
	"strings"
	"testing"
)

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
