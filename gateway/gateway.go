// Package gateway is ortbus's front door: the client API as the NATS micro service
// `ortbus` (and over HTTP), routing of each request by class and pool, priority
// scheduling (package sched), heartbeat tracking and claims of in-flight work (package
// health), answering every request of a worker that dies, and supervision of the
// worker processes of local pools.
package gateway

import (
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
// wired together (newGateway, connected), and the service that runs them (Run).
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

	// A NATS connection closed for good other than by closeNATS (onClosed).
	closing      atomic.Bool   // closeNATS closes it: that close is no loss
	connLost     chan struct{} // closed on a loss, after connLostErr is set
	connLostErr  error
	connLostOnce sync.Once
}

// conf is the configuration in force (the reloader's).
func (g *Gateway) conf() *config.Config { return g.reloader.conf() }

// newGateway is a gateway of config c before it connects: the concerns that need no
// connection made and wired to each other (the rest: connected).
func newGateway(c *config.Config, log *slog.Logger) *Gateway {
	if log == nil {
		log = slog.New(slog.NewTextHandler(os.Stderr, nil))
	}
	g := &Gateway{log: log, connLost: make(chan struct{}), reloader: newReloader(c, log)}
	conf := g.reloader.conf
	g.d = newDispatcher(c, conf, log)
	g.pauses = newPauses(g.d.kick)
	// The budget's view of the tracker and the supervisor, which connected makes.
	g.budget = newBudget(log, g.d.kick,
		func() []health.Worker {
			if g.tracker == nil {
				return nil
			}
			return g.tracker.Workers()
		},
		func() []int {
			if g.supervisor == nil {
				return nil
			}
			return g.supervisor.pids()
		})
	// The gates' view of the leases, the dispatch loop and the bus.
	g.gates = newGates(g.budget.leases.gated,
		func(classes map[string]string, gating []string, prio func(string) (int, bool)) (demand map[string]bool, ok bool) {
			work := func(pool string, p *pending) time.Duration { return g.d.est.get(estKey{pool, p.op, p.req.Model}) }
			ok = g.d.inspect(func(lc *lifecycle) { demand = lc.gateDemand(classes, gating, prio, work) })
			return demand, ok
		},
		func(subject string, gate codec.Gate) {
			b, err := codec.Marshal(&gate)
			if err == nil {
				err = g.nc.Publish(subject, b)
			}
			if err != nil {
				g.metrics.publishFailed("gate", err)
			}
		})
	g.d.budget, g.d.pauses, g.d.gates = g.budget, g.pauses, g.gates
	g.jobs = newJobService()
	return g
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
