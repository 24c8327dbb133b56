package gateway

import (
	"bufio"
	"cmp"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/procfs"

	"github.com/ortbus/ortbus/codec"
	"github.com/ortbus/ortbus/config"
	"github.com/ortbus/ortbus/health"
	"github.com/ortbus/ortbus/natsconn"
)

// supervisor runs the worker processes of local pools: spawned once (never per request),
// restarted with exponential backoff when they die, given up on when a pool crash-loops
// (CrashLoopCount deaths within CrashLoopWindow), and stopped cleanly at shutdown.
//
// It sees the rest of the gateway only through what it is given: the configuration, the
// heartbeat tracker (to learn a worker's measured memory, report a death, forget a
// replaced worker) and memoryAdmission.
type supervisor struct {
	// cfg is the configuration in force (replaced whole by apply, never changed in place).
	cfg     atomic.Pointer[config.Config]
	tracker workerView
	mem     memoryAdmission
	// idle reports whether a pool has nothing in flight and nothing queued (asked of the
	// gateway's loop and queues); nil: no pool is idle (no eviction).
	idle func(pool string) bool
	bin  string
	url  string
	// gateway is this gateway's id: part of every worker id it gives (WorkerID).
	gateway string
	host    string // this host's name: where its workers run
	log     *slog.Logger
	mu      sync.Mutex
	pools   map[string]*poolProcs
	byID    map[string]*proc
	closed  bool
	started time.Time
	wg      sync.WaitGroup

	// controlKey is the key from which each worker's control key is derived
	// (codec.WorkerKey, given at spawn: config.ControlKeyEnv); the load and unload verbs the
	// gateway sends a worker are signed with that worker's, so it takes them from the
	// gateway alone.
	controlKey []byte
	// lastSent is the send time (unix ms) of the last control body signed: each is later
	// than the one before (controlSent), as a worker takes only later ones.
	lastSent atomic.Int64
	// request sends a control body to a worker and waits for its answer (the gateway's
	// NATS connection: RequestWithContext, given to newSupervisor): the model verbs of a
	// change in place (modelVerb).
	request func(ctx context.Context, subj string, data []byte) (*nats.Msg, error)
}

type poolProcs struct {
	cfg          *config.Pool
	procs        []*proc
	deaths       []time.Time
	crashLooping bool
	failed       *codec.Error // a start-up failure that a restart cannot fix (runtime_missing, ...)
	// asleep: a lazy_load pool not started yet, or one stopped after keep_alive of
	// idleness (sleep); wake starts it on its next request.
	asleep bool
	// lastPeak is what the pool's workers had admitted when sleep stopped them.
	lastPeak int64
	// skip are the models a worker of the pool died loading (a native crash: it printed
	// "loading" for the model and exited before it was ready), and why. The pool's
	// workers start without them from then on (config.SkipModelsEnv), so one crashing
	// model cannot crash-loop the pool: it is failed, and the others serve.
	skip map[string]string
}

type proc struct {
	pool     string
	slot     int
	gen      int
	id       string
	cmd      *exec.Cmd
	started  time.Time
	ready    bool
	restarts int
	lastExit string
	settled  chan struct{} // closed when ready or failed
	exited   chan struct{}
	// stopping: sleep stopped this process; its exit is no death and is not restarted.
	stopping bool
	// loading is the model the process said it is loading (its last "loading" event
	// before "ready").
	loading string
}

// memoryAdmission is the gateway's memory admission as the supervisor uses it (see
// admission.go): how much of a device's budget is left for a worker, and the refusal of a
// pool that does not fit.
type memoryAdmission interface {
	remaining(device, pool, except string) (int64, bool)
	admissionError(device, pool string, need int64) *codec.Error
}

// gatewayView is what the supervisor asks of its gateway: memory admission, and whether
// a pool is idle (nothing in flight, nothing queued for it).
// workerView is what the supervisor asks of the heartbeat tracker (health.Tracker).
type workerView interface {
	Get(id string) (health.Worker, bool)
	Live(pool string) []health.Worker
	MarkDead(id, pool, host, why string)
	Forget(id string)
}

type gatewayView interface {
	memoryAdmission
	poolIdle(pool string) bool
}

