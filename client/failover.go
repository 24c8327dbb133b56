package client

import (
	"context"
	"errors"
	"slices"
	"sync"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/ortbus/ortbus/codec"
	"github.com/ortbus/ortbus/health"
	"github.com/ortbus/ortbus/subjects"
)

// Failover (Client.Failover; the gateway's side is in gateway/failover.go): the client
// follows the gateways' beats on ortbus.gw.*.hb, and when a gateway stops beating while
// a call waits, it sends the call's request again, same id, with the header
// Ortbus-Resend. Whichever gateway takes the resend runs it, answers it from what the
// answers bucket kept, or answers Ortbus-Held when a live gateway still holds it (the
// call then goes on waiting). The call returns the first answer that is not a notice.
//
// A call knows its holder once a notice names it: from then on only that gateway's death
// makes it send again (a peer that flaps or crash-loops does not spend its resends);
// before, when the holder is not known, any gateway's death does.
//
// Under deploy/cluster's permissions the client role may subscribe to ortbus.gw.*.hb.

// Failover's bounds.
const (
	// defaultMissCount is how many beat intervals of silence make a gateway dead.
	defaultMissCount = 3
	// maxResends bounds the resends of one call.
	maxResends = 8
)

// beats follows the gateways' beats and tells waiting calls when one dies.
type beats struct {
	missCount int
	mu        sync.Mutex
	sub       *nats.Subscription
	peers     map[string]*gwBeat
	died      chan struct{} // closed, and replaced, when a gateway is judged dead
	total     uint64        // gateways judged dead so far (each death of each)
	stop      chan struct{}
}

type gwBeat struct {
	seen     time.Time
	interval time.Duration
	dead     bool
	deaths   uint64 // times it was judged dead
}

// watch starts following the beats (once per client).
func (c *Client) watch() (*beats, error) {
	c.beatsOnce.Do(func() {
		b := &beats{missCount: c.MissCount, peers: map[string]*gwBeat{}, died: make(chan struct{}), stop: make(chan struct{})}
		if b.missCount <= 0 {
			b.missCount = defaultMissCount
		}
		b.sub, c.beatsErr = c.nc.Subscribe(subjects.GWAll, b.hear)
		if c.beatsErr != nil {
			return
		}
		go b.judge()
		c.beats = b
	})
	return c.beats, c.beatsErr
}

// hear records a gateway's beat.
func (b *beats) hear(m *nats.Msg) {
	ps, err := subjects.Parse(m.Subject)
	if err != nil || ps.Kind != subjects.KindGateway || ps.Verb != "hb" {
		return
	}
	var beat codec.GatewayBeat
	if codec.Unmarshal(m.Data, &beat) != nil || beat.Gateway != ps.Worker || beat.IntervalMS <= 0 || beat.IntervalMS > time.Hour.Milliseconds() {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	p := b.peers[ps.Worker]
	if p == nil {
		if len(b.peers) >= 256 {
			return
		}
		p = &gwBeat{}
		b.peers[ps.Worker] = p
	}
	p.seen, p.interval, p.dead = time.Now(), time.Duration(beat.IntervalMS)*time.Millisecond, false
}

// judge marks silent gateways dead and wakes the waiting calls, until close.
func (b *beats) judge() {
	t := time.NewTicker(20 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-b.stop:
			return
		case now := <-t.C:
			b.mu.Lock()
			for id, p := range b.peers {
				if p.dead || !health.Silent(now, p.seen, p.interval, b.missCount) {
					continue
				}
				p.dead = true
				p.deaths++
				b.total++
				if now.Sub(p.seen) > time.Hour {
					delete(b.peers, id)
				}
				close(b.died)
				b.died = make(chan struct{})
			}
			b.mu.Unlock()
		}
	}
}

