package health

import (
	"fmt"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/ortbus/ortbus/codec"
	"github.com/ortbus/ortbus/natsd"
)

func conn(t *testing.T) *nats.Conn {
	t.Helper()
	opts, err := natsd.ParseArgs([]string{"-p", "-1"})
	if err != nil {
		t.Fatal(err)
	}
	srv, err := natsd.Start(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Shutdown)
	nc, err := nats.Connect(srv.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	return nc
}

// listener is a Listener of optional funcs; Running is false (no process known).
type listener struct {
	dead    func(Worker)
	changed func()
	dropped func(string)
}

func (l listener) Dead(w Worker) {
	if l.dead != nil {
		l.dead(w)
	}
}

func (l listener) Changed() {
	if l.changed != nil {
		l.changed()
	}
}

func (l listener) Dropped(reason string) {
	if l.dropped != nil {
		l.dropped(reason)
	}
}

func (listener) Running(string) bool { return false }

func TestTrackerDeathAndRevival(t *testing.T) {
	nc := conn(t)
	dead := make(chan Worker, 4)
	changed := make(chan struct{}, 100)
	tr := &Tracker{MissCount: 3, Listener: listener{dead: func(w Worker) { dead <- w }, changed: func() {
		select {
		case changed <- struct{}{}:
		default:
		}
	}}}
	if err := tr.Start(nc); err != nil {
		t.Fatal(err)
	}
	defer tr.Stop()
	const interval = 50 * time.Millisecond
	pub, err := NewPublisher(nc, "cpu", "w1", interval, func() *codec.Heartbeat {
		return &codec.Heartbeat{Worker: "w1", Pool: "cpu", State: codec.StateReady, Slots: 2, Classes: []string{"batch"}}
	})
	if err != nil {
		t.Fatal(err)
	}
	pub.Beat()
	nc.Flush()
	<-changed
	if live := tr.Live("cpu"); len(live) != 1 || live[0].HB.Seq != 1 || live[0].HB.IntervalMS != 50 {
		t.Fatalf("live after one beat: %+v", live)
	}
	// Silence: judged dead after 3 intervals, not before.
	last := time.Now()
	w := <-dead
	if took := time.Since(last); took < 3*interval || took > 3*interval+200*time.Millisecond {
		t.Fatalf("death judged after %s; want 3 x %s (+ tick)", took, interval)
	}
	if w.HB.Worker != "w1" || w.Why != "heartbeat stopped" || len(tr.Live("cpu")) != 0 {
		t.Fatalf("dead worker %+v, live %v", w, tr.Live("cpu"))
	}
	// A dead worker that beats again is live again.
	pub.Beat()
	nc.Flush()
	for len(tr.Live("cpu")) == 0 {
		<-changed
	}
	// MarkDead is immediate and reported once.
	tr.MarkDead("w1", "cpu", "h", "exit code 1")
	w = <-dead
	if w.Why != "exit code 1" {
		t.Fatalf("MarkDead reason %q", w.Why)
	}
	tr.MarkDead("w1", "cpu", "h", "again")
	// One that died before its first heartbeat: recorded with its pool and host.
	tr.MarkDead("w-early", "cpu", "h", "exit code 2")
	found := false
	for _, w := range tr.Workers() {
		if w.HB.Worker == "w-early" {
			found = true
			if w.HB.Pool != "cpu" || w.HB.Host != "h" || !w.Dead || w.Why != "exit code 2" {
				t.Fatalf("a worker dead before its first beat: %+v", w)
			}
		}
	}
	if !found {
		t.Fatal("a worker dead before its first beat is not listed")
	}
	select {
	case w := <-dead:
		t.Fatalf("second death reported: %+v", w)
	default:
	}
	// Its draining beat, its last word, arriving after its exit was seen: still dead.
	b, _ := codec.Marshal(&codec.Heartbeat{Worker: "w1", Pool: "cpu", State: codec.StateDraining, Seq: 99, Slots: 2})
	nc.Publish("ortbus.hb.cpu.w1", b)
	nc.Flush()
	for {
		if w, ok := tr.Get("w1"); ok && w.HB.Seq == 99 {
			if !w.Dead || len(tr.Live("cpu")) != 0 {
				t.Fatalf("a draining beat after the exit brought w1 back: %+v", w)
			}
			break
		}
		<-changed
	}
}

func TestTrackerIgnoresGarbageAndFailed(t *testing.T) {
	nc := conn(t)
	changed := make(chan struct{}, 10)
	tr := &Tracker{Listener: listener{changed: func() { changed <- struct{}{} }}}
	if err := tr.Start(nc); err != nil {
		t.Fatal(err)
	}
	defer tr.Stop()
	nc.Publish("ortbus.hb.cpu.x", []byte("not msgpack"))
	b, _ := codec.Marshal(&codec.Heartbeat{Worker: "f1", Pool: "cpu", State: codec.StateFailed, Error: codec.Errorf(codec.CodeRuntimeMissing, "gone")})
	nc.Publish("ortbus.hb.cpu.f1", b)
	nc.Flush()
	<-changed
	ws := tr.Workers()
	if len(ws) != 1 || ws[0].HB.Worker != "f1" || ws[0].Live() || ws[0].HB.Error.Code != codec.CodeRuntimeMissing {
		t.Fatalf("workers %+v", ws)
	}
}

// Forged and broken heartbeats are dropped with a fixed reason and never tracked: a body
// naming another pool or worker than its subject, an untracked pool, a non-UTF-8 or
// over-long id, an unknown state, numbers out of range, and new ids past MaxPerPool.
func TestTrackerDropsForgedHeartbeats(t *testing.T) {
	nc := conn(t)
	drops := make(chan string, 100)
	tr := &Tracker{MissCount: 3, Pools: map[string]bool{"cpu": true}, MaxPerPool: 2, Listener: listener{dropped: func(r string) { drops <- r }}}
	if err := tr.Start(nc); err != nil {
		t.Fatal(err)
	}
	defer tr.Stop()
	good := func() *codec.Heartbeat {
		return &codec.Heartbeat{Worker: "w1", Pool: "cpu", State: codec.StateReady, Slots: 1, IntervalMS: 1000}
	}
	send := func(subject string, hb *codec.Heartbeat) {
		t.Helper()
		m, err := Message(subject, hb)
		if err != nil {
			t.Fatal(err)
		}
		if err := nc.PublishMsg(m); err != nil {
			t.Fatal(err)
		}
	}
	cases := []struct {
		subject string
		edit    func(*codec.Heartbeat)
		reason  string
	}{
		{"ortbus.hb.cpu.w1", func(h *codec.Heartbeat) { h.Pool = "cuda" }, "identity"},
		{"ortbus.hb.cpu.w2", func(h *codec.Heartbeat) {}, "identity"},
		{"ortbus.hb.cuda.w1", func(h *codec.Heartbeat) { h.Pool = "cuda" }, "pool"},
		{"ortbus.hb.cpu.w\xff", func(h *codec.Heartbeat) { h.Worker = "w\xff" }, "subject"}, // a subject token that is not UTF-8
		{"ortbus.hb.cpu.w1", func(h *codec.Heartbeat) { h.State = "bogus" }, "state"},
		{"ortbus.hb.cpu.w1", func(h *codec.Heartbeat) { h.Slots = 1 << 30 }, "range"},
		{"ortbus.hb.cpu.w1", func(h *codec.Heartbeat) { h.IntervalMS = -5 }, "range"},
		{"ortbus.hb.cpu.w1", func(h *codec.Heartbeat) { h.DeviceBytes, h.DeviceSource = math.MaxInt64, "nvidia-smi" }, "range"},
		{"ortbus.hb.cpu.w1", func(h *codec.Heartbeat) { h.RSSBytes = -1 }, "range"},
		{"ortbus.hb.cpu.w1", func(h *codec.Heartbeat) { h.Models = []codec.ModelStatus{{Name: "m", PeakBytes: math.MaxInt64 / 2}} }, "range"},
		{"ortbus.hb.cpu.w1", func(h *codec.Heartbeat) {
			h.Models = []codec.ModelStatus{{Name: "m", NodesByEP: map[string]int{"webgpu": -1}}}
		}, "range"},
		{"ortbus.hb.cpu.w1", func(h *codec.Heartbeat) {
			h.Models = []codec.ModelStatus{{Name: "m", NodesByEP: map[string]int{"webgpu": codec.MaxNodes + 1}}}
		}, "range"},
		{"ortbus.hb.cpu.w1", func(h *codec.Heartbeat) {
			n := map[string]int{}
			for i := range codec.MaxNodesByEP + 1 {
				n[fmt.Sprint("ep", i)] = 1
			}
			h.Models = []codec.ModelStatus{{Name: "m", NodesByEP: n}}
		}, "size"},
		{"ortbus.hb.cpu.w1", func(h *codec.Heartbeat) {
			h.Models = []codec.ModelStatus{{Name: "m", NodesByEP: map[string]int{strings.Repeat("e", codec.MaxIDLen+1): 1}}}
		}, "size"},
		{"ortbus.hb.cpu.w1", func(h *codec.Heartbeat) { h.DeviceSource = strings.Repeat("s", 2000) }, "size"},
		{"ortbus.hb.cpu.w1", func(h *codec.Heartbeat) { h.Adapter = strings.Repeat("a", 2000) }, "size"},
		{"ortbus.hb.cpu.w1", func(h *codec.Heartbeat) { h.AdapterMismatch = strings.Repeat("m", 2000) }, "size"},
		{"ortbus.hb.cpu.w1", func(h *codec.Heartbeat) { h.Host = strings.Repeat("h", 100000) }, "size"},
		{"ortbus.hb.cpu.w1", func(h *codec.Heartbeat) { h.Classes = make([]string, 1000) }, "size"},
		{"ortbus.hb.cpu.w1", func(h *codec.Heartbeat) {
			h.Error = codec.Errorf(codec.CodeInternal, "%s", strings.Repeat("e", 20000))
		}, "size"},
	}
	next := func() string {
		t.Helper()
		select {
		case r := <-drops:
			return r
		case <-time.After(10 * time.Second):
			t.Fatal("a heartbeat was not dropped")
		}
		return ""
	}
	for _, c := range cases {
		hb := good()
		c.edit(hb)
		send(c.subject, hb)
		if got := next(); got != c.reason {
			t.Fatalf("%s %+v: dropped as %q, want %q", c.subject, hb, got, c.reason)
		}
	}
	// Two ids fill the pool's bound; a third is dropped.
	for _, id := range []string{"a", "b", "c"} {
		hb := good()
		hb.Worker = id
		send("ortbus.hb.cpu."+id, hb)
	}
	if got := next(); got != "too_many_workers" {
		t.Fatalf("third id dropped as %q", got)
	}
	if ws := tr.Workers(); len(ws) != 2 || ws[0].HB.Worker != "a" || ws[1].HB.Worker != "b" {
		t.Fatalf("tracked %+v", ws)
	}
}

func TestSilent(t *testing.T) {
	t0 := time.Unix(1000, 0)
	for _, c := range []struct {
		after    time.Duration
		interval time.Duration
		miss     int
		want     bool
	}{
		{300 * time.Millisecond, 100 * time.Millisecond, 3, false}, // exactly the bound: not yet
		{301 * time.Millisecond, 100 * time.Millisecond, 3, true},
		{2 * time.Second, 0, 3, false}, // no interval: one second
		{3*time.Second + 1, -5, 3, true},
	} {
		if got := Silent(t0.Add(c.after), t0, c.interval, c.miss); got != c.want {
			t.Errorf("Silent after %v, interval %v x %d = %v, want %v", c.after, c.interval, c.miss, got, c.want)
		}
	}
}