// newSupervisor makes the supervisor of the gateway gw with id gateway (part of every
// worker id it gives: WorkerID), whose control requests go by request (the gateway's
// connection). Without gw (unit tests) nothing is admitted by memory and no pool is idle.
func newSupervisor(cfg *config.Config, tracker workerView, gw gatewayView, log *slog.Logger, gateway, bin, url string,
	request func(ctx context.Context, subj string, data []byte) (*nats.Msg, error)) *supervisor {
	host, _ := os.Hostname()
	s := &supervisor{tracker: tracker, bin: bin, url: url, log: log, gateway: cmp.Or(gateway, "gateway"), host: host, request: request,
		pools: map[string]*poolProcs{}, byID: map[string]*proc{}, started: time.Now(), controlKey: make([]byte, 32)}
	rand.Read(s.controlKey) // never fails (crypto/rand, Go 1.24 on)
	s.cfg.Store(cfg)
	if gw != nil {
		s.mem, s.idle = gw, gw.poolIdle
	}
	return s
}

// conf is the configuration in force.
func (s *supervisor) conf() *config.Config { return s.cfg.Load() }

// WorkerID is the id a gateway gives the worker it supervises in slot of pool, after gen
// restarts: <pool>-<slot>@<gateway>, and <pool>-<slot>-r<gen>@<gateway> once restarted.
// The gateway's id makes the workers of two gateways unique on one bus even when their
// pools have the same name (gateway ids are unique on a bus: their claims and beats are
// addressed by them). Only slot digits and "-r" stand between the pool and the '@', so
// two ids of one pool and gateway differ by slot or generation alone.
//
// A worker id is 1 to 128 printable ASCII characters without ' ', '.', '*', '>'
// (codec.CheckID). When the plain form breaks that — a pool or gateway name outside
// printable ASCII, or the two together too long — each name keeps its printable ASCII
// characters (others become '_'), both are cut to fit, and "~" and 12 hex digits of a
// SHA-256 of the exact pool and gateway names end the id:
// <pool'>-<slot>[-r<gen>]@<gateway'>~<hash>.
func WorkerID(pool string, slot, gen int, gateway string) string {
	mid := "-" + strconv.Itoa(slot)
	if gen > 0 {
		mid += "-r" + strconv.Itoa(gen)
	}
	if id := pool + mid + "@" + gateway; codec.CheckID("worker", id) == nil {
		return id
	}
	sum := sha256.Sum256([]byte(pool + "\x00" + gateway))
	tail := "~" + hex.EncodeToString(sum[:6])
	p, g := asciiName(pool), asciiName(gateway)
	room := codec.MaxIDLen - len(mid) - len("@") - len(tail)
	// The pool keeps at least half the room (more when the gateway's name is short).
	keep := min(len(p), max(room/2, room-len(g)))
	p = p[:keep]
	g = g[:min(len(g), room-keep)]
	return p + mid + "@" + g + tail
}

// asciiName is s with every byte that a worker id cannot hold turned into '_'.
func asciiName(s string) string {
	b := []byte(s)
	for i, c := range b {
		if !codec.IDByte(c) {
			b[i] = '_'
		}
	}
	return string(b)
}

// start spawns every local pool's workers and returns a channel closed once each of them
// is ready or has failed. Workers that share a device start one after another, so each
// is told (ORTBUS_MEM_BUDGET) how much of the device's memory budget the ones before it
// left, as their heartbeats report it. A lazy_load pool is left asleep until wake.
func (s *supervisor) start() <-chan struct{} {
	byDevice := map[string][]*proc{}
	var devicesInOrder []string
	// Pools are admitted in class-priority order (the pool's highest class first), then
	// in file order: the urgent pool gets its memory before the batch pool takes it.
	names := s.conf().PoolNames()
	slices.SortStableFunc(names, func(a, b string) int { return cmp.Compare(s.conf().PoolPriority(a), s.conf().PoolPriority(b)) })
	for _, name := range names {
		pc := s.conf().Pools[name]
		if !pc.IsLocal() {
			continue
		}
		pp := &poolProcs{cfg: pc, asleep: pc.LazyLoad}
		s.pools[name] = pp
		for i := 0; i < pc.Workers; i++ {
			p := &proc{pool: name, slot: i}
			pp.procs = append(pp.procs, p)
			if pp.asleep {
				continue
			}
			if _, seen := byDevice[pc.Device]; !seen {
				devicesInOrder = append(devicesInOrder, pc.Device)
			}
			byDevice[pc.Device] = append(byDevice[pc.Device], p)
		}
	}
	all := make(chan struct{})
	var wg sync.WaitGroup
	for _, d := range devicesInOrder {
		wg.Add(1)
		go func(procs []*proc) {
			defer wg.Done()
			for _, p := range procs {
				s.spawn(p)
				s.mu.Lock()
				settled := p.settled
				s.mu.Unlock()
				<-settled
				s.waitHeartbeat(p)
			}
		}(byDevice[d])
	}
	go func() { wg.Wait(); close(all) }()
	return all
}

