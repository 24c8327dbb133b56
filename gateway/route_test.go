package gateway

import (
	"fmt"
	"io"
	"log/slog"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ortbus/ortbus/codec"
	"github.com/ortbus/ortbus/config"
	"github.com/ortbus/ortbus/health"
	"github.com/ortbus/ortbus/internal/testkit/testenv"
	"github.com/ortbus/ortbus/sched"
	"github.com/ortbus/ortbus/subjects"
)

// Routing (route.go, capacity.go). Most tests route on a capacity snapshot built in
// memory; those of what the gateway puts in a snapshot, and does with a decision, use a
// gateway on an in-process NATS server whose capacity is faked by publishing heartbeats
// to its tracker. No process is started.

// routeConfig has three remote pools: fast and bulk share the device cuda:0, spare is on
// the CPU and maps paths.
const routeConfig = `
[nats]
url = "nats://127.0.0.1:1"
[security]
allowed_roots = ["/srv"]
[devices."cuda:0"]
capacity = "8GiB"
[classes.interactive]
chain = ["fast", "bulk", "spare"]
[classes.batch]
chain = ["bulk", "spare"]
[pools.fast]
local = false
device = "cuda:0"
classes = ["urgent", "interactive"]
models = ["tagger", "ccip"]
slots = 2
[pools.bulk]
local = false
device = "cuda:0"
classes = ["interactive", "batch"]
models = ["tagger", "det"]
max_batch = 4
[pools.spare]
local = false
classes = ["interactive", "batch"]
models = ["seg", "tagger"]
path_map = { "/srv" = "/mnt/srv", "/srv/images" = "/data/img" }
[models.tagger]
kind = "tagger-pixai"
dir = "/srv/m/tagger"
[models.ccip]
kind = "ccip"
dir = "/srv/m/ccip"
[models.det]
kind = "detect"
dir = "/srv/m/det"
[models.seg]
kind = "segment"
dir = "/srv/m/seg"
`