// Gateways starts following the gateways' beats, if the client is not doing so yet,
// and returns the gateways heard beating now. A gateway that dies before the client has
// heard it is never judged dead: a client with failover calls this at start, before
// its first requests, and waits until it hears the gateways it expects.
func (c *Client) Gateways() ([]string, error) {
	b, err := c.watch()
	if err != nil {
		return nil, err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	var out []string
	for id, p := range b.peers {
		if !p.dead {
			out = append(out, id)
		}
	}
	slices.Sort(out)
	return out, nil
}

// closedCh is a channel that is closed.
var closedCh = func() chan struct{} { c := make(chan struct{}); close(c); return c }()

// deaths is closed once more than seen gateway deaths have been judged (at once if they
// have been).
func (b *beats) deaths(seen uint64) <-chan struct{} {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.total > seen {
		return closedCh
	}
	return b.died
}

// judged is how many gateway deaths have been judged so far.
func (b *beats) judged() uint64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.total
}

// isDead reports whether gateway id is judged dead, its beat interval, and how many
// times it was judged dead.
func (b *beats) isDead(id string) (known, dead bool, interval time.Duration, deaths uint64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	p := b.peers[id]
	if p == nil {
		return false, false, 0, 0
	}
	return true, p.dead, p.interval, p.deaths
}

func (b *beats) close() {
	if b != nil {
		close(b.stop)
		b.sub.Unsubscribe()
	}
}

// requestFailover sends a call's request and waits for its answer, sending it again
// when a gateway dies meanwhile (see the top of this file).
func (c *Client) requestFailover(ctx context.Context, subj string, data []byte) (*nats.Msg, error) {
	b, err := c.watch()
	if err != nil {
		return nil, err
	}
	// Every send ends with the call: a request held by a dead gateway is never answered.
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	type result struct {
		m   *nats.Msg
		err error
	}
	results := make(chan result, maxResends+1)
	send := func(resend bool) {
		msg := nats.NewMsg(subj)
		msg.Data = data
		setTrace(ctx, msg)
		if resend {
			msg.Header.Set(codec.HeaderResend, "1")
		}
		go func() {
			m, err := c.nc.RequestMsgWithContext(ctx, msg)
			results <- result{m, err}
		}()
	}
	seen := b.judged() // deaths judged before the call are not its business
	send(false)
	waiting, resends := 1, 0
	var retry <-chan time.Time // a resend to send again later
	// holder is the gateway the last notice named as holding the call ("": not known),
	// and holderDeaths its deaths then: a death of another gateway does not resend.
	holder, holderDeaths := "", uint64(0)
	resend := func() {
		if resends < maxResends {
			resends++
			waiting++
			send(true)
		}
	}
	for {
		died := b.deaths(seen)
		select {
		case r := <-results:
			waiting--
			switch {
			case r.err == nil && r.m.Header.Get(codec.HeaderHeld) != "":
				// Held by a live gateway: wait for its answer. A gateway this client
				// already judged dead but the answering gateway not yet: ask again
				// after one of its beats.
				held := r.m.Header.Get(codec.HeaderHeld)
				known, dead, iv, deaths := b.isDead(held)
				if known {
					// Only a holder this client hears beat is one whose death it will
					// see: pinned then; else any gateway's death still sends again.
					holder, holderDeaths = held, deaths
				}
				if dead {
					retry = time.After(iv)
				}
			case r.err == nil:
				return r.m, nil
			case errors.Is(r.err, nats.ErrNoResponders) && waiting > 0:
				// No gateway right now (they are restarting): ask again shortly.
				retry = time.After(100 * time.Millisecond)
			case waiting > 0 || retry != nil:
			default:
				return nil, r.err
			}
		case <-died:
			seen = b.judged()
			if holder != "" {
				if _, _, _, n := b.isDead(holder); n == holderDeaths {
					continue // another gateway died: the holder still has the call
				}
			}
			holder = "" // the holder died: the resend's answer says who holds it now
			resend()
		case <-retry:
			retry = nil
			resend()
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}