// wake starts a lazy_load pool that is still asleep, its workers one after another as
// start does; for any other pool it does nothing. The router calls it when a request
// finds the pool without live workers, so the first request waits for the start (the
// wait is in its reply's timing.queue_us).
func (s *supervisor) wake(pool string) {
	s.mu.Lock()
	pp, ok := s.pools[pool]
	if !ok || !pp.asleep || s.closed {
		s.mu.Unlock()
		return
	}
	pp.asleep = false
	procs := append([]*proc(nil), pp.procs...)
	exits := map[*proc]chan struct{}{}
	for _, p := range procs {
		if p.id != "" { // stopped by sleep: its next process gets a new id
			exits[p] = p.exited
		}
	}
	s.mu.Unlock()
	s.log.Info("starting a sleeping pool for a request", "pool", pool, "workers", len(procs))
	go func() {
		for _, ex := range s.evict(pool) {
			<-ex // the evicted workers are gone, and their memory with their heartbeats
		}
		for _, p := range procs {
			if ex := exits[p]; ex != nil {
				<-ex // the process sleep stopped has exited: one process per slot
				s.mu.Lock()
				old := p.id
				p.gen++
				s.mu.Unlock()
				s.tracker.Forget(old)
			}
			s.spawn(p)
			s.mu.Lock()
			settled := p.settled
			s.mu.Unlock()
			if settled != nil {
				<-settled
			}
			s.waitHeartbeat(p)
		}
	}()
}

// sleep stops the workers of a local pool that has been idle for its keep_alive (or is
// evicted): they drain and exit (SIGTERM), their memory leaves the admission with their
// heartbeats, and the pool is asleep: its next request starts it again (wake), as for
// lazy_load. A pool that failed, crash-loops or is already asleep is left alone. It
// returns the workers it stopped.
func (s *supervisor) sleep(pool string) []*proc {
	s.mu.Lock()
	pp, ok := s.pools[pool]
	if !ok || pp.asleep || s.closed || pp.failed != nil || pp.crashLooping {
		s.mu.Unlock()
		return nil
	}
	pp.asleep = true
	var running []*proc
	var peak int64
	for _, p := range pp.procs {
		if p.cmd != nil && p.cmd.Process != nil && !isClosed(p.exited) {
			p.stopping = true
			running = append(running, p)
			if w, ok := s.tracker.Get(p.id); ok {
				for _, m := range w.HB.Models {
					peak += m.PeakBytes
				}
			}
		}
	}
	if peak > 0 {
		pp.lastPeak = peak
	}
	s.mu.Unlock()
	s.log.Info("stopping an idle pool", "pool", pool, "keep_alive", pp.cfg.KeepAlive)
	for _, p := range running {
		p.cmd.Process.Signal(syscall.SIGTERM)
	}
	return running
}

// sleepIdle puts to sleep the local pools of cfg (the gateway's configuration in force)
// with a keep_alive that have had nothing in flight and nothing queued for them for that
// long (sleep). idleSince says since when a pool has had neither (false: it has some); it
// runs on the dispatch loop, which knows.
func (s *supervisor) sleepIdle(cfg *config.Config, now time.Time, idleSince func(pool string) (time.Time, bool)) {
	for _, name := range cfg.PoolNames() {
		pc := cfg.Pools[name]
		keep, unload := pc.Idle()
		if !unload || !pc.IsLocal() {
			continue
		}
		since, idle := idleSince(name)
		if !idle || now.Sub(since) < keep {
			continue
		}
		s.sleep(name)
	}
}

