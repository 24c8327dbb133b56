// Package health carries liveness over the bus: workers publish heartbeats on
// ortbus.hb.<pool>.<worker> (Publisher), and gateways track them (Tracker), judging a
// worker dead after a number of missed intervals and keeping the claims of in-flight
// work, so every request a dead worker held can be answered.
package health

import (
	"context"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/ortbus/ortbus/codec"
	"github.com/ortbus/ortbus/subjects"
)

// Publisher publishes one worker's heartbeats.
type Publisher struct {
	nc       *nats.Conn
	subject  string
	interval time.Duration
	snapshot func() *codec.Heartbeat
	seq      uint64
}

// NewPublisher returns a publisher of pool/worker's heartbeats; snapshot is called for
// each beat and returns the current state (Seq, SentMS and IntervalMS are filled in).
func NewPublisher(nc *nats.Conn, pool, worker string, interval time.Duration, snapshot func() *codec.Heartbeat) (*Publisher, error) {
	subj, err := subjects.Heartbeat(pool, worker)
	if err != nil {
		return nil, err
	}
	return &Publisher{nc: nc, subject: subj, interval: interval, snapshot: snapshot}, nil
}

// Beat publishes one heartbeat now.
func (p *Publisher) Beat() error {
	hb := p.snapshot()
	p.seq++
	hb.V = codec.WireVersion
	hb.Seq = p.seq
	hb.SentMS = time.Now().UnixMilli()
	hb.IntervalMS = p.interval.Milliseconds()
	b, err := codec.Marshal(hb)
	if err != nil {
		return err
	}
	return p.nc.Publish(p.subject, b)
}

// Run beats every interval until ctx ends. It is not safe to call Beat concurrently with
// Run from another goroutine; use Kick to ask Run for an immediate beat.
func (p *Publisher) Run(ctx context.Context, kick <-chan struct{}) {
	t := time.NewTicker(p.interval)
	defer t.Stop()
	p.Beat()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-kick:
		}
		p.Beat()
	}
}
