package gateway

import (
	"context"
	"fmt"
	"net"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/ortbus/ortbus/codec"
	"github.com/ortbus/ortbus/config"
	"github.com/ortbus/ortbus/internal/guard"
	"github.com/ortbus/ortbus/natsconn"
	"github.com/ortbus/ortbus/natsd"
)

// Run starts the gateway and serves until ctx is cancelled, then shuts down: no new
// requests, queued and in-flight work answered (within the shutdown grace), workers
// drained, NATS closed. When its NATS connection is closed for good first (onClosed), it
// shuts down the same way without waiting for work that can no longer be answered, and
// returns that error.
func Run(ctx context.Context, o Options) error {
	c := o.Config
	g := newGateway(c, o.Logger)
	url, err := g.connect(c, o.NATSListen)
	if err != nil {
		return err
	}
	defer g.closeNATS()
	defer startSpoolSweeper(c.Security, g.log)() // spool files older than security.spool_max_age go

	if err := g.build(c, o.WorkerBin, url); err != nil {
		return err
	}
	// The shutdown begins for the supervisor the moment it is asked for (ctx: the signal),
	// not when the drain below reaches it: a worker's exit meanwhile is not restarted.
	defer context.AfterFunc(ctx, g.supervisor.closing)()
	if err := g.tracker.Start(g.nc); err != nil {
		return err
	}
	defer g.tracker.Stop()
	defer g.budget.start(g.conf(), g.conf)() // the devices read before the workers start, so their budget knows it
	defer g.metrics.window.start()()         // the classes' last minute (classstats.go)
	if err := g.subscribe(); err != nil {
		return err
	}
	jobsCtx, stopJobs := context.WithCancel(context.Background())
	defer stopJobs()
	if err := g.failover.start(jobsCtx); err != nil {
		return err
	}
	defer g.failover.close()
	g.jobs.start(jobsCtx)
	stopDispatch := g.d.start(true)
	defer g.gates.start(g.conf)() // stopped before the loop's stop (deferred: after it returns)

	// A lost connection ends each wait, before ready (never announced then) and after.
	select {
	case <-g.supervisor.start():
	case <-ctx.Done():
	case <-g.connLost:
	}
	if !g.connIsLost() {
		if err := g.open(ctx, o, url); err != nil {
			stopDispatch()
			g.supervisor.stop(c.Gateway.ShutdownGrace.D())
			return err
		}
		select {
		case <-ctx.Done():
		case <-g.connLost:
		}
	}

	lost := g.connIsLost()
	// Job items held here are cancelled first: JetStream gives them to another gateway
	// (or to this one when it is back), and the batch work they were queued as does not
	// hold up the stop. Without a connection their end cannot reach JetStream: no wait
	// (it redelivers them after their ack wait).
	stopJobs()
	if !lost {
		g.jobs.stop(jobStopBound)
	}
	g.shutdown(lost)
	stopDispatch()
	if lost {
		return g.connLostErr
	}
	return nil
}

// open opens the API (NATS and HTTP) and announces the gateway ready (url: its NATS);
// with o.Reload it reloads the config file at each signal.
func (g *Gateway) open(ctx context.Context, o Options, url string) error {
	if err := g.serveAPI(); err != nil {
		return err
	}
	srv, httpAddr, err := serveHTTP(g, o.HTTPListen)
	if err != nil {
		return err
	}
	g.http = srv
	// Ready means a client may send requests now: the server has the API's subscriptions.
	if err := g.nc.Flush(); err != nil {
		g.log.Warn("NATS flush before ready failed", "err", err)
	}
	g.log.Info("gateway ready", "id", g.id, "nats", url, "http", httpAddr)
	if o.OnReady != nil {
		o.OnReady(Ready{Event: codec.EventReady, NATSURL: url, HTTP: httpAddr})
	}
	if o.Reload != nil {
		go g.reloader.reloadOn(ctx, o.Reload)
	}
	return nil
}

// subscribe takes the claims of this gateway's work and the relayed replies to the
// dispatcher.
func (g *Gateway) subscribe() error {
	if _, err := g.nc.Subscribe(g.d.claimSubject+".>", guard.Msg(g.log, "claim", g.nc, nil, g.d.onClaim)); err != nil {
		return err
	}
	_, err := g.nc.Subscribe(g.d.replyInbox+".*", guard.Msg(g.log, "reply", g.nc, nil, g.d.onReply))
	return err
}

