package health

import (
	"log/slog"
	"sort"
	"sync"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/ortbus/ortbus/codec"
	"github.com/ortbus/ortbus/internal/guard"
	"github.com/ortbus/ortbus/subjects"
)

// Worker is what a tracker knows of one worker.
type Worker struct {
	HB   codec.Heartbeat
	Seen time.Time // when its last heartbeat arrived
	Dead bool
	// Why is set when Dead: "heartbeat stopped", or the supervisor's exit reason.
	Why string
}

// Live reports whether the worker may take new work.
func (w *Worker) Live() bool { return !w.Dead && w.HB.State == codec.StateReady }

// Listener is what a tracker tells, and asks, the party it works for (the gateway). Its
// methods are called outside the tracker's lock.
type Listener interface {
	// Dead: w is judged dead (once per death).
	Dead(w Worker)
	// Changed: after every heartbeat or death (capacity may have changed).
	Changed()
	// Running reports whether a silent worker's process is known to be running (a local
	// process that is neither stopped nor gone): such a worker is likely starved of CPU
	// rather than dead, and is given MissCount more intervals before the verdict. A
	// stopped, hung-in-the-kernel-stop or remote worker (false) gets the normal bound.
	Running(worker string) bool
	// Dropped: a heartbeat was dropped, for a fixed reason.
	Dropped(reason string)
}

// Tracker follows every worker's heartbeats on ortbus.hb.>. A worker whose heartbeat is
// silent for MissCount of its own intervals is judged dead and its Listener told once;
// the supervisor of a local worker can also report its death at once with MarkDead.
// Silence while the tracker's own connection is down (a NATS restart) is not counted.
// A dead worker that beats again comes back as live (unless the beat says it is draining).
type Tracker struct {
	// MissCount is how many intervals of silence mean death (default 3).
	MissCount int
	// Listener, if set, is told of deaths, changes and drops, and asked whether a silent
	// worker is running.
	Listener Listener
	// Pools, when set, are the pools tracked: a heartbeat of any other pool is dropped.
	// Set it before Start; SetPools changes it afterwards.
	Pools map[string]bool
	// MaxPerPool bounds the workers tracked per pool (default DefaultMaxPerPool): a
	// heartbeat of a new worker id beyond it is dropped, so forged ids cannot grow the
	// tracker without bound.
	MaxPerPool int
	// Log receives panics recovered in the tracker's callbacks.
	Log *slog.Logger

	mu      sync.Mutex
	workers map[string]*Worker
	nc      *nats.Conn
	// offline is the last time the tracker's own connection was seen down: silence
	// before it proves nothing (no heartbeat could arrive), so it is counted from then.
	offline time.Time
	sub     *nats.Subscription
	stop    chan struct{}
	once    sync.Once
}

// Start subscribes to heartbeats and starts judging silence.
func (t *Tracker) Start(nc *nats.Conn) error {
	t.workers = map[string]*Worker{}
	t.nc = nc
	t.stop = make(chan struct{})
	if t.MissCount <= 0 {
		t.MissCount = 3
	}
	if t.MaxPerPool <= 0 {
		t.MaxPerPool = DefaultMaxPerPool
	}
	sub, err := nc.Subscribe(subjects.HBAll, guard.Msg(t.Log, "heartbeat", nc, nil, func(m *nats.Msg) {
		var hb codec.Heartbeat
		if Decode(m, &hb) != nil {
			t.drop("malformed")
			return
		}
		if reason := t.check(m.Subject, &hb); reason != "" {
			t.drop(reason)
			return
		}
		t.beat(hb)
	}))
	if err != nil {
		return err
	}
	t.sub = sub
	go t.judge()
	return nil
}

// SetPools replaces the pools tracked (a reload of the gateway's configuration).
func (t *Tracker) SetPools(pools map[string]bool) {
	t.mu.Lock()
	t.Pools = pools
	t.mu.Unlock()
}

// tracks reports whether pool's heartbeats are taken.
func (t *Tracker) tracks(pool string) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.Pools == nil || t.Pools[pool]
}

// Stop ends tracking.
func (t *Tracker) Stop() {
	t.once.Do(func() {
		close(t.stop)
		if t.sub != nil {
			t.sub.Unsubscribe()
		}
	})
}

// Silent is the one rule for judging a beating party dead, for workers (Tracker) and
// peer gateways (failover) alike: silent when more than missCount intervals have passed
// since it was last heard (since). An interval of 0 or less counts as one second.
func Silent(now, since time.Time, interval time.Duration, missCount int) bool {
	if interval <= 0 {
		interval = time.Second
	}
	return now.Sub(since) > time.Duration(missCount)*interval
}

// DefaultMaxPerPool is the default bound on workers tracked per pool.
const DefaultMaxPerPool = 256