// parseConfig is the config toml, validated as the gateway's is.
func parseConfig(t testing.TB, toml string) *config.Config {
	t.Helper()
	c, err := config.Parse([]byte(toml), "unit.toml")
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// configGateway is a gateway that has only its configuration: enough for what reads
// nothing else (candidates, path maps).
func configGateway(t testing.TB, toml string) *Gateway {
	t.Helper()
	return gatewayWith(parseConfig(t, toml), &Gateway{})
}

// gatewayWith is g with the configuration c in force.
func gatewayWith(c *config.Config, g *Gateway) *Gateway {
	g.reloader = &reloader{configs: newConfigs(c), log: g.log}
	return g
}

// loopGateway is a gateway of config c with only its configuration and a dispatcher that
// reads nothing else (no connection, no tracker, no supervisor): for what runs on the
// dispatch loop and its sender alone.
func loopGateway(c *config.Config) *Gateway {
	g := gatewayWith(c, &Gateway{log: slog.New(slog.NewTextHandler(io.Discard, nil))})
	m := newMetrics(c, g.conf, g.log)
	g.d = newDispatcher(c, g.log, newLoopHandle(c, g.conf), &estimator{}, senderDeps{metrics: m}, dispatchDeps{})
	return g
}

// testGateway is unitGateway on the config toml, with the grace for remote pools to be
// heard long over (so a pool without live workers is a reason for no_worker, not for
// waiting).
func testGateway(t *testing.T, toml string) *Gateway {
	t.Helper()
	g := unitGatewayOf(t, toml)
	g.supervisor.started = time.Now().Add(-time.Hour)
	return g
}

// checkFor is testenv.CheckFor, the one polling wait of the tests.
var checkFor = testenv.CheckFor

// snapOf is a capacity snapshot of the config toml in memory, at the start of a dispatch
// pass: no live worker, nothing in flight or measured, and every pool as the supervisor
// sees it long after start-up (the remote ones: no worker heartbeating).
func snapOf(t testing.TB, toml string) *capacity {
	t.Helper()
	cfg := parseConfig(t, toml)
	now := time.Now()
	s := newSupervisor(cfg, nil, nil, nil, "", "", "", nil)
	s.started = now.Add(-time.Hour)
	c := newCapacity(cfg, now)
	for name, pc := range c.pools {
		pc.poolStatus = s.poolState(name, now)
	}
	return c
}

// ready adds a live worker of pool with slots, serving classes, to the snapshot.
func ready(c *capacity, pool string, slots int, classes ...string) {
	c.addLive(health.Worker{HB: codec.Heartbeat{Worker: pool, Pool: pool, Slots: slots, Classes: classes, State: codec.StateReady}})
}

// nextPass is the snapshot of the next dispatch pass: what c has in flight, with no pool
// known full.
func nextPass(c *capacity) *capacity {
	c.full = map[string]bool{}
	return c
}

// routeIn routes it on the snapshot c: the pool it goes to, or its error.
func routeIn(c *capacity, it *sched.Item, reserved map[string]bool) (string, error) {
	d := c.place(it, reserved)
	return d.pool, d.err
}

// routeOK routes it and fails the test on an error.
func routeOK(t *testing.T, c *capacity, it *sched.Item, reserved map[string]bool) string {
	t.Helper()
	pool, err := routeIn(c, it, reserved)
	if err != nil {
		t.Fatalf("route %s (%s): %v", it.ID, it.Class, err)
	}
	return pool
}

// fleet fakes a gateway's capacity: it starts the gateway's tracker on its in-process
// connection and feeds it heartbeats, each awaited until the tracker holds it.
type fleet struct {
	t       *testing.T
	g       *Gateway
	changed chan struct{}
	seq     uint64
}

func newFleet(t *testing.T, g *Gateway) *fleet {
	t.Helper()
	f := &fleet{t: t, g: g, changed: make(chan struct{}, 1)}
	// The gateway's own tracker (the dispatcher's and the budget's), followed here.
	g.tracker.MissCount, g.tracker.Listener = 3, fleetListener{f.changed}
	if err := g.tracker.Start(g.nc); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(g.tracker.Stop)
	return f
}

// fleetListener is the fleet's tracker's Listener: each change is signalled on changed
// (one at a time); deaths and drops are not followed, and no process is known to run.
type fleetListener struct{ changed chan struct{} }

func (l fleetListener) Changed() {
	select {
	case l.changed <- struct{}{}:
	default:
	}
}
func (fleetListener) Dead(health.Worker)  {}
func (fleetListener) Dropped(string)      {}
func (fleetListener) Running(string) bool { return false }

// beat publishes hb (its state ready unless set, an hour's interval so that it never
// dies of silence here) and waits until the tracker has it.
func (f *fleet) beat(hb codec.Heartbeat) {
	f.t.Helper()
	f.seq++
	hb.Seq = f.seq
	hb.IntervalMS = time.Hour.Milliseconds()
	if hb.State == "" {
		hb.State = codec.StateReady
	}
	subj, err := subjects.Heartbeat(hb.Pool, hb.Worker)
	if err != nil {
		f.t.Fatal(err)
	}
	m, err := health.Message(subj, &hb)
	if err != nil {
		f.t.Fatal(err)
	}
	if err := f.g.nc.PublishMsg(m); err != nil {
		f.t.Fatal(err)
	}
	timeout := time.After(10 * time.Second)
	for {
		if w, ok := f.g.tracker.Get(hb.Worker); ok && w.HB.Seq == hb.Seq {
			return
		}
		select {
		case <-f.changed:
		case <-timeout:
			f.t.Fatalf("heartbeat of %s never tracked", hb.Worker)
		}
	}
}

// ready makes a live worker of pool with slots, serving classes, that takes items sent
// to it alone (direct), as every worker of this version does.
func (f *fleet) ready(pool, id string, slots int, classes ...string) {
	f.t.Helper()
	f.beat(codec.Heartbeat{Worker: id, Pool: pool, Slots: slots, Classes: classes, Direct: true})
}

var itemSeq int

// newItem is a queued request of class for op (model tagger unless op is another
// model's), due by deadline, with candidate pools.
func newItem(class, op string, deadline time.Time, pools ...string) *sched.Item {
	itemSeq++
	id := fmt.Sprintf("r%d", itemSeq)
	model := map[string]string{"tag": "tagger", "embed": "ccip", "detect": "det", "segment": "seg"}[op]
	p := &pending{id: id, op: op, class: class, deadline: deadline, req: codec.Request{ID: id, Model: model}, reply: func([]byte, *codec.Error) {}}
	return &sched.Item{ID: id, Class: class, Pools: pools, Deadline: deadline, Value: p}
}

// passRouter is the router of a dispatch pass of g at now, as the lifecycle runs it (L2):
// each item routed is taken as a queued request of the lifecycle first, and a pool the
// pass wakes is woken at once.
func passRouter(g *Gateway, now time.Time) sched.Router {
	var wake []effect
	r := g.d.lc.router(now, g.d.router(now, g.d.lc), &wake)
	return func(it *sched.Item, reserved map[string]bool) (string, error) {
		if g.d.lc.byID[it.ID] == nil {
			g.d.lc.byID[it.ID] = &flight{p: it.Value.(*pending), state: stQueued}
		}
		pool, err := r(it, reserved)
		g.d.apply(wake)
		wake = wake[:0]
		return pool, err
	}
}

// asErr is err as a contract error (an empty one for nil, so a test can read its fields).
func asErr(err error) *codec.Error {
	if e := codec.AsError(err); e != nil {
		return e
	}
	return &codec.Error{}
}

func soon() time.Time { return time.Now().Add(time.Minute) }

// TestPoolsFor: candidates are the chain's pools that load a model serving the op (the
// named model, if any), in chain order, each once.
func TestPoolsFor(t *testing.T) {
	g := configGateway(t, routeConfig)
	all := []string{"fast", "bulk", "spare"}
	cases := []struct {
		chain     []string
		op, model string
		want      []string
	}{
		{all, "tag", "", all},
		{[]string{"spare", "bulk", "fast"}, "tag", "", []string{"spare", "bulk", "fast"}}, // chain order, not file order
		{all, "tag", "tagger", all},
		{all, "embed", "", []string{"fast"}},
		{all, "compare", "ccip", []string{"fast"}},
		{all, "detect", "", []string{"bulk"}},
		{all, "segment", "", []string{"spare"}},
		{[]string{"fast", "bulk"}, "segment", "", nil}, // no pool of the chain loads one
		{all, "tag", "ccip", nil},                      // the named model does not serve tag
		{all, "embed", "tagger", nil},
		{all, "tag", "det", nil},
		{all, "infer", "", nil},
		{all, "bogus", "", nil},
	}
	for _, c := range cases {
		if got := poolsFor(g.conf(), c.chain, c.op, c.model); !slices.Equal(got, c.want) {
			t.Errorf("poolsFor(%v, %s, %q) = %v, want %v", c.chain, c.op, c.model, got, c.want)
		}
	}
}

// TestRetryPools: a retry goes to the request's explicit pool, else to its class chain's
// candidates; it is retryable while one of them has a live worker or workers coming.
func TestRetryPools(t *testing.T) {
	g := testGateway(t, routeConfig)
	f := newFleet(t, g)
	p := &pending{op: "detect", class: "interactive"}
	env := loopEnv{g.d}
	if got := env.retryPools(p); !slices.Equal(got, []string{"bulk"}) {
		t.Fatalf("retry pools of detect = %v, want [bulk]", got)
	}
	p = &pending{op: "tag", class: "batch", req: codec.Request{Pool: "spare"}}
	if got := env.retryPools(p); !slices.Equal(got, []string{"spare"}) {
		t.Fatalf("retry pools with pool spare = %v, want [spare]", got)
	}
	if env.mayRun(env.retryPools(p)) {
		t.Fatal("retryable with no live worker and the remote grace over")
	}
	f.ready("bulk", "bulk-1", 1, "interactive", "batch")
	if env.mayRun(env.retryPools(p)) {
		t.Fatal("retryable on spare because bulk is live")
	}
	f.ready("spare", "spare-1", 1, "interactive", "batch")
	if !env.mayRun(env.retryPools(p)) {
		t.Fatal("not retryable with a live worker in spare")
	}
}

// TestMappedPaths: a pool with a path_map sees the path through its longest matching
// prefix (component-wise); a pool without one sees it unchanged; a path or out_path that
// some candidate pool cannot map is forbidden_path naming that pool.
func TestMappedPaths(t *testing.T) {
	g := configGateway(t, routeConfig)
	cases := []struct{ path, spare string }{
		{"/srv/images/a.png", "/data/img/a.png"},
		{"/srv/images2/a.png", "/mnt/srv/images2/a.png"},
		{"/srv/b.png", "/mnt/srv/b.png"},
		{"/srv/images", "/data/img"},
	}
	for _, c := range cases {
		p := &pending{req: codec.Request{Path: c.path}}
		if got, ok := mapPrefix(g.conf().Pool("spare").PathMap, p.req.Path); !ok || got != c.spare {
			t.Errorf("%s on spare = %q %v, want %q", c.path, got, ok, c.spare)
		}
		if got, ok := mapPrefix(g.conf().Pool("fast").PathMap, p.req.Path); !ok || got != c.path {
			t.Errorf("%s on fast (no map) = %q %v, want it unchanged", c.path, got, ok)
		}
		if err := mapPaths(g.conf(), p, []string{"fast", "bulk", "spare"}); err != nil {
			t.Errorf("mapPaths(%s): %v", c.path, err)
		}
	}

	outside := &pending{req: codec.Request{Path: "/opt/a.png"}}
	if _, ok := mapPrefix(g.conf().Pool("spare").PathMap, outside.req.Path); ok {
		t.Error("a path under no prefix is mapped")
	}
	err := mapPaths(g.conf(), outside, []string{"fast", "spare", "bulk"})
	if err == nil || err.Code != codec.CodeForbiddenPath || err.Details["pool"] != "spare" || !strings.Contains(err.Message, "/opt/a.png") {
		t.Fatalf("unmappable path: %v, want forbidden_path naming pool spare", err)
	}
	if err := mapPaths(g.conf(), outside, []string{"fast", "bulk"}); err != nil {
		t.Fatalf("pools without a map refused a path: %v", err)
	}
	out := &pending{req: codec.Request{Path: "/srv/a.png", OutPath: "/opt/mask.png"}}
	if err := mapPaths(g.conf(), out, []string{"spare"}); err == nil || err.Code != codec.CodeForbiddenPath || !strings.Contains(err.Message, "out_path") {
		t.Fatalf("unmappable out_path: %v, want forbidden_path about out_path", err)
	}
	if err := mapPaths(g.conf(), &pending{}, []string{"spare"}); err != nil {
		t.Fatalf("a request without paths: %v", err)
	}
}

// TestRoom: room is the sum over live workers serving the class of max(1, slots), times
// max_batch for the batch class of a batching pool, less what is in flight; a worker
// starting or dead, or of a pool not in the config, adds nothing, and a class listed
// twice counts once. A device's live slots are its pools' live workers' max(1, slots),
// whatever classes they serve.
func TestRoom(t *testing.T) {
	c := snapOf(t, routeConfig)
	add := func(pool string, slots int, state string, dead bool, classes ...string) {
		c.addLive(health.Worker{Dead: dead, HB: codec.Heartbeat{Worker: "w", Pool: pool, Slots: slots, Classes: classes, State: state}})
	}
	add("bulk", 2, codec.StateReady, false, "interactive", "batch")
	add("bulk", 0, codec.StateReady, false, "interactive", "batch", "batch") // slots 0 counts as one; batch once
	add("bulk", 3, codec.StateReady, false, "interactive")                   // does not serve batch
	add("bulk", 5, codec.StateStarting, false, "interactive", "batch")
	add("bulk", 7, codec.StateReady, true, "interactive", "batch")
	add("spare", 2, codec.StateReady, false, "interactive", "batch")
	add("ghost", 9, codec.StateReady, false, "interactive")

	check := func(pool, class string, want int) {
		t.Helper()
		if got := c.room(pool, class); got != want {
			t.Errorf("room(%s, %s) = %d, want %d", pool, class, got, want)
		}
	}
	check("bulk", "interactive", 2+1+3)
	check("bulk", "batch", (2+1)*4)
	check("spare", "batch", 2) // max_batch unset: one request a slot
	check("spare", "interactive", 2)
	check("fast", "interactive", 0) // no worker
	check("bulk", "urgent", 0)      // no worker serves it
	if !c.pools["bulk"].live || !c.pools["spare"].live || c.pools["fast"].live {
		t.Errorf("live: bulk %v spare %v fast %v, want true true false", c.pools["bulk"].live, c.pools["spare"].live, c.pools["fast"].live)
	}
	if c.deviceSlots["cuda:0"] != 2+1+3 || c.deviceSlots["cpu"] != 2 {
		t.Errorf("live slots per device %v, want cuda:0 6, cpu 2", c.deviceSlots)
	}

	c.pools["bulk"].busy = 7
	check("bulk", "interactive", 6-7)
	check("bulk", "batch", 12-7)
}

// TestSnapshot: a pass's snapshot holds the tracker's live workers (by TestRoom's rules),
// the requests in flight per pool and per device and class, when each class was last
// active on each device, the measured service times and the supervisor's view of each
// pool. It is a copy: what it takes does not reach the
// gateway, nor do the gateway's later changes reach it.
func TestSnapshot(t *testing.T) {
	g := testGateway(t, routeConfig)
	f := newFleet(t, g)
	f.ready("bulk", "bulk-1", 2, "interactive", "batch")
	f.beat(codec.Heartbeat{Worker: "bulk-2", Pool: "bulk", Slots: 5, Classes: []string{"interactive"}, State: codec.StateStarting})
	f.ready("fast", "fast-1", 1, "urgent", "interactive")
	g.tracker.MarkDead("fast-1", "fast", "", "exit code 1")
	held := time.Now().Add(-time.Second)
	g.d.lc.hold(&flight{p: &pending{class: "batch"}}, "bulk", "bulk-1", "batch", held)
	g.d.lc.hold(&flight{p: &pending{class: "interactive"}}, "bulk", "", "interactive", held)
	g.d.est.observe(estKey{"bulk", "tag", "tagger"}, time.Second)
	g.supervisor.pools["spare"] = &poolProcs{cfg: g.conf().Pools["spare"], procs: []*proc{{pool: "spare"}}, asleep: true}

	c := g.d.snapshot(time.Now(), g.d.lc.held())
	if b := c.pools["bulk"]; !b.live || b.slots["interactive"] != 2 || b.slots["batch"] != 8 || b.busy != 2 || b.workerSlots != 2 {
		t.Fatalf("bulk: live %v slots %v (%d in all) busy %d, want live, interactive 2 batch 8 (2), busy 2", b.live, b.slots, b.workerSlots, b.busy)
	}
	if c.pools["fast"].live || c.room("fast", "interactive") != 0 {
		t.Fatal("a dead worker counted")
	}
	if w, ok := c.workers["bulk-1"]; !ok || w.pool != "bulk" || w.slots != 2 || w.busy["batch"] != 1 || len(c.workers) != 1 {
		t.Fatalf("direct workers %v (bulk-1: %+v), want bulk-1 alone, 2 slots, one batch item sent to it", c.workers, w)
	}
	if c.deviceSlots["cuda:0"] != 2 || c.load["cuda:0"]["batch"] != 1 || c.load["cuda:0"]["interactive"] != 1 {
		t.Fatalf("cuda:0: slots %d load %v, want 2 and one batch, one interactive", c.deviceSlots["cuda:0"], c.load["cuda:0"])
	}
	if a := c.active["cuda:0"]; len(a) != 2 || !a["batch"].Equal(held) || !a["interactive"].Equal(held) {
		t.Fatalf("cuda:0 last active %v, want batch and interactive at %v", a, held)
	}
	if got := c.est[estKey{"bulk", "tag", "tagger"}]; got != time.Second {
		t.Fatalf("measured service time %s, want 1s", got)
	}
	if st := c.pools["fast"].poolStatus; st.coming || !strings.HasPrefix(st.reason, "no live workers") {
		t.Fatalf("remote pool without workers: %+v", st)
	}
	if st := c.pools["spare"].poolStatus; !st.coming || !st.asleep {
		t.Fatalf("lazy pool asleep: %+v", st)
	}

	c.take("bulk", "batch")
	g.d.lc.hold(&flight{p: &pending{class: "urgent"}}, "fast", "", "urgent", time.Now())
	g.d.est.observe(estKey{"fast", "tag", "tagger"}, time.Second)
	h := g.d.lc.held()
	if h.busy["bulk"] != 2 || h.load["cuda:0"]["batch"] != 1 {
		t.Fatalf("the snapshot's take reached flights: busy %v load %v", h.busy, h.load)
	}
	if c.pools["fast"].busy != 0 || c.load["cuda:0"]["urgent"] != 0 || c.est[estKey{"fast", "tag", "tagger"}] != 0 ||
		!c.active["cuda:0"]["urgent"].IsZero() {
		t.Fatal("the gateway's changes after the snapshot reached it")
	}
}

// TestPoolStatus: the supervisor's view of a pool without live workers. A remote pool is
// coming for a death verdict's time after start-up, then gone; a local pool is coming
// while its workers start, or asleep (lazy_load, and coming) until woken; it is not when
// it failed at start-up (with that error), crash-loops, has no workers, or the gateway
// shuts down.
func TestPoolStatus(t *testing.T) {
	cfg := parseConfig(t, routeConfig)
	s := newSupervisor(cfg, nil, nil, nil, "", "", "", nil)
	grace := time.Duration(cfg.Health.MissCount) * cfg.Health.HeartbeatInterval.D()
	if st := s.poolState("fast", s.started.Add(grace-time.Millisecond)); !st.coming || st.reason != "remote workers not heard yet" {
		t.Errorf("remote pool within its grace: %+v", st)
	}
	if st := s.poolState("fast", s.started.Add(grace)); st.coming || st.reason != "no live workers (remote pool: none heartbeating)" {
		t.Errorf("remote pool after its grace: %+v", st)
	}

	missing := codec.Errorf(codec.CodeRuntimeMissing, "libonnxruntime.so.1 not found")
	for _, c := range []struct {
		name           string
		set            func(*poolProcs)
		reason         string
		coming, asleep bool
	}{
		{"starting", func(*poolProcs) {}, "workers starting", true, false},
		{"lazy", func(pp *poolProcs) { pp.asleep = true }, "not started yet (lazy_load): starting for this request", true, true},
		{"crash-looping", func(pp *poolProcs) { pp.crashLooping = true }, "crash-looping (0 deaths within 30s)", false, false},
		{"failed", func(pp *poolProcs) { pp.failed = missing }, "runtime_missing: libonnxruntime.so.1 not found", false, false},
		{"no workers", func(pp *poolProcs) { pp.procs = nil }, "no workers configured", false, false},
		{"shutting down", func(pp *poolProcs) { pp.asleep = true; s.closed = true }, "shutting down", false, false},
	} {
		pp := &poolProcs{cfg: cfg.Pools["spare"], procs: []*proc{{pool: "spare"}}}
		s.pools["spare"], s.closed = pp, false
		c.set(pp)
		st := s.poolState("spare", time.Now())
		if st.reason != c.reason || st.coming != c.coming || st.asleep != c.asleep || st.failed != pp.failed {
			t.Errorf("%s: %+v, want reason %q coming %v asleep %v failed %v", c.name, st, c.reason, c.coming, c.asleep, pp.failed)
		}
	}
}

// TestRouteChainOrder: an item goes to the first candidate pool with room, in chain
// order, and its unit is taken in the snapshot (pool and device); with every live pool
// full the item waits ("" and no error); a pool found full is skipped for the rest of
// the pass, and looked at again in the next.
func TestRouteChainOrder(t *testing.T) {
	c := snapOf(t, routeConfig)
	ready(c, "fast", 2, "urgent", "interactive")
	ready(c, "bulk", 1, "interactive", "batch")
	chain := []string{"fast", "bulk", "spare"}
	var got []string
	for range 3 {
		got = append(got, routeOK(t, c, newItem("interactive", "tag", soon(), chain...), nil))
	}
	if !slices.Equal(got, []string{"fast", "fast", "bulk"}) {
		t.Fatalf("routed to %v, want [fast fast bulk]", got)
	}
	if pool := routeOK(t, c, newItem("interactive", "tag", soon(), chain...), nil); pool != "" {
		t.Fatalf("with every live pool full routed to %q, want a wait", pool)
	}
	if b, l := c.pools["fast"].busy, c.pools["bulk"].busy; b != 2 || l != 1 || c.load["cuda:0"]["interactive"] != 3 {
		t.Fatalf("taken: fast %d bulk %d, cuda:0 interactive %d; want 2 1 3", b, l, c.load["cuda:0"]["interactive"])
	}
	c.pools["fast"].busy-- // the pass's memo holds, whatever the snapshot says now
	if pool := routeOK(t, c, newItem("interactive", "tag", soon(), chain...), nil); pool != "" {
		t.Fatalf("a pool found full was used again in the same pass (%q)", pool)
	}
	c = nextPass(c)
	if pool := routeOK(t, c, newItem("interactive", "tag", soon(), chain...), nil); pool != "fast" {
		t.Fatalf("next pass routed to %q, want fast", pool)
	}
	// Full for one class is not full for another: bulk still has batch room (max_batch).
	if pool := routeOK(t, c, newItem("batch", "tag", soon(), "bulk", "spare"), nil); pool != "bulk" {
		t.Fatalf("batch routed to %q, want bulk", pool)
	}
}

// TestRouteReserved: pools reserved by waiting higher-priority items are skipped (and
// not marked full); an item whose every live candidate is reserved waits.
func TestRouteReserved(t *testing.T) {
	c := snapOf(t, routeConfig)
	ready(c, "fast", 2, "urgent", "interactive")
	ready(c, "bulk", 2, "interactive", "batch")
	chain := []string{"fast", "bulk"}
	if pool := routeOK(t, c, newItem("interactive", "tag", soon(), chain...), map[string]bool{"fast": true}); pool != "bulk" {
		t.Fatalf("with fast reserved routed to %q, want bulk", pool)
	}
	if pool := routeOK(t, c, newItem("interactive", "tag", soon(), chain...), map[string]bool{"fast": true, "bulk": true}); pool != "" {
		t.Fatalf("with every pool reserved routed to %q, want a wait", pool)
	}
	if pool := routeOK(t, c, newItem("interactive", "tag", soon(), chain...), nil); pool != "fast" {
		t.Fatalf("unreserved routed to %q, want fast", pool)
	}
}

// TestRouteWaitOrNoWorker: an item waits while some candidate can still come (a live
// worker, remote workers not yet heard, local workers starting); else it fails with
// no_worker naming each pool and why; a one-pool chain whose pool failed at start-up gets
// that pool's own error.
func TestRouteWaitOrNoWorker(t *testing.T) {
	c := snapOf(t, routeConfig)
	chain := []string{"fast", "bulk"}
	gone := c.pools["bulk"].poolStatus

	_, err := routeIn(c, newItem("interactive", "tag", soon(), chain...), nil)
	e, ok := err.(*codec.Error)
	if !ok || e.Code != codec.CodeNoWorker {
		t.Fatalf("no workers anywhere: %v, want no_worker", err)
	}
	reasons, _ := e.Details["reasons"].([]string)
	if pools, _ := e.Details["pools"].([]string); !slices.Equal(pools, chain) || len(reasons) != 2 ||
		!strings.HasPrefix(reasons[0], "fast: no live workers") || !strings.HasPrefix(reasons[1], "bulk: no live workers") {
		t.Fatalf("no_worker details %v, want both pools and why", e.Details)
	}

	// Right after start-up a remote pool gets the time of a death verdict to be heard.
	c.pools["bulk"].poolStatus = poolStatus{reason: "remote workers not heard yet", coming: true}
	if pool, err := routeIn(c, newItem("interactive", "tag", soon(), chain...), nil); pool != "" || err != nil {
		t.Fatalf("remote pools not heard yet: %q %v, want a wait", pool, err)
	}
	c.pools["bulk"].poolStatus = gone

	// A live but full pool: wait.
	ready(c, "bulk", 1, "interactive", "batch")
	c.pools["bulk"].busy = 1
	if pool, err := routeIn(c, newItem("interactive", "tag", soon(), chain...), nil); pool != "" || err != nil {
		t.Fatalf("live pool full: %q %v, want a wait", pool, err)
	}

	// Local pools, as the supervisor sees them (TestPoolStatus).
	spare := c.pools["spare"]
	spare.poolStatus = poolStatus{reason: "workers starting", coming: true}
	if pool, err := routeIn(c, newItem("interactive", "tag", soon(), "fast", "spare"), nil); pool != "" || err != nil {
		t.Fatalf("local workers starting: %q %v, want a wait", pool, err)
	}
	spare.poolStatus = poolStatus{reason: "crash-looping (5 deaths within 30s)"}
	_, err = routeIn(c, newItem("interactive", "tag", soon(), "fast", "spare"), nil)
	if e := asErr(err); e.Code != codec.CodeNoWorker || !strings.Contains(e.Message, "spare: crash-looping") {
		t.Fatalf("crash-looping pool: %v, want no_worker naming it", err)
	}
	missing := codec.Errorf(codec.CodeRuntimeMissing, "libonnxruntime.so.1 not found")
	spare.poolStatus = poolStatus{reason: "runtime_missing: libonnxruntime.so.1 not found", failed: missing}
	_, err = routeIn(c, newItem("interactive", "tag", soon(), "spare"), nil)
	if e := asErr(err); e.Code != codec.CodeRuntimeMissing || e.Message != "libonnxruntime.so.1 not found" {
		t.Fatalf("one-pool chain, pool failed at start-up: %v, want its runtime_missing", err)
	}
	_, err = routeIn(c, newItem("interactive", "tag", soon(), "fast", "spare"), nil)
	if e := asErr(err); e.Code != codec.CodeNoWorker || !strings.Contains(e.Message, "spare: runtime_missing: libonnxruntime.so.1 not found") {
		t.Fatalf("two-pool chain with a failed pool: %v, want no_worker with its reason", err)
	}
	if pool, err := routeIn(c, newItem("interactive", "tag", soon(), "spare", "bulk"), nil); pool != "" || err != nil {
		t.Fatalf("a failed pool, then a live one: %q %v, want a wait for the live one", pool, err)
	}
}

// TestRouteLazyWake: an item that finds a lazy_load pool asleep (and no live pool before
// it in its chain) waits and asks for the pool to be woken, once a pass; an item that
// waits for a live pool first wakes nothing.
func TestRouteLazyWake(t *testing.T) {
	c := snapOf(t, routeConfig)
	asleep := poolStatus{reason: "not started yet (lazy_load): starting for this request", coming: true, asleep: true}
	c.pools["spare"].poolStatus = asleep
	if d := c.place(newItem("interactive", "tag", soon(), "fast", "spare"), nil); !reflect.DeepEqual(d, decision{wake: "spare"}) {
		t.Fatalf("first item for an asleep pool: %+v, want a wait that wakes spare", d)
	}
	if d := c.place(newItem("interactive", "tag", soon(), "spare"), nil); !reflect.DeepEqual(d, decision{}) {
		t.Fatalf("second item of the pass: %+v, want a wait, no second wake", d)
	}

	c = snapOf(t, routeConfig)
	c.pools["spare"].poolStatus = asleep
	ready(c, "bulk", 1, "interactive")
	c.pools["bulk"].busy = 1
	if d := c.place(newItem("interactive", "tag", soon(), "bulk", "spare"), nil); !reflect.DeepEqual(d, decision{}) {
		t.Fatalf("a live full pool first in the chain: %+v, want a wait that wakes nothing", d)
	}
}

// TestRouteDeadlineExceeded: an item that no candidate with room can finish before its
// deadline (measured service time) is deadline_exceeded without taking a unit; an
// infeasible pool is passed over for a feasible one; no measurement is feasible.
func TestRouteDeadlineExceeded(t *testing.T) {
	c := snapOf(t, routeConfig)
	ready(c, "fast", 1, "urgent", "interactive")
	ready(c, "bulk", 1, "interactive", "batch")
	c.est[estKey{"fast", "tag", "tagger"}] = time.Second
	deadline := c.now.Add(500 * time.Millisecond)

	// fast is too slow, bulk is full but unmeasured (it may free up in time): wait.
	c.pools["bulk"].busy = 1
	if pool, err := routeIn(c, newItem("interactive", "tag", deadline, "fast", "bulk"), nil); pool != "" || err != nil {
		t.Fatalf("one pool too slow, the other full: %q %v, want a wait", pool, err)
	}
	c.pools["bulk"].busy = 0
	c = nextPass(c)
	if pool := routeOK(t, c, newItem("interactive", "tag", deadline, "fast", "bulk"), nil); pool != "bulk" {
		t.Fatalf("fast too slow, bulk unmeasured: routed to %q, want bulk", pool)
	}

	c = snapOf(t, routeConfig)
	ready(c, "fast", 1, "urgent", "interactive")
	ready(c, "bulk", 1, "interactive", "batch")
	c.est[estKey{"fast", "tag", "tagger"}] = time.Second
	c.est[estKey{"bulk", "tag", "tagger"}] = time.Second
	_, err := routeIn(c, newItem("interactive", "tag", deadline, "fast", "bulk"), nil)
	if codec.CodeOf(err) != codec.CodeDeadlineExceeded {
		t.Fatalf("every pool too slow: %v, want deadline_exceeded", err)
	}
	if busy := c.pools["fast"].busy + c.pools["bulk"].busy; busy != 0 || c.load["cuda:0"]["interactive"] != 0 {
		t.Fatalf("an infeasible item took units: %d in flight, cuda:0 load %v", busy, c.load["cuda:0"])
	}
	// Another op of the same pools has no measurement: it goes.
	if pool := routeOK(t, c, newItem("interactive", "embed", deadline, "fast"), nil); pool != "fast" {
		t.Fatalf("unmeasured op routed to %q, want fast", pool)
	}
}

// TestRouter: a dispatch pass routes on one snapshot, taken when it first routes an
// item (a heartbeat heard before then counts, one heard during the pass waits for the
// next), holds each unit it gives in flights (per pool, and per device and class), and
// wakes a lazy pool that an item waits for.
func TestRouter(t *testing.T) {
	g := testGateway(t, routeConfig)
	f := newFleet(t, g)
	route := passRouter(g, time.Now())
	f.ready("fast", "fast-1", 1, "urgent", "interactive")
	it := newItem("interactive", "tag", soon(), "fast", "bulk")
	if pool, err := route(it, nil); pool != "fast" || err != nil {
		t.Fatalf("routed to %q %v, want fast", pool, err)
	}
	if target := g.d.lc.byID[it.ID].target; target != "fast-1" {
		t.Fatalf("sent to worker %q, want fast-1 (the pool's one direct worker)", target)
	}
	if h := g.d.lc.held(); h.workers["fast-1"]["interactive"] != 1 || h.busy["fast"] != 1 || h.load["cuda:0"]["interactive"] != 1 {
		t.Fatalf("flights hold %v, %v, %v; want fast 1, fast-1 1 and one interactive on cuda:0", h.busy, h.workers, h.load)
	}
	f.ready("bulk", "bulk-1", 1, "interactive")
	if pool, err := route(newItem("interactive", "tag", soon(), "fast", "bulk"), nil); pool != "" || err != nil {
		t.Fatalf("with fast full and bulk heard during the pass: %q %v, want a wait", pool, err)
	}
	if pool, err := passRouter(g, time.Now())(newItem("interactive", "tag", soon(), "fast", "bulk"), nil); pool != "bulk" || err != nil {
		t.Fatalf("next pass: %q %v, want bulk", pool, err)
	}

	s := g.supervisor
	s.bin = "/nonexistent/ortworker" // never a real process: the woken pool fails to start
	s.mu.Lock()
	s.pools["spare"] = &poolProcs{cfg: g.conf().Pools["spare"], procs: []*proc{{pool: "spare"}}, asleep: true}
	s.mu.Unlock()
	if pool, err := passRouter(g, time.Now())(newItem("batch", "tag", soon(), "spare"), nil); pool != "" || err != nil {
		t.Fatalf("lazy pool asleep: %q %v, want a wait", pool, err)
	}
	// The failed start is no event anyone hears (no process, no heartbeat): polled.
	checkFor(t, "the lazy pool woken", 10*time.Second, 5*time.Millisecond, func() error {
		if s.poolState("spare", time.Now()).failed == nil {
			return fmt.Errorf("spare has not failed to start")
		}
		return nil
	})
	_, err := passRouter(g, time.Now())(newItem("batch", "tag", soon(), "spare"), nil)
	if e := asErr(err); e.Code != codec.CodeInternal || !strings.Contains(e.Message, "start worker /nonexistent/ortworker") {
		t.Fatalf("after the woken pool failed to start: %v, want its start error", err)
	}
}

// TestRouterRecordsActivity: flights records when each class was last active on each
// device, for the reservation: a unit held at the pass's time, a waiting latency item on
// the devices of all its pools, a release at its time. A waiting batch item is not
// recorded (its activity reserves nothing), nor a waiting latency item under FIFO.
func TestRouterRecordsActivity(t *testing.T) {
	for _, policy := range []string{"priority", "fifo"} {
		t.Run(policy, func(t *testing.T) {
			g := testGateway(t, strings.Replace(routeConfig, "[security]", fmt.Sprintf("[gateway]\npolicy = %q\n[security]", policy), 1))
			f := newFleet(t, g)
			f.ready("fast", "fast-1", 1, "urgent", "interactive")
			f.ready("bulk", "bulk-1", 1, "interactive", "batch")
			f.ready("spare", "spare-1", 1, "interactive", "batch")
			pass := time.Now().Add(-time.Minute)
			route := passRouter(g, pass)
			it := newItem("interactive", "tag", soon(), "fast")
			if pool, err := route(it, nil); pool != "fast" || err != nil {
				t.Fatalf("routed to %q %v, want fast", pool, err)
			}
			if pool, err := route(newItem("interactive", "tag", soon(), "fast", "spare"), map[string]bool{"spare": true}); pool != "" || err != nil {
				t.Fatalf("fast full, spare reserved: %q %v, want a wait", pool, err)
			}
			if pool, err := route(newItem("batch", "tag", soon(), "bulk"), map[string]bool{"bulk": true}); pool != "" || err != nil {
				t.Fatalf("bulk reserved: %q %v, want a wait", pool, err)
			}
			active := g.d.lc.held().active
			if !active["cuda:0"]["interactive"].Equal(pass) {
				t.Errorf("cuda:0: interactive last active %v, want the pass's time %v", active["cuda:0"]["interactive"], pass)
			}
			if got, queued := active["cpu"]["interactive"], policy == "priority"; got.Equal(pass) != queued {
				t.Errorf("cpu: interactive last active %v; recorded as queued there: %v, want %v", got, got.Equal(pass), queued)
			}
			if got := active["cuda:0"]["batch"]; !got.IsZero() {
				t.Errorf("a waiting batch item recorded as active at %v", got)
			}

			before := time.Now()
			g.d.lc.release(g.d.lc.byID[it.ID], time.Now())
			if active := g.d.lc.held().active; active["cuda:0"]["interactive"].Before(before) {
				t.Errorf("after the release: interactive last active %v, want its release (after %v)", active["cuda:0"]["interactive"], before)
			}
		})
	}
}

// TestSpillGrace: with fast (the chain's first pool) live and full and bulk free, a new
// interactive request waits for fast for spillGrace before it spills to bulk (replies go
// straight to clients, so fast may already be free without the gateway knowing); one that
// has waited that long spills; with relay_replies it spills at once; and an earlier pool
// skipped as infeasible does not hold it.
func TestSpillGrace(t *testing.T) {
	snap := func(toml string) *capacity {
		c := snapOf(t, toml)
		readyWorker(c, "fast", "f1", 1, true, "urgent", "interactive")
		readyWorker(c, "bulk", "b1", 1, true, "interactive", "batch")
		c.take("fast", "interactive")
		c.workers["f1"].busy = map[string]int{"interactive": 1}
		return c
	}
	item := func(age time.Duration) *sched.Item {
		it := newItem("interactive", "tag", soon(), "fast", "bulk")
		it.Value.(*pending).accepted = time.Now().Add(-age)
		return it
	}
	if d := snap(routeConfig).place(item(0), nil); d.pool != "" || d.err != nil {
		t.Fatalf("new request, fast busy: %+v, want a wait", d)
	}
	if d := snap(routeConfig).place(item(2*spillGrace), nil); d.pool != "bulk" {
		t.Fatalf("request waiting %v: %+v, want bulk", 2*spillGrace, d)
	}
	relay := strings.Replace(routeConfig, "[security]", "[gateway]\nrelay_replies = true\n[security]", 1)
	if d := snap(relay).place(item(0), nil); d.pool != "bulk" {
		t.Fatalf("relay_replies, new request: %+v, want bulk at once", d)
	}
	c := snap(routeConfig)
	c.workers["f1"].busy = nil
	c.pools["fast"].busy = 0
	c.est[estKey{"fast", "tag", "tagger"}] = time.Hour // fast cannot finish in time
	if d := c.place(item(0), nil); d.pool != "bulk" {
		t.Fatalf("fast infeasible: %+v, want bulk at once", d)
	}
}

// TestRouteModelDown: a pool whose every live worker failed to load the item's model is
// passed over as if it were not in the chain (the next pool takes the item); a worker on
// which it failed is never picked while another of the pool has it; when it failed on
// every pool of the chain, the item is answered model_unavailable with the load error.
func TestRouteModelDown(t *testing.T) {
	c := snapOf(t, routeConfig)
	loadErr := codec.Errorf(codec.CodeModelUnavailable, "ONNX Runtime refused the model")
	failedTagger := []codec.ModelStatus{{Name: "tagger", State: codec.ModelFailed, Error: loadErr}, {Name: "ccip", State: codec.ModelReady, Loaded: true}}
	c.addLive(health.Worker{HB: codec.Heartbeat{Worker: "fast-a", Pool: "fast", Slots: 2, Classes: []string{"interactive"}, State: codec.StateReady, Direct: true, Models: failedTagger}})
	ready(c, "bulk", 1, "interactive", "batch")
	if pool := routeOK(t, c, newItem("interactive", "tag", soon(), "fast", "bulk"), nil); pool != "bulk" {
		t.Fatalf("tagger failed on fast's only worker: routed to %q, want bulk", pool)
	}
	if pool := routeOK(t, c, newItem("interactive", "embed", soon(), "fast", "bulk"), nil); pool != "fast" {
		t.Fatalf("ccip is ready on fast: routed to %q, want fast", pool)
	}
	// A second worker of fast has the tagger: fast serves it again, on that worker only.
	c = snapOf(t, routeConfig)
	c.addLive(health.Worker{HB: codec.Heartbeat{Worker: "fast-a", Pool: "fast", Slots: 2, Classes: []string{"interactive"}, State: codec.StateReady, Direct: true, Models: failedTagger}})
	c.addLive(health.Worker{HB: codec.Heartbeat{Worker: "fast-b", Pool: "fast", Slots: 1, Classes: []string{"interactive"}, State: codec.StateReady, Direct: true}})
	d := c.place(newItem("interactive", "tag", soon(), "fast"), nil)
	if d.pool != "fast" || d.worker != "fast-b" {
		t.Fatalf("tagger ready on fast-b only: %+v, want fast / fast-b", d)
	}
	// Failed everywhere: model_unavailable, with the load error.
	c = snapOf(t, routeConfig)
	c.addLive(health.Worker{HB: codec.Heartbeat{Worker: "fast-a", Pool: "fast", Slots: 2, Classes: []string{"interactive"}, State: codec.StateReady, Direct: true, Models: failedTagger}})
	_, err := routeIn(c, newItem("interactive", "tag", soon(), "fast"), nil)
	if e := asErr(err); e.Code != codec.CodeModelUnavailable || !strings.Contains(e.Message, "refused") {
		t.Fatalf("tagger failed on the whole chain: %v, want model_unavailable with the load error", err)
	}
}