// need is what a sleeping pool will admit when it starts: its workers' peaks when it was
// last stopped, else the declared memory of its models times its workers (0: unknown).
func (s *supervisor) need(pool string) int64 {
	pp := s.pools[pool]
	if pp.lastPeak > 0 {
		return pp.lastPeak
	}
	var sum int64
	for _, m := range pp.cfg.Models {
		mc := s.conf().Models[m]
		if mc == nil || mc.Memory <= 0 {
			return 0
		}
		sum += int64(mc.Memory)
	}
	return sum * int64(max(1, len(pp.procs)))
}

// evict makes room for pool on its device by stopping idle pools of lower classes whose
// workers may be stopped (a keep_alive: not pinned), the lowest class first, until what
// they free covers the pool's need. It returns the exits to wait for before starting the
// pool. Without a known need, or with room enough, it stops nothing.
func (s *supervisor) evict(pool string) []chan struct{} {
	s.mu.Lock()
	need := s.need(pool)
	s.mu.Unlock()
	device := s.conf().Pool(pool).Device
	left, ok := s.mem.remaining(device, pool, "")
	if need <= 0 || !ok || left >= need || s.idle == nil {
		return nil
	}
	prio := s.conf().PoolPriority(pool)
	var victims []string
	for _, name := range s.conf().PoolNames() {
		pc := s.conf().Pools[name]
		if _, unload := pc.Idle(); name == pool || !unload || !pc.IsLocal() || pc.Device != device || s.conf().PoolPriority(name) <= prio {
			continue
		}
		victims = append(victims, name)
	}
	slices.SortStableFunc(victims, func(a, b string) int { return cmp.Compare(s.conf().PoolPriority(b), s.conf().PoolPriority(a)) })
	var exits []chan struct{}
	for _, v := range victims {
		if left >= need {
			break
		}
		if !s.idle(v) {
			continue
		}
		freed := int64(0)
		for _, w := range s.tracker.Live(v) {
			for _, m := range w.HB.Models {
				freed += m.PeakBytes
			}
		}
		stopped := s.sleep(v)
		if len(stopped) == 0 {
			continue
		}
		s.log.Info("evicting an idle pool of a lower class for a pool that needs its memory", "evicted", v, "for", pool, "frees", freed, "need", need, "left", left)
		for _, p := range stopped {
			exits = append(exits, p.exited)
		}
		left += freed
	}
	if left < need {
		s.reclaimFor(pool, device, need, prio)
	}
	return exits
}

// reclaimer is the part of memory admission that presses reclaimable leases (lease.go,
// rule 6).
type reclaimer interface {
	// reclaim presses the reclaimable leases on device of a class below prio; false when
	// there is none.
	reclaim(device string, prio int) bool
	// pressing reports whether a lease on device is still pressed.
	pressing(device string) bool
}

