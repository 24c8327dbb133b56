package gateway

import (
	"cmp"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/ortbus/ortbus/codec"
	"github.com/ortbus/ortbus/config"
	"github.com/ortbus/ortbus/subjects"
)

// Compute gates: the processes of gated leases (`ortbus lease --gate`) pause while work
// of the device's gating class runs there, so that an LLM decoding token after token does
// not stretch urgent work's latency. The gateway decides one gate per device and
// publishes it; every wrapper of a gated lease on that device, on any host, follows it
// within its own safety limits (internal/gate: max-pause, min-share, expiry, bus loss,
// exit).
//
//  1. A device's gate is closed while work of its gating class ([devices.NAME]
//     gate_class, default urgent) or of a class of higher priority is queued for the
//     device (a pool on it among its candidates) or running on it, and a gated lease is
//     held there; else it is open. Only work a pause can cover closes it: each request
//     counts its measured service time on its pool (estimator; unknown: gateCover), and
//     the device's gate closes when the work so counted adds up to gateCover or more. A
//     pause lands a gate tick, a publish and a signal after the work arrives, so work
//     shorter than that is done before it: a VAD frame of a few milliseconds every 32 ms
//     would only stutter the tenant (each pause is followed by a minimum run,
//     internal/gate rule 3, during which the next work that a pause could cover finds the
//     tenant unpausable), while a camera frame of 100 ms, or a backlog of frames, closes
//     the gate.
//  2. The gateway publishes the gate of each device with a gated or a pressed lease on
//     ortbus.gate.<gateway>.<device> at once when it changes and every gateRefresh
//     while unchanged, with a seq that only grows and a ttl of gateTTL: a receiver lets
//     a state hold only that long, so a gateway that dies (kill -9) or a bus that goes
//     away leaves no tenant paused past it.
//  3. A gate also lists the tags (codec.LeaseTag) of the device's pressed reclaimable
//     leases (lease.go, rule 6): their holders run their on-pressure hooks.
//  4. status shows each gate: closed (paused) now, and the share of the last minute it
//     was closed.
type gates struct {
	mu  sync.Mutex
	by  map[string]*gateState // by device
	seq uint64

	// What the gates need of the rest of the gateway, given at construction (newGates).
	id      string                                   // the gateway's id, in each gate published
	held    func(now time.Time) map[string]gatedHere // the leases' (lease.go)
	demand  gateDemandFunc                           // the dispatch loop's (gateDemand)
	publish func(subject string, gate codec.Gate)    // on the bus
}

// gateDemandFunc asks the dispatch loop for gateDemand (ok false: the loop has stopped).
type gateDemandFunc func(classes map[string]string, gating []string, prio func(string) (int, bool)) (demand map[string]bool, ok bool)

// gateState is one device's gate as last published.
type gateState struct {
	class   string
	closed  bool
	tags    []string
	tenants int
	pub     time.Time  // last published
	spans   [][2]int64 // closed spans (unix ms) within the last minute; an open one ends at 0
	// closedMS is the time it was closed in its spans that ended, since it came to be
	// (the device's first gated or pressed lease of a run of them): with the open span,
	// its total pause time.
	closedMS int64
	last     codec.Gate // as published
}

// closedIn is the time (ms) st was closed within the last gateHistory before now; it
// drops the spans older than that.
func (st *gateState) closedIn(now time.Time) int64 {
	from := now.Add(-gateHistory).UnixMilli()
	var closed int64
	keep := st.spans[:0]
	for _, s := range st.spans {
		end := s[1]
		if end == 0 {
			end = now.UnixMilli()
		}
		if end <= from {
			continue
		}
		keep = append(keep, s)
		closed += end - max(s[0], from)
	}
	st.spans = keep
	return closed
}

// The gates' timing: decided every gateTick, published on a change and at least every
// gateRefresh, each state holding gateTTL (rule 2).
const (
	gateTick    = 20 * time.Millisecond
	gateRefresh = 100 * time.Millisecond
	gateTTL     = 3 * gateRefresh
	gateHistory = time.Minute
	// gateCover is the least work that closes a gate (rule 1): a pause lands up to a
	// gateTick after the work arrives, plus a publish and a signal.
	gateCover = gateTick
)

// newGates are the gates of gateway id: held are the gated leases, demand asks the
// dispatch loop, publish sends a gate on the bus.
func newGates(id string, held func(time.Time) map[string]gatedHere, demand gateDemandFunc, publish func(string, codec.Gate)) *gates {
	// The seq starts at the clock, so that a restarted gateway's states come after its
	// predecessor's.
	return &gates{by: map[string]*gateState{}, seq: uint64(time.Now().UnixNano()), id: id, held: held, demand: demand, publish: publish}
}

// gateClass is device's gating class in c (rule 1).
func gateClass(c *config.Config, device string) string {
	if d, ok := c.Devices[device]; ok && d.GateClass != "" {
		return d.GateClass
	}
	return subjects.ClassUrgent
}

