package client

import (
	"context"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/ortbus/ortbus/codec"
	"github.com/ortbus/ortbus/internal/testkit/testenv"
	"github.com/ortbus/ortbus/subjects"
)

// fakeGateways beats for gateways on a NATS connection (every 10 ms while alive) and
// answers ortbus.v1.tag for them: a first send is held (never answered here; firsts
// tells of it); a resend is answered with the notice "Ortbus-Held: <holder>" while the
// holder beats, and with a result once it does not (as a gateway that runs a request
// whose holder died).
type fakeGateways struct {
	nc      *nats.Conn
	holder  string
	mu      sync.Mutex
	alive   map[string]bool
	resends atomic.Int32
	firsts  chan struct{}
	stop    chan struct{}
	done    chan struct{}
}

func newFakeGateways(t *testing.T, nc *nats.Conn, holder string, ids ...string) *fakeGateways {
	t.Helper()
	f := &fakeGateways{nc: nc, holder: holder, alive: map[string]bool{}, firsts: make(chan struct{}, 16),
		stop: make(chan struct{}), done: make(chan struct{})}
	for _, id := range ids {
		f.alive[id] = true
	}
	if _, err := nc.QueueSubscribe(subjects.APIPrefix+"."+subjects.OpTag, subjects.GatewayQueue, f.serve); err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	go f.beat()
	t.Cleanup(func() { close(f.stop); <-f.done })
	return f
}

func (f *fakeGateways) set(id string, alive bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.alive[id] = alive
}

func (f *fakeGateways) isAlive(id string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.alive[id]
}

func (f *fakeGateways) beat() {
	defer close(f.done)
	t := time.NewTicker(10 * time.Millisecond)
	defer t.Stop()
	var seq uint64
	for {
		f.mu.Lock()
		for id, alive := range f.alive {
			if alive {
				seq++
				b, _ := codec.Marshal(&codec.GatewayBeat{Gateway: id, Seq: seq, IntervalMS: 10})
				f.nc.Publish("ortbus.gw."+id+".hb", b)
			}
		}
		f.mu.Unlock()
		select {
		case <-f.stop:
			return
		case <-t.C:
		}
	}
}

func (f *fakeGateways) serve(m *nats.Msg) {
	if m.Header.Get(codec.HeaderResend) == "" {
		select {
		case f.firsts <- struct{}{}:
		default:
		}
		return // the first send: held by the holder, which answers nothing here
	}
	f.resends.Add(1)
	if f.isAlive(f.holder) {
		r := nats.NewMsg(m.Reply)
		r.Header.Set(codec.HeaderHeld, f.holder)
		f.nc.PublishMsg(r)
		return
	}
	b, _ := codec.Marshal(&codec.TagReply{General: map[string]float32{"blue": 0.99}})
	m.Respond(b)
}

// firstSent waits until a call's first send reaches the gateways: the call is waiting
// for its answer, and every gateway death judged from then on is its business.
func (f *fakeGateways) firstSent(t *testing.T) {
	t.Helper()
	select {
	case <-f.firsts:
	case <-time.After(10 * time.Second):
		t.Fatal("the call's first send never reached the gateways")
	}
}

// waitGateways waits until the client hears exactly want beating.
func waitGateways(t *testing.T, c *Client, want ...string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		got, err := c.Gateways()
		if err != nil {
			t.Fatal(err)
		}
		if slices.Equal(got, want) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("gateways heard: %v, want %v", got, want)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// TestFailoverBudgetHolderOnly: a call held by gateway fx while its peer fy flaps (judged
// dead and heard again ten times, more than maxResends) keeps its resends for fx: when fx
// dies, the call is sent again and answered. Before, every death of fy spent a resend and
// the call then waited to its deadline.
func TestFailoverBudgetHolderOnly(t *testing.T) {
	nc := testenv.InProcessNATS(t)
	c := New(nc)
	c.Failover, c.MissCount = true, 2
	defer c.beats.close()
	f := newFakeGateways(t, nc, "fx", "fx", "fy")
	waitGateways(t, c, "fx", "fy")

	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	type outcome struct {
		r   *codec.TagReply
		err error
	}
	done := make(chan outcome, 1)
	go func() {
		r, err := c.Tag(ctx, codec.Request{ID: "flap-1", Path: "/srv/flap.png"})
		done <- outcome{r, err}
	}()
	f.firstSent(t) // the first send is out, held by fx
	for i := range 2 * maxResends {
		f.set("fy", false)
		waitGateways(t, c, "fx")
		f.set("fy", true)
		waitGateways(t, c, "fx", "fy")
		select {
		case o := <-done:
			t.Fatalf("the call ended while fx held it (fy's death %d): %+v, %v", i+1, o.r, o.err)
		default:
		}
	}
	spent := f.resends.Load()
	// fx's own deaths while fy flapped: beats every 10 ms judged after two misses, so a
	// loaded machine that stalls the beating goroutine for 20 ms judges the holder dead
	// — and a holder's death rightly sends again. Those resends are not fy's.
	_, _, _, fxDeaths := c.beats.isDead("fx")
	f.set("fx", false)
	start := time.Now()
	o := <-done
	if o.err != nil {
		t.Fatalf("the call after its holder died (%d resends before): %v", spent, o.err)
	}
	if o.r.General["blue"] < 0.9 {
		t.Fatalf("the call's answer: %+v", o.r)
	}
	t.Logf("answered %v after fx stopped beating; resends: %d during fy's %d deaths, %d in all",
		time.Since(start).Round(time.Millisecond), spent, 2*maxResends, f.resends.Load())
	// One resend for fy's first death (the holder not known yet: its notice names fx),
	// one more if fy's next death was judged before that notice was read, none for the
	// others; and one for each death of fx itself judged meanwhile.
	if spent > 2+int32(fxDeaths) {
		t.Errorf("%d resends while fx held the call (fx judged dead %d times meanwhile) and fy died %d times, want at most %d", spent, fxDeaths, 2*maxResends, 2+fxDeaths)
	}
}

// TestFailoverUnknownHolder: a call whose holder is not known yet (no notice named one)
// is sent again on any gateway's death: the dead one may be its holder.
func TestFailoverUnknownHolder(t *testing.T) {
	nc := testenv.InProcessNATS(t)
	c := New(nc)
	c.Failover, c.MissCount = true, 2
	defer c.beats.close()
	f := newFakeGateways(t, nc, "gone", "fx", "fy", "gone")
	waitGateways(t, c, "fx", "fy", "gone")
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	errc := make(chan error, 1)
	go func() {
		_, err := c.Tag(ctx, codec.Request{ID: "unknown-1", Path: "/srv/u.png"})
		errc <- err
	}()
	f.firstSent(t)
	f.set("gone", false) // the holder (never named by a notice) dies: the resend is answered
	select {
	case err := <-errc:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("no answer after the holder died (%d resends)", f.resends.Load())
	}
	if n := f.resends.Load(); n != 1 {
		t.Errorf("%d resends, want 1", n)
	}
}