// Limits of a heartbeat's numbers and sizes; a beat outside them is dropped as forged or
// broken. The sizes keep what the tracker holds per worker (and what status repeats of
// it) small, whatever a forged beat carries.
const (
	maxSlots     = 4096
	maxInterval  = time.Hour
	maxText      = 1024                   // host, runtime, library, ep, device, state, adapter, adapter_mismatch
	maxList      = codec.MaxHeartbeatList // classes, models, queued and running classes
	maxHeld      = 65536                  // request ids held
	maxErrorSize = 16384                  // the encoded error of a failed worker, or of a failed model; a model's warm-up error
	// maxBytes bounds each memory figure (rss_bytes, device_bytes, a model's peak_bytes and
	// per_item_bytes): admission sums them over a device's workers, and a forged figure
	// must not overflow that sum into room that is not there.
	maxBytes = int64(1) << 42 // 4 TiB
)

// sizesOK checks the heartbeat's strings, lists and error against the limits above.
func sizesOK(hb *codec.Heartbeat) bool {
	for _, s := range []string{hb.Host, hb.Runtime, hb.Library, hb.EP, hb.Device, hb.State, hb.DeviceSource, hb.Adapter, hb.AdapterMismatch} {
		if len(s) > maxText {
			return false
		}
	}
	if len(hb.Classes) > maxList || len(hb.Models) > maxList || len(hb.Queued) > maxList || len(hb.Running) > maxList || len(hb.Held) > maxHeld {
		return false
	}
	for _, c := range hb.Classes {
		if len(c) > codec.MaxIDLen {
			return false
		}
	}
	for _, m := range hb.Models {
		if len(m.Name) > codec.MaxIDLen || len(m.Kind) > codec.MaxIDLen || len(m.PeakSource) > codec.MaxIDLen || len(m.State) > codec.MaxIDLen || len(m.WarmupError) > maxErrorSize {
			return false
		}
		if len(m.NodesByEP) > codec.MaxNodesByEP {
			return false
		}
		for ep := range m.NodesByEP {
			if len(ep) > codec.MaxIDLen {
				return false
			}
		}
		if m.Error != nil {
			if b, err := codec.Marshal(m.Error); err != nil || len(b) > maxErrorSize {
				return false
			}
		}
	}
	for _, id := range hb.Held {
		if len(id) > codec.MaxIDLen {
			return false
		}
	}
	if hb.Error != nil {
		if b, err := codec.Marshal(hb.Error); err != nil || len(b) > maxErrorSize {
			return false
		}
	}
	return true
}

// bytesOK checks the heartbeat's memory figures against 0..maxBytes.
func bytesOK(hb *codec.Heartbeat) bool {
	in := func(b int64) bool { return b >= 0 && b <= maxBytes }
	if !in(hb.RSSBytes) || !in(hb.DeviceBytes) {
		return false
	}
	for _, m := range hb.Models {
		if !in(m.PeakBytes) || !in(m.PerItemBytes) {
			return false
		}
		for _, n := range m.NodesByEP {
			if n < 0 || n > codec.MaxNodes {
				return false
			}
		}
	}
	return true
}

// check returns why a heartbeat must be dropped, or "": its body must name the pool and
// worker of its subject (ortbus.hb.<pool>.<worker>), a tracked pool, a known state, and
// numbers within bounds.
func (t *Tracker) check(subject string, hb *codec.Heartbeat) string {
	ps, err := subjects.Parse(subject)
	switch {
	case err != nil || ps.Kind != subjects.KindHeartbeat:
		return "subject"
	case hb.Pool != ps.Pool || hb.Worker != ps.Worker:
		return "identity"
	case !t.tracks(hb.Pool):
		return "pool"
	case codec.CheckID("worker", hb.Worker) != nil:
		return "worker_id"
	}
	switch hb.State {
	case codec.StateStarting, codec.StateReady, codec.StateDraining, codec.StateFailed:
	default:
		return "state"
	}
	if hb.Slots < 0 || hb.Slots > maxSlots || hb.IntervalMS < 0 || hb.IntervalMS > maxInterval.Milliseconds() || !bytesOK(hb) {
		return "range"
	}
	if !sizesOK(hb) {
		return "size"
	}
	return ""
}

func (t *Tracker) drop(reason string) {
	if t.Listener != nil {
		t.Listener.Dropped(reason)
	}
}

