package test

import (
	"context"
	"strings"
	"syscall"
	"testing"
	"time"

	ortclient "github.com/ortbus/ortbus/client"
	"github.com/ortbus/ortbus/codec"
	"github.com/ortbus/ortbus/config"
)

// TestGatewayCtrlC is a Ctrl-C in the gateway's terminal: SIGINT to its whole process
// group, so its workers get it too, drain and exit 0 while the gateway still drains its
// own requests (a batch request held by a pause keeps it draining for its grace). No
// worker is restarted meanwhile, no model is taken for one a worker died loading, and
// the gateway exits 0 (before: the supervisor restarted the workers, and the ones it then
// stopped while loading marked their model poisoned).
func TestGatewayCtrlC(t *testing.T) {
	root := imageRoot(t)
	red := colourPNG(t, root, "red")
	cfg := gwConfig{
		Root: root,
		// A quick restart, well within the drain's grace: before the fix it came.
		Gateway: config.Gateway{RestartBackoffMin: config.Duration(10 * time.Millisecond), ShutdownGrace: config.Duration(3 * time.Second)},
		Pools:   []gwPool{{Name: "cpu", Version: "1.30.0", Workers: 2, Slots: 1, Classes: []string{"interactive", "batch"}, Models: []string{gwTagger}}},
		Classes: []gwClass{{Name: "interactive", Chain: []string{"cpu"}}, {Name: "batch", Chain: []string{"cpu"}}},
	}
	g := spawnGateway(t, cfg.write(t))
	t.Cleanup(func() {
		g.stop(t)
		if t.Failed() {
			t.Logf("gateway log (%s):\n%s", g.logPath, g.log())
		}
	})
	g.awaitReady(t)
	g.connect(t, t.Name())
	defer g.NC.Close()
	g.waitLive(t, "cpu", 2)

	// A batch request held in the gateway's queue by the operator's pause: the gateway's
	// drain waits for it (up to shutdown_grace) after the signal.
	ctx, cancel := context.WithTimeout(context.Background(), gwReplyBound)
	defer cancel()
	if _, err := ortclient.New(g.NC).Pause(ctx, &codec.PauseRequest{Class: "batch", ForMS: 60_000}); err != nil {
		t.Fatalf("pause batch: %v", err)
	}
	in := newInbox(t, g.NC)
	g.post(t, in, "tag", "held", &codec.Request{ID: "held", Path: red, Model: gwTagger, Class: "batch"})
	g.waitStatus(t, "the batch request queued", func(st *codec.StatusReply) bool {
		for _, c := range st.Classes {
			if c.Name == "batch" {
				return c.Queued == 1
			}
		}
		return false
	})

	// Ctrl-C: SIGINT to the gateway's process group (its own: launch starts it so).
	if err := syscall.Kill(-g.lp.PID(), syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	st, err := g.lp.Wait(gwStopBound)
	if err != nil {
		t.Fatal(err)
	}
	if !st.Success() {
		t.Errorf("the gateway exited %v after Ctrl-C, want 0", st)
	}
	if r := gwDecode(t, in.next(t, "the answer to the held request")); r.code() != string(codec.CodeNoWorker) {
		t.Errorf("the request held at the shutdown: %s, want no_worker", r.code())
	}
	log := g.log()
	for _, bad := range []string{"-r1@", "died while loading", "skip it"} {
		if strings.Contains(log, bad) {
			t.Errorf("the gateway's log after Ctrl-C holds %q (a worker restarted, or a model poisoned)", bad)
		}
	}
}
