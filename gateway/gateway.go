// Package gateway is ortbus's front door: the client API as the NATS micro service
// `ortbus` (and over HTTP), routing of each request by class and pool, priority
// scheduling (package sched), heartbeat tracking and claims of in-flight work (package
// health), answering every request of a worker that dies, and supervision of the
// worker processes of local pools.
package gateway

import (
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"

	"github.com/ortbus/ortbus/codec"
	"github.com/ortbus/ortbus/config"
	"github.com/ortbus/ortbus/health"
	"github.com/ortbus/ortbus/natsd"
	"github.com/ortbus/ortbus/subjects"
)

// Options configure a gateway.
type Options struct {
	Config *config.Config
	// NATSListen overrides the embedded server's listen address ("127.0.0.1:0" = any port).
	NATSListen string
	// HTTPListen overrides the HTTP address ("" keeps the config's; "-" turns HTTP off).
	HTTPListen string
	// WorkerBin is the ortworker executable for local pools.
	WorkerBin string
	Logger    *slog.Logger
	// OnReady is called once NATS is up and every local worker is ready or has failed.
	OnReady func(Ready)
	// Reload, when set, asks for a reload of the config file at each receive (SIGHUP).
	Reload <-chan struct{}
}

// Ready is what the gateway announces when it is ready.
type Ready = codec.Event

// Gateway is a running gateway: the concerns below, each a type that owns its state,
// built on its connection with what each needs (build), and the service that runs them
// (Run).
type Gateway struct {
	id   string
	log  *slog.Logger
	nc   *nats.Conn
	srv  *natsd.Server
	svc  micro.Service
	http *http.Server

	reloader   *reloader       // the configuration in force, and its changes (reload.go)
	d          *dispatcher     // the dispatch loop, the lifecycle and the sender (loop.go)
	budget     *memoryBudget   // the devices' memory: admission, leases, foreign memory (budget.go)
	pauses     *pauses         // classes paused on demand (pause.go)
	gates      *gates          // the compute gates of the devices with gated leases (gate.go)
	tracker    *health.Tracker // the workers' heartbeats
	supervisor *supervisor     // the local pools' worker processes (supervise.go)
	failover   *failover       // gateway beats, peers, and the answers bucket for resends
	cache      *cacheService   // the result cache (cache.go)
	jobs       *jobService     // the job API (jobs.go)
	metrics    *metrics
	driver     *driverReadings // the devices' memory as their drivers report it (driverused.go)

	// A NATS connection closed for good other than by closeNATS (onClosed).
	closing      atomic.Bool   // closeNATS closes it: that close is no loss
	connLost     chan struct{} // closed on a loss, after connLostErr is set
	connLostErr  error
	connLostOnce sync.Once
}

// conf is the configuration in force (the reloader's).
func (g *Gateway) conf() *config.Config { return g.reloader.conf() }

// newGateway is the gateway of config c before it connects: its id (gateway.id, else
// <host>-<pid>) and its log. Run connects it (connect), then builds its concerns (build).
func newGateway(c *config.Config, log *slog.Logger) *Gateway {
	if log == nil {
		log = slog.New(slog.NewTextHandler(os.Stderr, nil))
	}
	id := c.Gateway.ID
	if id == "" {
		host, _ := os.Hostname()
		id = fmt.Sprintf("%s-%d", sanitize(host), os.Getpid())
	}
	return &Gateway{id: id, log: log, connLost: make(chan struct{})}
}