// gateDemand reports, for each device of classes (device -> gating class), whether work
// of that class or a higher one, queued for it or running on it, is enough for a pause
// to cover (rule 1). prio is a class's priority (ok false: unknown); gating lists every
// class that gates some device; est is a request's measured service time on a pool (0:
// not measured).
func (lc *lifecycle) gateDemand(classes map[string]string, gating []string, prio func(string) (int, bool), est func(pool string, p *pending) time.Duration) map[string]bool {
	gates := func(class, gc string) bool {
		p, ok := prio(class)
		q, ok2 := prio(gc)
		return ok && ok2 && p <= q
	}
	// Look at the requests only when a class that gates has some running or waiting.
	any := false
	for device, gc := range classes {
		for class, n := range lc.load[device] {
			if n > 0 && gates(class, gc) {
				any = true
			}
		}
	}
	for _, class := range gating {
		if lc.queues.Len(class) > 0 {
			any = true
		}
	}
	out := map[string]bool{}
	if !any {
		return out
	}
	gatingClass := map[string]bool{}
	for _, class := range gating {
		gatingClass[class] = true
	}
	work := map[string]time.Duration{}
	count := func(d, pool string, p *pending) {
		gc, ok := classes[d]
		if !ok || !gates(p.class, gc) {
			return
		}
		w := est(pool, p)
		if w <= 0 {
			w = gateCover // not measured yet: as if a pause covered it
		}
		work[d] += w
	}
	for _, f := range lc.byID {
		if !gatingClass[f.p.class] {
			continue // batch: gates nothing (its candidates are not worth working out)
		}
		switch {
		case f.out():
			count(f.device, f.pool, f.p)
		case f.state == stQueued:
			// Once per device among its candidates (the first of its pools there).
			seen := map[string]bool{}
			for _, pool := range lc.env.retryPools(f.p) {
				if d := lc.env.device(pool); !seen[d] {
					seen[d] = true
					count(d, pool, f.p)
				}
			}
		}
	}
	for d, w := range work {
		if w >= gateCover {
			out[d] = true
		}
	}
	return out
}

// start decides and publishes the gates every gateTick, each round under the
// configuration then in force (conf), until the returned stop is called.
func (gs *gates) start(conf func() *config.Config) (stop func()) {
	return every(gateTick, func(now time.Time) { gs.decide(now, conf()) })
}

// decide is one round of rules 1 to 3, under cfg alone.
func (gs *gates) decide(now time.Time, cfg *config.Config) {
	held := gs.held(leaseNow())
	gs.mu.Lock()
	for d := range gs.by {
		if _, ok := held[d]; !ok {
			delete(gs.by, d) // no gated or pressed lease there any more
		}
	}
	gs.mu.Unlock()
	if len(held) == 0 {
		return
	}
	classes := map[string]string{}
	for d, h := range held {
		if h.gated > 0 {
			classes[d] = gateClass(cfg, d)
		}
	}
	var demand map[string]bool
	if len(classes) > 0 {
		prio := func(class string) (int, bool) {
			if c := cfg.Classes[class]; c != nil {
				return c.Priority, true
			}
			return 0, false
		}
		var gating []string
		for name, c := range cfg.Classes {
			for _, gc := range classes {
				if q, ok := prio(gc); ok && c.Priority <= q {
					gating = append(gating, name)
					break
				}
			}
		}
		var ok bool
		if demand, ok = gs.demand(classes, gating, prio); !ok {
			return // the loop has stopped: the gateway is going
		}
	}
	type out struct {
		subject string
		gate    codec.Gate
	}
	var pubs []out
	gs.mu.Lock()
	for _, d := range slices.Sorted(maps.Keys(held)) {
		h := held[d]
		st := gs.by[d]
		if st == nil {
			st = &gateState{}
			gs.by[d] = st
		}
		closed := demand[d]
		changed := closed != st.closed || !slices.Equal(h.tags, st.tags) || st.pub.IsZero()
		if closed != st.closed {
			if closed {
				st.closedIn(now) // the spans past the minute go
				st.spans = append(st.spans, [2]int64{now.UnixMilli(), 0})
			} else if n := len(st.spans); n > 0 {
				st.spans[n-1][1] = now.UnixMilli()
				st.closedMS += st.spans[n-1][1] - st.spans[n-1][0]
			}
		}
		st.class, st.closed, st.tags, st.tenants = cmp.Or(classes[d], gateClass(cfg, d)), closed, h.tags, h.gated
		if !changed && now.Sub(st.pub) < gateRefresh {
			continue
		}
		subj, err := subjects.Gate(gs.id, d)
		if err != nil {
			continue // a device name that is no subject token: never gated
		}
		gs.seq++
		st.pub = now
		st.last = codec.Gate{Gateway: gs.id, Device: d, Seq: gs.seq, Closed: closed, Class: st.class, TTLMS: gateTTL.Milliseconds(), Reclaim: h.tags}
		pubs = append(pubs, out{subj, st.last})
	}
	gs.mu.Unlock()
	for _, p := range pubs {
		gs.publish(p.subject, p.gate)
	}
}

// closed is the devices whose gate is closed now (the sharing policy holds batch there:
// policy.go).
func (gs *gates) closed() map[string]bool {
	gs.mu.Lock()
	defer gs.mu.Unlock()
	var out map[string]bool
	for d, st := range gs.by {
		if st.closed {
			if out == nil {
				out = map[string]bool{}
			}
			out[d] = true
		}
	}
	return out
}

// list is every gate for status (rule 4).
func (gs *gates) list(now time.Time) []codec.GateStatus {
	gs.mu.Lock()
	defer gs.mu.Unlock()
	var out []codec.GateStatus
	for _, d := range slices.Sorted(maps.Keys(gs.by)) {
		st := gs.by[d]
		closed := st.closedIn(now)
		total := st.closedMS
		if n := len(st.spans); st.closed && n > 0 && st.spans[n-1][1] == 0 {
			total += now.UnixMilli() - st.spans[n-1][0]
		}
		out = append(out, codec.GateStatus{Device: d, Class: st.class, Paused: st.closed, PausedShare1m: float64(closed) / float64(gateHistory.Milliseconds()),
			PausedTotalMS: total, Seq: st.last.Seq, Tenants: st.tenants})
	}
	return out
}