func (t *Tracker) beat(hb codec.Heartbeat) {
	t.mu.Lock()
	w, ok := t.workers[hb.Worker]
	if !ok {
		n := 0
		for _, x := range t.workers {
			if x.HB.Pool == hb.Pool {
				n++
			}
		}
		if n >= t.MaxPerPool {
			t.mu.Unlock()
			t.drop("too_many_workers")
			return
		}
		w = &Worker{}
		t.workers[hb.Worker] = w
	}
	if ok && w.HB.Pool != hb.Pool {
		t.mu.Unlock() // one worker id cannot move between pools
		t.drop("identity")
		return
	}
	if ok && !w.Dead && hb.Seq != 0 && hb.Seq < w.HB.Seq && hb.PID == w.HB.PID {
		t.mu.Unlock() // an old, reordered beat
		return
	}
	w.HB, w.Seen = hb, time.Now()
	// A dead worker that beats again is live again — but not on a draining beat: that is
	// a worker's last word before it exits, which may arrive after its exit was seen
	// (the supervisor's MarkDead), and must not bring back, for memory admission, a
	// process that is gone.
	if w.Dead && hb.State != codec.StateFailed && hb.State != codec.StateDraining {
		w.Dead, w.Why = false, ""
	}
	t.mu.Unlock()
	t.changed()
}

// judge checks for silent workers often enough that a death is seen well within a tenth
// of an interval of its deadline.
func (t *Tracker) judge() {
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-t.stop:
			return
		case now := <-tick.C:
			t.judgeAt(now)
		}
	}
}

// judgeAt is one judging pass.
func (t *Tracker) judgeAt(now time.Time) {
	defer guard.Recover(t.Log, "heartbeat judge", nil)
	if !t.nc.IsConnected() {
		// Disconnected from NATS (a server restart): every worker is silent to
		// us, none is judged until we hear again.
		t.mu.Lock()
		t.offline = now
		t.mu.Unlock()
		return
	}
	// Silent workers past the bound; those past it but within twice it are
	// spared if their process is known to be running (checked outside the lock).
	var silent, spare []string
	t.mu.Lock()
	for id, w := range t.workers {
		if w.Dead || w.HB.State == codec.StateFailed {
			continue
		}
		since := w.Seen
		if t.offline.After(since) {
			since = t.offline
		}
		iv := time.Duration(w.HB.IntervalMS) * time.Millisecond
		switch {
		case Silent(now, since, iv, 2*t.MissCount) || (t.Listener == nil && Silent(now, since, iv, t.MissCount)):
			silent = append(silent, id)
		case Silent(now, since, iv, t.MissCount):
			spare = append(spare, id)
		}
	}
	t.mu.Unlock()
	for _, id := range spare {
		if !t.Listener.Running(id) {
			silent = append(silent, id)
		}
	}
	var dead []Worker
	t.mu.Lock()
	for _, id := range silent {
		if w, ok := t.workers[id]; ok && !w.Dead && !w.Seen.After(now) {
			w.Dead, w.Why = true, "heartbeat stopped"
			dead = append(dead, *w)
		}
	}
	t.mu.Unlock()
	for _, w := range dead {
		t.died(w)
	}
}

// MarkDead records that worker id of pool, on host, is gone (its process exited), at
// once. A worker that died before its first heartbeat is recorded with its pool and host
// all the same, so that status says whose it was.
func (t *Tracker) MarkDead(id, pool, host, why string) {
	t.mu.Lock()
	w, ok := t.workers[id]
	if !ok || w.Dead {
		if !ok {
			t.workers[id] = &Worker{HB: codec.Heartbeat{Worker: id, Pool: pool, Host: host}, Dead: true, Why: why}
		}
		t.mu.Unlock()
		return
	}
	w.Dead, w.Why = true, why
	c := *w
	t.mu.Unlock()
	t.died(c)
}

// Forget removes a worker from the listing (a replaced or stopped one).
func (t *Tracker) Forget(id string) {
	t.mu.Lock()
	delete(t.workers, id)
	t.mu.Unlock()
}

func (t *Tracker) died(w Worker) {
	if t.Listener != nil {
		t.Listener.Dead(w)
	}
	t.changed()
}

func (t *Tracker) changed() {
	if t.Listener != nil {
		t.Listener.Changed()
	}
}

// Get returns one worker.
func (t *Tracker) Get(id string) (Worker, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	w, ok := t.workers[id]
	if !ok {
		return Worker{}, false
	}
	return *w, true
}

// Workers returns every known worker, sorted by pool and id.
func (t *Tracker) Workers() []Worker {
	t.mu.Lock()
	out := make([]Worker, 0, len(t.workers))
	for _, w := range t.workers {
		out = append(out, *w)
	}
	t.mu.Unlock()
	sort.Slice(out, func(i, j int) bool {
		if out[i].HB.Pool != out[j].HB.Pool {
			return out[i].HB.Pool < out[j].HB.Pool
		}
		return out[i].HB.Worker < out[j].HB.Worker
	})
	return out
}

// Live returns the live workers of a pool.
func (t *Tracker) Live(pool string) []Worker {
	var out []Worker
	for _, w := range t.Workers() {
		if w.HB.Pool == pool && w.Live() {
			out = append(out, w)
		}
	}
	return out
}

// HasLive reports whether a pool has a live worker, without copying the listing.
func (t *Tracker) HasLive(pool string) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, w := range t.workers {
		if w.HB.Pool == pool && w.Live() {
			return true
		}
	}
	return false
}