// reclaimFor presses the reclaimable leases of lower classes on device for pool, and
// waits until the budget left holds need, or no lease is pressed whose holder this
// gateway measures any more (shrunk, released, or the press ended: lease.go, rule 6).
func (s *supervisor) reclaimFor(pool, device string, need int64, prio int) {
	r, ok := s.mem.(reclaimer)
	if !ok || !r.reclaim(device, prio) {
		return
	}
	s.log.Info("asking reclaimable leases of lower classes for memory", "for", pool, "device", device, "need", need)
	for i := 0; i < int(pressFor/(50*time.Millisecond)); i++ {
		if left, ok := s.mem.remaining(device, pool, ""); !ok || left >= need || !r.pressing(device) {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// startingOn reports whether a worker of a local pool on device is starting: spawned, not
// exited nor being stopped, and not yet ready and heard with its models (its memory not
// yet in the admission: relief.go, rule 1).
func (s *supervisor) startingOn(device string) bool {
	var ready []string // asked of the tracker after s.mu: never the two locks at once
	s.mu.Lock()
	for _, pp := range s.pools {
		if pp.cfg.Device != device {
			continue
		}
		for _, p := range pp.procs {
			if p.cmd == nil || p.stopping || isClosed(p.exited) {
				continue
			}
			if !p.ready {
				s.mu.Unlock()
				return true
			}
			ready = append(ready, p.id)
		}
	}
	s.mu.Unlock()
	for _, id := range ready {
		if w, ok := s.tracker.Get(id); !ok || len(w.HB.Models) == 0 {
			return true
		}
	}
	return false
}

// waitHeartbeat waits (a bounded time) until the tracker has heard a ready worker, so its
// measured memory counts when the next worker's budget is computed.
func (s *supervisor) waitHeartbeat(p *proc) {
	s.mu.Lock()
	id, ready := p.id, p.ready
	s.mu.Unlock()
	if !ready {
		return
	}
	awaitBeat(s.tracker, id, 2*s.conf().Health.HeartbeatInterval.D(), func(w health.Worker, ok bool) bool {
		return ok && len(w.HB.Models) > 0
	})
}

// awaitBeat polls the tracker's view of worker id (ok false: not known) until done says
// so, or within has passed. Heartbeats have no event to wait on here: the tracker keeps
// only the last.
func awaitBeat(tracker workerView, id string, within time.Duration, done func(w health.Worker, ok bool) bool) {
	for deadline := time.Now().Add(within); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		if done(tracker.Get(id)) {
			return
		}
	}
}

// spawn starts (or restarts) one worker process.
func (s *supervisor) spawn(p *proc) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return
	}
	pc := s.pools[p.pool].cfg
	p.id = WorkerID(p.pool, p.slot, p.gen, s.gateway)
	bin := s.bin
	if pc.Worker != "" {
		bin = pc.Worker
	}
	url, env := s.url, os.Environ()
	if pc.HasCredentials() {
		// The pool's workers log in as their own NATS user ([pools.NAME.nats], read by the
		// worker from the same config file): none of the gateway's credentials reach them,
		// neither its password in the environment nor a user:password in the URL.
		url, env = natsconn.StripUserInfo(url), withoutEnv(env, natsconn.PasswordEnv)
	}
	cmd := exec.Command(bin, "-config", s.conf().File, "-pool", p.pool, "-id", p.id, "-nats", url)
	cmd.Env = env
	for k, v := range pc.Env {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	// Memory admission: the worker may use what the device's budget has left; a device
	// whose capacity is unknown (ok false) admits nothing.
	left, ok := s.mem.remaining(pc.Device, p.pool, p.id)
	if !ok || left <= 0 {
		s.pools[p.pool].failed = s.mem.admissionError(pc.Device, p.pool, 0)
		p.settled, p.exited = make(chan struct{}), make(chan struct{})
		close(p.settled)
		close(p.exited)
		return
	}
	cmd.Env = append(cmd.Env, fmt.Sprintf("%s=%d", config.MemBudgetEnv, left))
	// The models in force (a run-time load or unload changes them without the file), and
	// the key of the verbs that change them in place.
	models, _ := json.Marshal(pc.Models)
	cmd.Env = append(cmd.Env, config.PoolModelsEnv+"="+string(models), config.ControlKeyEnv+"="+hex.EncodeToString(codec.WorkerKey(s.controlKey, p.id)))
	if skip := s.pools[p.pool].skip; len(skip) > 0 {
		b, _ := json.Marshal(skip)
		cmd.Env = append(cmd.Env, config.SkipModelsEnv+"="+string(b))
	}
	cmd.Stderr = os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL} // never outlive the gateway
	out, err := cmd.StdoutPipe()
	p.cmd, p.ready, p.started, p.loading = cmd, false, time.Now(), ""
	p.settled, p.exited = make(chan struct{}), make(chan struct{})
	if err == nil {
		err = cmd.Start()
	}
	if err != nil {
		s.pools[p.pool].failed = codec.Errorf(codec.CodeInternal, "start worker %s: %v", bin, err).With("pool", p.pool)
		close(p.settled)
		close(p.exited)
		return
	}
	if pc.Nice > 0 {
		if err := syscall.Setpriority(syscall.PRIO_PROCESS, cmd.Process.Pid, pc.Nice); err != nil {
			s.log.Warn("cannot renice worker", "worker", p.id, "nice", pc.Nice, "err", err)
		}
	}
	s.byID[p.id] = p
	s.wg.Add(1)
	go s.watch(p, cmd, out)
}

// controlSent is the send time of the next control body: now, or a millisecond after
// the last one, whichever is later (a worker refuses a body not sent after the last it
// took: codec.WorkerLoad.Sent).
func (s *supervisor) controlSent() int64 {
	for {
		last, now := s.lastSent.Load(), time.Now().UnixMilli()
		next := max(now, last+1)
		if s.lastSent.CompareAndSwap(last, next) {
			return next
		}
	}
}

