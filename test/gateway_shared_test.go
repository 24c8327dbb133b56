package test

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/ortbus/ortbus/codec"
)

// The shared gateway of the TestGateway* tests that only send it requests (routing, reuse,
// priority, deadlines, cancel, overload, metrics, the nats CLI): one gateway with two pools
// on the two runtime versions — ia (1.30.0, interactive) and bt (1.24.3, batch and
// interactive), one worker of one slot each — chains interactive=[ia, bt] and batch=[bt],
// an interactive queue bound of 10. It is started by the first test that asks for it and
// stopped (SIGTERM; it must drain its workers and exit 0) after the package's last test.
//
// Each test begins on an idle gateway (settle), so that it can take its baselines (served
// counts, /metrics counters) at its own start and runs alone or in any order.
var gwShared struct {
	once sync.Once
	g    *gatewayProc
	img  map[string]string // red, blue and green PNGs under its allowed root
	err  error
}

// gwSharedPools are the shared gateway's pools.
var gwSharedPools = []string{"ia", "bt"}

// sharedGateway starts the shared gateway on first use, waits until it is idle, and
// returns it and its images by colour. If t fails, the gateway's log of t's time is
// shown.
func sharedGateway(t *testing.T) (*gatewayProc, map[string]string) {
	t.Helper()
	gwShared.once.Do(func() {
		// Set until the end: a t.Fatal inside (Goexit) leaves it for later callers.
		gwShared.err = errors.New("start-up was interrupted; see the first test that failed")
		dir := filepath.Join(pkgEnv.tmp, "shared-gateway")
		root := filepath.Join(dir, "images")
		if err := os.MkdirAll(root, 0o755); err != nil {
			gwShared.err = err
			return
		}
		img := map[string]string{}
		for _, c := range []string{"red", "blue", "green"} {
			img[c] = colourPNG(t, root, c)
		}
		cfg := gwConfig{
			Root: root,
			Pools: []gwPool{
				{Name: "ia", Version: "1.30.0", Classes: []string{"interactive"}, Models: []string{gwTagger, gwSlow}},
				{Name: "bt", Version: "1.24.3", Classes: []string{"batch", "interactive"}, Models: []string{gwTagger, gwSlow}},
			},
			Classes: []gwClass{
				{Name: "interactive", Chain: []string{"ia", "bt"}, QueueBound: 10},
				{Name: "batch", Chain: []string{"bt"}},
			},
		}.writeIn(t, dir)
		t0 := time.Now()
		g := spawnGateway(t, cfg)
		atExit(func(failed bool) error {
			if g.NC != nil {
				g.NC.Close()
			}
			err := g.shutdown()
			if failed && err == nil {
				fmt.Fprintf(os.Stderr, "--- log of the shared gateway (%s):\n%s", g.logPath, g.log())
			}
			if err != nil {
				err = fmt.Errorf("shared gateway: %w", err)
			}
			return err
		})
		g.awaitReady(t)
		g.connect(t, "ortbus-test-shared-gateway")
		t.Logf("shared gateway ready in %v: %+v", time.Since(t0).Round(time.Millisecond), g.Ready)
		for _, p := range gwSharedPools {
			g.waitLive(t, p, 1)
		}
		gwShared.g, gwShared.img, gwShared.err = g, img, nil
	})
	if gwShared.err != nil {
		t.Fatalf("shared gateway: %v", gwShared.err)
	}
	g := gwShared.g
	if !g.alive() {
		t.Fatalf("the shared gateway has exited (%v); log:\n%s", g.lp.State(), g.log())
	}
	from := len(g.log())
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("shared gateway log while %s ran (%s from byte %d):\n%s", t.Name(), g.logPath, from, g.log()[from:])
		}
	})
	gwSettle(t, g)
	return g, gwShared.img
}

// gwSettle waits until the shared gateway is idle: nothing queued or running in any class,
// each pool's one worker live and idle in a heartbeat sent after gwSettle began (so its
// served and failed counts include every request answered before).
func gwSettle(t *testing.T, g *gatewayProc) {
	t.Helper()
	// Heartbeats carry milliseconds, and the worker takes its snapshot just before it sets
	// SentMS: 2 ms more puts the snapshot surely after now.
	fresh := time.Now().UnixMilli() + 2
	g.waitStatus(t, "the shared gateway idle, with fresh heartbeats", func(st *codec.StatusReply) bool {
		for _, c := range st.Classes {
			if c.Queued != 0 || c.Running != 0 {
				return false
			}
		}
		for _, p := range gwSharedPools {
			live := gwLive(st, p)
			if len(live) != 1 {
				return false
			}
			for _, w := range live {
				if w.SentMS < fresh || w.HeldCount != 0 || len(w.Held) != 0 || gwSum(w.Queued) != 0 || gwSum(w.Running) != 0 {
					return false
				}
			}
		}
		return true
	})
}

func gwSum(m map[string]int) int {
	n := 0
	for _, v := range m {
		n += v
	}
	return n
}
