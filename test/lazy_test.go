package test

import (
	"fmt"
	"strings"
	"testing"

	"github.com/ortbus/ortbus/codec"
	"github.com/ortbus/ortbus/config"
)

// A lazy_load pool is not started with the gateway: its first request starts it, waits
// for it, and is served by it; the wait is in the reply's queue time.
func TestGatewayLazyPool(t *testing.T) {
	root := imageRoot(t)
	red := colourPNG(t, root, "red")
	cfg := gwConfig{
		Root: root,
		Pools: []gwPool{
			{Name: "ia", Version: "1.30.0", Classes: []string{"interactive"}, Models: []string{gwTagger}},
			{Name: "lz", Version: "1.24.3", Classes: []string{"interactive"}, Models: []string{gwTagger}, LazyLoad: true},
		},
		Classes: []gwClass{{Name: "interactive", Chain: []string{"ia", "lz"}}},
	}.write(t)
	g := startGateway(t, cfg)
	defer g.stop(t)

	// Ready without it: no worker of pool lz exists.
	g.waitLive(t, "ia", 1)
	for _, w := range g.status(t).Workers {
		if w.Pool == "lz" {
			t.Fatalf("worker %s of the lazy pool exists before its first request", w.Worker)
		}
	}
	r := g.call(t, "tag", &codec.Request{Path: red, Pool: "lz", Model: gwTagger}, gwReplyBound)
	tr := r.tag(t)
	if tr.Pool != "lz" {
		t.Fatalf("served by pool %s, want lz", tr.Pool)
	}
	w := g.waitLive(t, "lz", 1)[tr.Worker]
	var load int64
	for _, m := range w.Models {
		load += m.LoadMS
	}
	// The worker was started after the request was accepted, so the request waited at
	// least as long as the worker took to load its models.
	if tr.Timing.QueueUS < load*1000 {
		t.Errorf("queue_us %d is less than the lazy worker's model load time %d ms", tr.Timing.QueueUS, load)
	}
	t.Logf("first request on the lazy pool: queue %d ms (model load %d ms), total %d ms", tr.Timing.QueueUS/1000, load, tr.Timing.TotalUS/1000)
}

// A pool with keep_alive stops its workers once idle that long, releasing their memory
// in the admission, and its next request starts them again.
func TestGatewayKeepAlive(t *testing.T) {
	t.Parallel()
	root := imageRoot(t)
	red := colourPNG(t, root, "red")
	g := startGateway(t, gwConfig{
		Root:    root,
		Devices: map[string]config.Device{"cpu": {Capacity: 1 << 30}},
		Pools:   []gwPool{{Name: "ka", Version: "1.30.0", Classes: []string{"interactive"}, Models: []string{gwTagger}, KeepAlive: "300ms"}},
		Classes: []gwClass{{Name: "interactive", Chain: []string{"ka"}}},
	}.write(t))
	admitted := func() int64 {
		for _, d := range g.status(t).Devices {
			if d.Device == "cpu" {
				return d.AdmittedBytes
			}
		}
		return -1
	}
	first := g.call(t, "tag", &codec.Request{Path: red, Model: gwTagger}, gwReplyBound).tag(t)
	w := g.waitLive(t, "ka", 1)[first.Worker]
	if admitted() <= 0 {
		t.Fatalf("nothing admitted on cpu with worker %s loaded", first.Worker)
	}
	// Idle: the worker process exits and its memory leaves the admission.
	checkFor(t, "the idle pool stopped", gwReplyBound, pollEvery, func() error {
		if !gwProcessGone(w.PID) || len(gwLive(g.status(t), "ka")) != 0 || admitted() != 0 {
			return fmt.Errorf("worker %s (pid %d) still there or admitted %d", first.Worker, w.PID, admitted())
		}
		return nil
	})
	// Status shows it asleep, not dead: it starts again on the next request.
	shown := false
	for _, sw := range g.status(t).Workers {
		if sw.Worker == first.Worker {
			shown = true
			if sw.State != "asleep" || !strings.Contains(sw.LastExit, "keep_alive") {
				t.Errorf("status of the stopped worker %s: state %q, last exit %q; want asleep after keep_alive", sw.Worker, sw.State, sw.LastExit)
			}
		}
	}
	if !shown {
		t.Errorf("status does not show the stopped worker %s", first.Worker)
	}
	// The next request starts it again.
	second := g.call(t, "tag", &codec.Request{Path: red, Model: gwTagger}, gwReplyBound).tag(t)
	if second.Pool != "ka" || second.Worker == first.Worker || second.General["red"] < 0.9 {
		t.Fatalf("after the idle stop: served by %s/%s (first %s), tags %v", second.Pool, second.Worker, first.Worker, second.General)
	}
}

// A sleeping pool that needs memory an idle pool of a lower class holds has that pool
// stopped (evicted) first: the budget holds one of them, the interactive one wins.
func TestGatewayEvictsIdleLowerPool(t *testing.T) {
	t.Parallel()
	root := imageRoot(t)
	red := colourPNG(t, root, "red")
	g := startGateway(t, gwConfig{
		Root:        root,
		Devices:     map[string]config.Device{"cpu": {Capacity: 1 << 30, SafeFraction: 0.15}}, // budget ~153 MiB
		ModelMemory: 100 << 20,
		Pools: []gwPool{
			{Name: "lo", Version: "1.24.3", Classes: []string{"batch"}, Models: []string{gwTagger}, KeepAlive: "1h"},
			{Name: "hi", Version: "1.30.0", Classes: []string{"interactive"}, Models: []string{gwTagger}, LazyLoad: true},
		},
		Classes: []gwClass{{Name: "interactive", Chain: []string{"hi"}}, {Name: "batch", Chain: []string{"lo"}}},
	}.write(t))
	lo := g.waitLive(t, "lo", 1)
	r := g.call(t, "tag", &codec.Request{Path: red, Model: gwTagger}, gwReplyBound).tag(t)
	if r.Pool != "hi" || r.General["red"] < 0.9 {
		t.Fatalf("interactive request: served by %s, tags %v", r.Pool, r.General)
	}
	st := g.status(t)
	if n := len(gwLive(st, "lo")); n != 0 {
		t.Errorf("pool lo has %d live workers after its eviction", n)
	}
	for id, w := range lo {
		if !gwProcessGone(w.PID) {
			t.Errorf("evicted worker %s (pid %d) still runs", id, w.PID)
		}
	}
}