// withoutEnv is env (KEY=VALUE entries) without the variable key.
func withoutEnv(env []string, key string) []string {
	out := make([]string, 0, len(env))
	for _, kv := range env {
		if !strings.HasPrefix(kv, key+"=") {
			out = append(out, kv)
		}
	}
	return out
}

// watch reads a worker's stdout events and waits for its exit.
func (s *supervisor) watch(p *proc, cmd *exec.Cmd, out io.Reader) {
	defer s.wg.Done()
	settled, exited := p.settled, p.exited
	var once sync.Once
	settle := func() { once.Do(func() { close(settled) }) }
	failure := s.readEvents(p, out, settle)
	err := cmd.Wait()
	why := exitReason(cmd, err)
	s.log.Warn("worker exited", "worker", p.id, "pool", p.pool, "reason", why)
	// The process is gone: every request it held is answered now, not after heartbeats.
	// Marked dead before its exit is announced: whoever waits for the exit (an eviction)
	// then finds its memory gone from the admission. (workerDead does not wait for
	// exited on an exit's reason.)
	s.tracker.MarkDead(p.id, p.pool, s.host, why)
	close(exited)
	s.mu.Lock()
	pp, restart, backoff := s.afterExit(p, cmd, failure, why)
	gen := p.gen
	s.mu.Unlock()
	settle()
	if !restart {
		return
	}
	time.AfterFunc(backoff, func() {
		s.mu.Lock()
		if p.gen != gen || s.pools[p.pool] != pp {
			// Replaced meanwhile by a reload (replace), or its pool removed: not twice.
			s.mu.Unlock()
			return
		}
		old := p.id
		p.gen++
		p.restarts++
		s.mu.Unlock()
		s.tracker.Forget(old)
		s.spawn(p)
	})
}

// readEvents reads the worker's event lines until its output closes: the model it is
// loading, its readiness (settle), and the failure it reported, if any.
func (s *supervisor) readEvents(p *proc, out io.Reader, settle func()) (failure *codec.Error) {
	sc := bufio.NewScanner(out)
	for sc.Scan() {
		ev, ok := codec.ReadEvent(sc.Bytes())
		if !ok {
			continue
		}
		switch ev.Event {
		case codec.EventLoading:
			if _, ok := s.conf().Models[ev.Model]; ok { // a configured name, nothing else
				s.mu.Lock()
				p.loading = ev.Model
				s.mu.Unlock()
			}
		case codec.EventReady:
			s.mu.Lock()
			p.ready, p.loading = true, ""
			s.mu.Unlock()
			settle()
		case codec.EventFailed:
			failure = ev.Error
		}
	}
	return failure
}

// afterExit records the exit of p (failure: what it reported; why: how it ended) in its
// pool, under s.mu, and decides whether it is restarted, after how long. Not restarted:
// a worker whose pool a reload removed, one of a stopping gateway, one stopped by sleep,
// one whose pool failed for good or is crash-looping.
func (s *supervisor) afterExit(p *proc, cmd *exec.Cmd, failure *codec.Error, why string) (pp *poolProcs, restart bool, backoff time.Duration) {
	pp = s.pools[p.pool]
	p.lastExit, p.ready = why, false
	if pp == nil || !slices.Contains(pp.procs, p) {
		return pp, false, 0 // its pool was removed by a reload (reload.go): nothing to restart
	}
	if s.closed {
		// The gateway is stopping (closing): its workers drain and exit, some on a signal
		// of their own (Ctrl-C reaches the whole process group) before stop asks them.
		// Not a death: nothing is restarted, counted or skipped.
		return pp, false, 0
	}
	if failure != nil {
		if failure.Code == codec.CodeOverloaded && failure.Details["device"] != nil {
			need, _ := failure.Details["sum_bytes"].(int64)
			if f, ok := failure.Details["sum_bytes"].(float64); ok {
				need = int64(f)
			}
			failure = s.mem.admissionError(pp.cfg.Device, p.pool, need)
		}
		pp.failed = failure
	}
	if failure == nil && !p.stopping && p.loading != "" && cmd.ProcessState != nil && !cmd.ProcessState.Success() {
		// It died while loading a model, without a word (a native crash): its restarts
		// skip that model. An exit 0 is a drain (SIGTERM or SIGINT), never such a death.
		if pp.skip == nil {
			pp.skip = map[string]string{}
		}
		pp.skip[p.loading] = fmt.Sprintf("worker %s died while loading it (%s)", p.id, why)
		s.log.Error("worker died while loading a model; the pool's workers skip it from now on", "worker", p.id, "pool", p.pool, "model", p.loading, "reason", why)
		p.loading = ""
	}
	if p.stopping {
		// Stopped by sleep: not a death, and not restarted here (wake starts it again).
		p.stopping = false
		return pp, false, 0
	}
	gw := s.conf().Gateway // one configuration for the crash-loop decision
	now := time.Now()
	pp.deaths = append(pp.deaths, now)
	recent := pp.deaths[:0]
	for _, t := range pp.deaths {
		if now.Sub(t) <= gw.CrashLoopWindow.D() {
			recent = append(recent, t)
		}
	}
	pp.deaths = recent
	if len(recent) >= gw.CrashLoopCount {
		pp.crashLooping = true
	}
	if pp.crashLooping {
		s.log.Error("pool is crash-looping; not restarting", "pool", p.pool, "deaths", len(recent), "window", gw.CrashLoopWindow.D())
	}
	return pp, pp.failed == nil && !pp.crashLooping, restartBackoff(gw, len(recent))
}

