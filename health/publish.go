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
	// OnError, if set, is told of every beat Run could not publish.
	OnError func(error)

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
	m, err := Message(p.subject, hb)
	if err != nil {
		return err
	}
	return p.nc.PublishMsg(m)
}

// Message encodes a heartbeat for subject. Heartbeats travel as JSON with the header
// Content-Type: application/json, so that `nats sub 'ortbus.hb.>'` shows them readably
// (one a second per worker: the size does not matter); Decode also reads msgpack.
func Message(subject string, hb *codec.Heartbeat) (*nats.Msg, error) {
	b, err := codec.Encode(hb, true)
	if err != nil {
		return nil, err
	}
	m := nats.NewMsg(subject)
	m.Header.Set(codec.HeaderContentType, codec.ContentTypeJSON)
	m.Data = b
	return m, nil
}

// Decode reads a heartbeat message, JSON or msgpack as its Content-Type header says.
func Decode(m *nats.Msg, hb *codec.Heartbeat) error {
	return codec.Decode(m.Data, hb, m.Header.Get(codec.HeaderContentType) == codec.ContentTypeJSON)
}

// Run beats every interval until ctx ends. It is not safe to call Beat concurrently with
// Run from another goroutine; a send on kick asks Run for an immediate beat.
func (p *Publisher) Run(ctx context.Context, kick <-chan struct{}) {
	t := time.NewTicker(p.interval)
	defer t.Stop()
	p.beat()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-kick:
		}
		p.beat()
	}
}

// beat is Beat, with a failure handed to OnError.
func (p *Publisher) beat() {
	if err := p.Beat(); err != nil && p.OnError != nil {
		p.OnError(err)
	}
}
