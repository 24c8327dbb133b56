package worker

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/ortbus/ortbus/health"
	"github.com/ortbus/ortbus/natsconn"
)

// ErrConnectionLost is what Serve and ServeConn return, wrapped with the connection's
// last error, when the NATS connection is closed for good under them (see ServeConn).
var ErrConnectionLost = errors.New("NATS connection closed for good")

// Serve connects to NATS at url, subscribes and serves until ctx is cancelled, then
// drains: no new work, every queued item answered, a last heartbeat, and returns nil.
// A connection closed for good first ends it with ErrConnectionLost (ServeConn).
func (w *Worker) Serve(ctx context.Context, url string, natsOpts ...nats.Option) error {
	// The pool's own NATS identity when it has one ([pools.NAME.nats]); then a user:password
	// in the URL (the gateway's) must not log it in as someone else.
	opts, err := natsconn.Options(w.cfg.WorkerNATS(w.pool.Name), "ortworker "+w.id)
	if err != nil {
		return err
	}
	if w.pool.HasCredentials() {
		url = natsconn.StripUserInfo(url)
	}
	opts = append(append(opts, nats.ErrorHandler(func(_ *nats.Conn, s *nats.Subscription, err error) {
		w.log.Warn("nats error", "subject", subjectOf(s), "err", err)
	})), natsOpts...)
	nc, err := nats.Connect(url, opts...)
	if err != nil {
		return fmt.Errorf("connect to NATS %s: %w", url, err)
	}
	defer nc.Close()
	return w.ServeConn(ctx, nc)
}

// ServeConn serves on an existing connection (see Serve).
//
// The connection reconnects for ever while the server is away (natsconn.Reconnect), but
// nats.go closes it for good on a fatal server error ("maximum control line exceeded")
// or on the same authorization error twice when reconnecting (a rotated password). A
// worker that went on would serve nothing while its process looked alive, so ServeConn
// then stops (lost) and returns ErrConnectionLost: ortworker exits non-zero and its
// supervisor (the gateway, systemd) restarts it. ServeConn itself never closes nc, so
// every close it sees while serving is such a loss.
func (w *Worker) ServeConn(ctx context.Context, nc *nats.Conn) error {
	w.reply.connect(nc)
	closed, unwatch := connClosed(nc)
	defer unwatch()
	// Cancels, verdicts and control first: a work item's claim may be answered at once.
	ctl, err := w.serve.control(nc)
	if err != nil {
		return err
	}
	var subs []*nats.Subscription
	for _, class := range w.pool.Classes {
		s, err := w.serve.subscribe(nc, class)
		if err != nil {
			return err
		}
		subs = append(subs, s...)
	}
	pub, err := health.NewPublisher(nc, w.pool.Name, w.id, w.cfg.Health.HeartbeatInterval.D(), w.snapshot)
	if err != nil {
		return err
	}
	pub.OnError = func(err error) { w.reply.publishFailed("heartbeat", "", err) }
	hbCtx, stopHB := context.WithCancel(context.Background())
	var hbDone sync.WaitGroup
	hbDone.Add(2)
	go func() { defer hbDone.Done(); pub.Run(hbCtx, nil) }()
	go func() { defer hbDone.Done(); w.dev.run(hbCtx, w.cfg.Health.HeartbeatInterval.D()) }()
	stopBeats := func() { stopHB(); hbDone.Wait() }

	w.slots.start()
	if err := nc.Flush(); err != nil {
		w.log.Warn("NATS flush after subscribing failed; serving once reconnected", "err", err)
	}
	w.log.Info("serving", "classes", w.pool.Classes, "slots", w.pool.Slots)
	if w.ready != nil {
		w.ready(w)
	}

	select {
	case <-ctx.Done():
	case <-closed:
		err := w.lost(nc)
		w.slots.wait()
		stopBeats()
		return err
	}
	if err := w.drain(nc, subs, closed); err != nil {
		stopBeats()
		return err
	}
	w.reply.gate.waitParked(parkedDrainWait) // their verdicts come on ctl
	for _, s := range ctl {
		s.Unsubscribe()
	}
	stopBeats()
	pub.Beat()
	w.log.Info("drained", "served", w.reply.served.Load(), "failed", w.reply.failed.Load())
	return nc.Flush()
}

// drain stops taking work (pending messages already in the client are still delivered
// to the handler and queued or answered) and finishes what is queued, the slots ended. A
// loss meanwhile ends the drain: what is left cannot be answered (lost).
func (w *Worker) drain(nc *nats.Conn, subs []*nats.Subscription, closed <-chan struct{}) error {
	w.serve.draining.Store(true)
	drained := make(chan struct{})
	lostWhileDraining := make(chan error, 1)
	go func() {
		select {
		case <-closed:
			lostWhileDraining <- w.lost(nc)
		case <-drained:
			lostWhileDraining <- nil
		}
	}()
	for _, s := range subs {
		s.Drain()
	}
	for _, s := range subs {
		waitClosed(s, closed)
	}
	w.q.idle()
	w.q.close()
	w.slots.wait()
	close(drained)
	return <-lostWhileDraining
}

// lost stops the work of a worker whose connection nc is closed for good, and returns
// the error that says so (ErrConnectionLost with nc's last error): no answer can be sent
// any more, so nothing is drained. Queued items are dropped and running ones cancelled
// (their gateways retry them on another worker, or answer them); the queues close, so
// the slots end.
func (w *Worker) lost(nc *nats.Conn) error {
	err := nc.LastError()
	if err == nil {
		err = nats.ErrConnectionClosed
	}
	w.log.Error("NATS connection closed for good; the worker stops", "err", err)
	w.serve.draining.Store(true)
	w.q.close()
	_, _, held := w.q.counts()
	for _, id := range held {
		if j, _ := w.q.cancel(id); j != nil && j.cancel != nil {
			j.cancel()
		}
	}
	return fmt.Errorf("%w: %w", ErrConnectionLost, err)
}

// connClosed returns a channel closed once nc is closed (nats.go's status events), so
// that every wait of ServeConn can end on it, and the function that stops the watch.
func connClosed(nc *nats.Conn) (<-chan struct{}, func()) {
	ch := nc.StatusChanged(nats.CLOSED)
	done := make(chan struct{})
	go func() {
		if _, ok := <-ch; ok {
			close(done)
		}
	}()
	return done, func() { nc.RemoveStatusListener(ch) }
}

// waitClosed waits until a draining subscription has handed over every pending message,
// or the connection is closed (which ends the subscription without a status event).
func waitClosed(s *nats.Subscription, connClosed <-chan struct{}) {
	ch := s.StatusChanged(nats.SubscriptionClosed)
	if !s.IsValid() {
		return
	}
	select {
	case <-ch:
	case <-connClosed:
	case <-time.After(30 * time.Second):
	}
}

func subjectOf(s *nats.Subscription) string {
	if s == nil {
		return ""
	}
	return s.Subject
}