// restartBackoff doubles from restart_backoff_min with each recent death, up to the max.
func restartBackoff(gw config.Gateway, recent int) time.Duration {
	d := gw.RestartBackoffMin.D()
	for i := 1; i < recent && d < gw.RestartBackoffMax.D(); i++ {
		d *= 2
	}
	return min(d, gw.RestartBackoffMax.D())
}

func exitReason(cmd *exec.Cmd, err error) string {
	if st, ok := cmd.ProcessState.Sys().(syscall.WaitStatus); ok && st.Signaled() {
		return "killed by signal " + st.Signal().String()
	}
	if cmd.ProcessState != nil {
		return fmt.Sprintf("exit code %d", cmd.ProcessState.ExitCode())
	}
	return fmt.Sprint(err)
}

// workerDead is told by the tracker that a worker stopped heartbeating. A local worker
// that is silent but still running (hung, stopped) is killed so that it is replaced; it
// returns once that process has exited (or after a second).
func (s *supervisor) workerDead(id, why string) {
	s.mu.Lock()
	p, ok := s.byID[id]
	var cmd *exec.Cmd
	var exited chan struct{}
	if ok && p.id == id { // not a replacement that reuses the slot
		cmd, exited = p.cmd, p.exited
	}
	s.mu.Unlock()
	if cmd == nil || why != "heartbeat stopped" {
		return
	}
	select {
	case <-exited:
	default:
		s.log.Warn("killing a silent worker", "worker", id)
		cmd.Process.Signal(syscall.SIGKILL)
		select {
		case <-exited:
		case <-time.After(time.Second):
		}
	}
}

// poolStatus says why a pool has no live worker at now, and whether one is still coming.
func (s *supervisor) poolState(pool string, now time.Time) poolStatus {
	s.mu.Lock()
	defer s.mu.Unlock()
	pp, ok := s.pools[pool]
	if !ok {
		// A remote pool is known by its heartbeats only: right after the gateway starts,
		// give its workers the time of a death verdict to be heard before giving up.
		if now.Sub(s.started) < time.Duration(s.conf().Health.MissCount)*s.conf().Health.HeartbeatInterval.D() {
			return poolStatus{reason: "remote workers not heard yet", coming: true}
		}
		return poolStatus{reason: "no live workers (remote pool: none heartbeating)"}
	}
	st := poolStatus{failed: pp.failed}
	switch {
	case pp.failed != nil:
		st.reason = fmt.Sprintf("%s: %s", pp.failed.Code, pp.failed.Message)
	case pp.crashLooping:
		st.reason = fmt.Sprintf("crash-looping (%d deaths within %s)", len(pp.deaths), s.conf().Gateway.CrashLoopWindow.D())
	case s.closed:
		st.reason = "shutting down"
	case len(pp.procs) == 0:
		st.reason = "no workers configured"
	case pp.asleep:
		st.reason, st.coming, st.asleep = "not started yet (lazy_load): starting for this request", true, true
	default:
		st.reason, st.coming = "workers starting", true
	}
	return st
}

// procStatus is what status reports of a supervised worker.
type procStatus struct {
	restarts     int
	lastExit     string
	crashLooping bool
	asleep       bool // its pool was stopped after keep_alive (or not started: lazy_load)
}