// onClosed is the NATS connection's ClosedHandler. nats.go closes a connection for good
// on a fatal server error ("maximum control line exceeded") or on the same authorization
// error twice when reconnecting (natsconn.Reconnect); a gateway that went on would
// answer nothing (clients get "no responders") while its process and /readyz looked
// alive. So a close that closeNATS did not make is a loss: logged with the connection's
// last error, it ends Run with an error, so the process exits non-zero and its
// supervisor restarts it.
func (g *Gateway) onClosed(nc *nats.Conn) {
	if g.closing.Load() {
		return
	}
	g.connLostOnce.Do(func() {
		err := nc.LastError()
		if err == nil {
			err = nats.ErrConnectionClosed
		}
		g.log.Error("NATS connection closed for good; the gateway stops", "err", err)
		g.connLostErr = fmt.Errorf("NATS connection closed: %w", err)
		close(g.connLost)
	})
}

// connIsLost reports whether the NATS connection was lost (onClosed).
func (g *Gateway) connIsLost() bool {
	select {
	case <-g.connLost:
		return true
	default:
		return false
	}
}

// connect starts the embedded NATS server (if c configures one) and connects, before
// anything else of the gateway is built (build).
func (g *Gateway) connect(c *config.Config, listen string) (string, error) {
	logErr := nats.ErrorHandler(func(_ *nats.Conn, s *nats.Subscription, err error) {
		subj := ""
		if s != nil {
			subj = s.Subject
		}
		g.log.Warn("nats error", "subject", subj, "err", err)
	})
	onClosed := nats.ClosedHandler(g.onClosed)
	if !c.NATS.Embedded {
		opts, err := natsconn.Options(c.NATS, "ortbus-gateway "+g.id)
		if err != nil {
			return "", err
		}
		opts = append(opts, logErr, onClosed)
		nc, err := nats.Connect(c.NATS.URL, opts...)
		if err != nil {
			return "", fmt.Errorf("connect to NATS %s: %w", c.NATS.URL, err)
		}
		g.nc = nc
		return c.NATS.URL, nil
	}
	if listen == "" {
		listen = c.NATS.Listen
	}
	host, port, err := net.SplitHostPort(listen)
	if err != nil {
		return "", fmt.Errorf("nats listen address %q: %w", listen, err)
	}
	if port == "0" {
		port = "-1"
	}
	args := []string{"-a", host, "-p", port}
	if c.NATS.StoreDir != "" {
		args = append(args, "-js", "-sd", c.NATS.StoreDir)
	}
	sopts, err := natsd.ParseArgs(args)
	if err != nil {
		return "", err
	}
	if g.srv, err = natsd.Start(sopts); err != nil {
		return "", fmt.Errorf("embedded NATS: %w", err)
	}
	// In-process: no TLS or credentials (the embedded server is loopback-only and open);
	// the reconnect settings of every connection (natsconn.Reconnect).
	opts := append([]nats.Option{nats.Name("ortbus-gateway " + g.id)}, natsconn.Reconnect()...)
	opts = append(opts, logErr, onClosed)
	if c.NATS.InboxPrefix != "" {
		opts = append(opts, nats.CustomInboxPrefix(c.NATS.InboxPrefix))
	}
	if g.nc, err = g.srv.ConnectInProcess(opts...); err != nil {
		g.srv.Shutdown()
		return "", err
	}
	return g.srv.ClientURL(), nil
}

func (g *Gateway) closeNATS() {
	g.closing.Store(true) // before Drain: its close is this gateway's own (onClosed)
	if g.nc != nil {
		g.nc.Drain()
		g.nc.Close()
	}
	if g.srv != nil {
		g.srv.Shutdown()
	}
}

// shutdown stops taking requests, waits (up to the grace) for queued and in-flight work
// to be answered, answers what is left, and drains the workers. With the NATS connection
// lost there is no such wait: nothing can settle work any more (claims and answers come
// over NATS); the workers are drained as ever (a worker still connected answers its
// direct replies), and what is left answered (an HTTP client gets it).
func (g *Gateway) shutdown(lost bool) {
	g.log.Info("gateway shutting down")
	if g.svc != nil {
		g.svc.Stop()
	}
	g.budget.waits.stop() // the waiting lease acquires: unavailable, now (leasewait.go, rule 5)
	if g.http != nil {
		sctx, cancel := context.WithTimeout(context.Background(), time.Second)
		g.http.Shutdown(sctx)
		cancel()
	}
	grace := g.conf().Gateway.ShutdownGrace.D()
	if !lost && grace > 0 {
		g.d.awaitDrained(grace)
	}
	g.d.shutdown(false) // the queued: no_worker (L10)
	g.supervisor.stop(grace)
	g.d.shutdown(true)  // and what the workers did not answer: worker_lost
	g.d.relaying.Wait() // relayed answers go out before NATS closes
}