// build makes the gateway's concerns on its connection g.nc (url: what its workers
// connect to; bin: their executable) in one phase, each with what it needs, in the order
// they need each other: the configuration in force, the metrics, the dispatch loop's
// handle and the service-time estimates, the heartbeat tracker, the pauses, the memory
// budget, the gates, the supervisor, failover, the dispatcher with its sender, the cache,
// the jobs and the reloader. Two calls run to what is built after their caller, and
// neither is made before build returns: the tracker tells the gateway (trackerListener,
// once the tracker starts), and the budget's foreign readings ask the supervisor for its
// pids (foreign.go: once the budget starts, or a test reads).
func (g *Gateway) build(c *config.Config, bin, url string) error {
	claim, err := subjects.Claim(g.id)
	if err != nil {
		return fmt.Errorf("gateway id: %w", err)
	}
	cs := newConfigs(c)
	conf, log, nc := cs.conf, g.log, g.nc
	m := newMetrics(c, conf, log)
	h, est := newLoopHandle(c, conf), &estimator{}
	tracker := &health.Tracker{MissCount: c.Health.MissCount, Pools: poolSet(c), Log: log, Listener: trackerListener{g}}
	ps := newPauses(h.kick)
	var sup *supervisor
	budget := newBudget(g.id, log, h.kick, tracker.Workers, func() []int { return sup.pids() })
	gates := newGates(g.id, budget.leases.gated, loopGateDemand(h, est), busGatePublisher(nc, m))
	sup = newSupervisor(c, tracker, budgetNow{budget, conf, h.poolIdle}, log, g.id, bin, url, nc.RequestWithContext)
	budget.starting = sup.startingOn
	fo := newFailover(g.id, nc, conf, log, m, h.holds,
		func() bool { return g.svc == nil || !g.svc.Stopped() }, // g.svc: the API, opened after the build (open)
		func(op string, r micro.Request) { g.handle(op, r, false) })
	d := newDispatcher(c, log, h, est, senderDeps{nc: nc, claimSubject: claim, metrics: m, failover: fo, supervisor: sup},
		dispatchDeps{tracker: tracker, supervisor: sup, budget: budget, pauses: ps, gates: gates})
	cache := newCacheService(c, conf, log, d, tracker.Workers, m.reg)
	jobs := newJobService(conf, log, nc, d, cache, ps, tracker.Live, sup.poolInfo)
	rl := &reloader{configs: cs, id: g.id, log: log, metrics: m, tracker: tracker, supervisor: sup, budget: budget,
		kick: func() { h.kick(); budget.waits.wake() }, maxPayload: nc.MaxPayload} // a change may raise a capacity
	m.reg.MustRegister(&stateCollector{conf: conf, d: d, budget: budget, tracker: tracker, supervisor: sup, jobs: jobs},
		deviceCollector{conf: conf, budget: budget, gates: gates})
	g.reloader, g.metrics, g.tracker, g.pauses, g.budget, g.gates = rl, m, tracker, ps, budget, gates
	g.supervisor, g.failover, g.d, g.cache, g.jobs = sup, fo, d, cache, jobs
	g.driver = newDriverReadings()
	return nil
}

// loopGateDemand is the gates' question to the dispatch loop h (gateDemand), each
// request's work estimated by est.
func loopGateDemand(h *loopHandle, est *estimator) gateDemandFunc {
	return func(classes map[string]string, gating []string, prio func(string) (int, bool)) (demand map[string]bool, ok bool) {
		work := func(pool string, p *pending) time.Duration { return est.get(estKey{pool, p.op, p.req.Model}) }
		ok = h.inspect(func(lc *lifecycle) { demand = lc.gateDemand(classes, gating, prio, work) })
		return demand, ok
	}
}

// busGatePublisher publishes a gate on nc, a failure counted in m.
func busGatePublisher(nc *nats.Conn, m *metrics) func(subject string, gate codec.Gate) {
	return func(subject string, gate codec.Gate) {
		b, err := codec.Marshal(&gate)
		if err == nil {
			err = nc.Publish(subject, b)
		}
		if err != nil {
			m.publishFailed("gate", err)
		}
	}
}

// trackerListener is the gateway as its tracker's health.Listener: a death goes to the
// dispatch loop (L7), a change asks for a pass (and one over the waiting leases: a
// worker's memory may be lower, or gone), a dropped heartbeat is counted, and the
// supervisor says whether a silent worker is a local process known to be running (likely
// starved of CPU, not dead).
type trackerListener struct{ g *Gateway }

func (l trackerListener) Dead(w health.Worker)       { l.g.d.onDead(w.HB.Worker, w.HB.Pool, w.Why) }
func (l trackerListener) Changed()                   { l.g.d.kick(); l.g.budget.waits.wake() }
func (l trackerListener) Dropped(string)             { l.g.metrics.bad("heartbeat") }
func (l trackerListener) Running(worker string) bool { return l.g.supervisor.running(worker) }

func sanitize(s string) string {
	b := []byte(s)
	for i, c := range b {
		if c == '.' || c == '*' || c == '>' || c <= ' ' {
			b[i] = '-'
		}
	}
	if len(b) == 0 {
		return "gateway"
	}
	return string(b)
}