func (s *supervisor) status(id string) (procStatus, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	p, ok := s.byID[id]
	if !ok {
		return procStatus{}, false
	}
	pp := s.pools[p.pool]
	return procStatus{restarts: p.restarts, lastExit: p.lastExit, crashLooping: pp.crashLooping, asleep: pp.asleep}, true
}

func (s *supervisor) poolInfo(pool string) (crashLooping bool, failed *codec.Error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if pp, ok := s.pools[pool]; ok {
		return pp.crashLooping, pp.failed
	}
	return false, nil
}

// modelsInfo reports the models pool's starting workers are loading now, and those the
// pool skips and why (see poolProcs.skip).
func (s *supervisor) modelsInfo(pool string) (loading []string, skipped map[string]string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	pp, ok := s.pools[pool]
	if !ok {
		return nil, nil
	}
	for _, p := range pp.procs {
		if p.loading != "" && !slices.Contains(loading, p.loading) {
			loading = append(loading, p.loading)
		}
	}
	return loading, maps.Clone(pp.skip)
}

// closing marks the start of the gateway's shutdown, as soon as it is asked for (its
// SIGTERM or SIGINT, before the drain of its requests): from then on no worker starts or
// restarts, and a worker's exit is no death and poisons no model (watch). A Ctrl-C
// reaches the whole process group: the workers drain and exit 0 on their own, while the
// gateway still drains, and were restarted (and the new ones, stopped while loading,
// taken for deaths while loading).
func (s *supervisor) closing() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.closed {
		s.closed = true
		s.log.Info("gateway stopping: workers are no longer started or restarted")
	}
}

// stop drains every worker: SIGTERM, then SIGKILL after grace (stopProcs), and waits
// for their watches to end. No worker starts or restarts from then on.
func (s *supervisor) stop(grace time.Duration) {
	s.mu.Lock()
	s.closed = true
	var all []*proc
	for _, pp := range s.pools {
		all = append(all, pp.procs...)
	}
	s.mu.Unlock()
	s.stopProcs(all, grace)
	s.wg.Wait()
}

// stopProcs asks the running ones of procs (started, with a process, not exited) to
// drain and exit (SIGTERM: each answers what it holds), kills those still running after
// grace, and waits for their exits. Their exits are no deaths: nothing restarts them.
// It is the one way the supervisor stops processes: at shutdown (stop), for a reload
// (replace, drain).
func (s *supervisor) stopProcs(procs []*proc, grace time.Duration) {
	var running []*proc
	s.mu.Lock()
	for _, p := range procs {
		if p.cmd != nil && p.cmd.Process != nil && !isClosed(p.exited) {
			p.stopping = true
			running = append(running, p)
		}
	}
	s.mu.Unlock()
	for _, p := range running {
		p.cmd.Process.Signal(syscall.SIGTERM)
	}
	deadline := time.After(grace)
	for _, p := range running {
		select {
		case <-p.exited:
		case <-deadline:
			for _, q := range running {
				q.cmd.Process.Kill()
			}
			<-p.exited
		}
	}
}

// running reports whether a supervised worker's process exists and is not stopped
// (state R, S or D in /proc/PID/stat): a silent worker that is running is probably
// starved of CPU, one that is stopped (T) or a zombie is dead for all purposes.
func (s *supervisor) running(id string) bool {
	s.mu.Lock()
	p, ok := s.byID[id]
	var pid int
	if ok && p.cmd != nil && p.cmd.Process != nil {
		pid = p.cmd.Process.Pid
	}
	s.mu.Unlock()
	if pid == 0 {
		return false
	}
	proc, err := procfs.NewProc(pid)
	if err != nil {
		return false
	}
	st, err := proc.Stat()
	if err != nil {
		return false
	}
	switch st.State {
	case "R", "S", "D":
		return true
	}
	return false
}

// isClosed reports whether ch (nil: not made yet) is closed.
func isClosed(ch chan struct{}) bool {
	if ch == nil {
		return true
	}
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// pids are the process ids of the supervised workers that have started and not exited.
func (s *supervisor) pids() []int {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []int
	for _, pp := range s.pools {
		for _, p := range pp.procs {
			if p.cmd != nil && p.cmd.Process != nil && !isClosed(p.exited) {
				out = append(out, p.cmd.Process.Pid)
			}
		}
	}
	return out
}
