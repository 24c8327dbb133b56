package gateway

import (
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/ortbus/ortbus/codec"
	"github.com/ortbus/ortbus/sched"
)

// Rules 3 and 4: a pause must say how long (bounded), names a configured class and
// device; resume ends only the caller's own, the class staying paused while another's
// lasts; a pause ends on its own at its time.
func TestPauseRules(t *testing.T) {
	g := testGateway(t, routeConfig)
	now := time.Unix(1_000_000, 0)
	pauseNow = func() time.Time { return now }
	t.Cleanup(func() { pauseNow = time.Now })
	for _, bad := range []codec.PauseRequest{
		{Class: "batch"}, // no for_ms
		{Class: "batch", ForMS: 500},
		{Class: "batch", ForMS: (2 * time.Hour).Milliseconds()},
		{Class: "nope", ForMS: 60_000},
		{Class: "batch", Device: "tpu:9", ForMS: 60_000},
		{Action: "freeze", Class: "batch", ForMS: 60_000},
	} {
		if _, e := g.pauses.pause(g.conf(), &bad, ""); e == nil || e.Code != codec.CodeBadRequest {
			t.Errorf("%+v: %v, want bad_request", bad, e)
		}
	}
	// Rule 5: an application pauses batch, not interactive; the local owner may.
	if _, e := g.pauses.pause(g.conf(), &codec.PauseRequest{Class: "interactive", ForMS: 60_000}, "account:A"); e == nil || e.Code != codec.CodeBadRequest {
		t.Errorf("an account's pause of interactive: %v, want bad_request", e)
	}
	if _, e := g.pauses.pause(g.conf(), &codec.PauseRequest{Class: "interactive", ForMS: 1000}, ""); e != nil {
		t.Errorf("the local owner's pause of interactive: %v", e)
	}
	g.pauses.pause(g.conf(), &codec.PauseRequest{Action: codec.PauseResume, Class: "interactive"}, "")
	a, e := g.pauses.pause(g.conf(), &codec.PauseRequest{Class: "batch", ForMS: 60_000}, "account:A")
	if e != nil || a.UntilUnixMS != now.Add(time.Minute).UnixMilli() {
		t.Fatalf("A's pause: %+v %v", a, e)
	}
	if _, e := g.pauses.pause(g.conf(), &codec.PauseRequest{Class: "batch", ForMS: 10_000}, "account:B"); e != nil {
		t.Fatal(e)
	}
	if r, _ := g.pauses.pause(g.conf(), &codec.PauseRequest{Action: codec.PauseResume, Class: "batch"}, "account:C"); r.Resumed {
		t.Error("C resumed another's pause")
	}
	if r, _ := g.pauses.pause(g.conf(), &codec.PauseRequest{Action: codec.PauseResume, Class: "batch"}, "account:B"); !r.Resumed {
		t.Error("B's resume of its own pause found nothing")
	}
	if !g.pauses.held(now).holds("batch", "cuda:0", "account:A") {
		t.Fatal("A's batch not paused while A's pause lasts")
	}
	if l := g.pauses.list(now, ""); len(l) != 1 || l[0].Class != "batch" || l[0].Owner != "account:A" || l[0].UntilUnixMS != a.UntilUnixMS {
		t.Fatalf("status list %+v", l)
	}
	now = now.Add(time.Minute) // A's pause ends on its own
	if len(g.pauses.held(now)) != 0 || len(g.pauses.list(now, "")) != 0 {
		t.Fatal("a pause outlived its time")
	}
}

// Rules 5 and 6: an account's pause holds only its own work (its requests, its jobs'
// items), never another account's nor the local owner's, and stops no job intake; the
// operator's holds everyone's. Status shows each account its own pauses and the
// operator's, with their owners; the operator every one.
func TestPauseScope(t *testing.T) {
	g := testGateway(t, routeConfig)
	f := newFleet(t, g)
	f.ready("bulk", "bulk-1", 2, "interactive", "batch")
	if _, e := g.pauses.pause(g.conf(), &codec.PauseRequest{Class: "batch", ForMS: 60_000}, "account:A"); e != nil {
		t.Fatal(e)
	}
	itemOf := func(account, jobOwner string) *sched.Item {
		it := newItem("batch", "tag", soon(), "bulk")
		p := it.Value.(*pending)
		p.account = account
		if jobOwner != "" {
			p.owner, p.jobOwner = ownerJob, jobOwner
		}
		return it
	}
	c := g.d.snapshot(time.Now(), g.d.lc.held())
	for _, x := range []struct {
		what              string
		account, jobOwner string
		held              bool
	}{
		{"A's request", "account:A", "", true},
		{"an item of A's job", "", "account:A", true},
		{"B's request", "account:B", "", false},
		{"an item of B's job", "", "account:B", false},
		{"the local owner's request", "", "", false},
	} {
		pool := routeOK(t, nextPass(c), itemOf(x.account, x.jobOwner), nil)
		if held := pool == ""; held != x.held {
			t.Errorf("%s under A's pause of batch: routed to %q, want held %v", x.what, pool, x.held)
		}
	}
	// A's held request holds neither its pool nor its device from the work behind it.
	if d := c.place(itemOf("account:A", ""), nil); d.pool != "" || d.err != nil || !d.own["bulk"] {
		t.Errorf("A's request under its own pause: %+v, want held, bulk its owner's", d)
	}
	if n := g.jobs.room(nil); n == 0 {
		t.Error("A's pause stopped every job's intake")
	}
	// The operator's pause holds everyone's.
	if _, e := g.pauses.pause(g.conf(), &codec.PauseRequest{Class: "batch", ForMS: 60_000}, ""); e != nil {
		t.Fatal(e)
	}
	c = g.d.snapshot(time.Now(), g.d.lc.held())
	if d := c.place(itemOf("account:A", ""), nil); d.pool != "" || len(d.own) != 0 {
		t.Errorf("A's request under the operator's pause too: %+v, want held as the operator's pause holds, its pools reserved", d)
	}
	for _, account := range []string{"account:B", ""} {
		if pool := routeOK(t, nextPass(c), itemOf(account, ""), nil); pool != "" {
			t.Errorf("%q's request under the operator's pause routed to %q", account, pool)
		}
	}
	if n := g.jobs.room(nil); n != 0 {
		t.Errorf("job room %d under the operator's pause of batch", n)
	}
	if _, e := g.pauses.pause(g.conf(), &codec.PauseRequest{Class: "batch", ForMS: 60_000}, "account:B"); e != nil {
		t.Fatal(e)
	}
	owners := func(viewer string) []string {
		var out []string
		for _, p := range g.status(viewer).Pauses {
			out = append(out, p.Class+"/"+p.Owner)
		}
		return out
	}
	for viewer, want := range map[string][]string{
		"":          {"batch/", "batch/account:A", "batch/account:B"},
		"account:A": {"batch/", "batch/account:A"},
		"account:C": {"batch/"},
	} {
		if got := owners(viewer); !slices.Equal(got, want) {
			t.Errorf("pauses in %q's status: %v, want %v", viewer, got, want)
		}
	}
}

// Rule 1: while batch is paused on cuda:0 its items wait for the pools there and go to a
// pool on another device; interactive items route as before; a resume lets them go.
// Rule 2: no job items on a paused device.
func TestPauseRoutes(t *testing.T) {
	g := testGateway(t, routeConfig)
	f := newFleet(t, g)
	f.ready("bulk", "bulk-1", 2, "interactive", "batch")
	if _, e := g.pauses.pause(g.conf(), &codec.PauseRequest{Class: "batch", Device: "cuda:0", ForMS: 60_000}, ""); e != nil {
		t.Fatal(e)
	}
	c := g.d.snapshot(time.Now(), g.d.lc.held())
	if pool := routeOK(t, c, newItem("batch", "tag", soon(), "bulk"), nil); pool != "" {
		t.Fatalf("batch routed to %q while paused on cuda:0", pool)
	}
	if pool := routeOK(t, c, newItem("interactive", "tag", soon(), "bulk"), nil); pool != "bulk" {
		t.Fatalf("interactive routed to %q, want bulk", pool)
	}
	if n := g.jobs.room(nil); n != 0 {
		t.Errorf("job room %d with batch paused on the one batch pool's device", n)
	}
	if _, e := g.pauses.pause(g.conf(), &codec.PauseRequest{Action: codec.PauseResume, Class: "batch", Device: "cuda:0"}, ""); e != nil {
		t.Fatal(e)
	}
	c = g.d.snapshot(time.Now(), g.d.lc.held())
	if pool := routeOK(t, c, newItem("batch", "tag", soon(), "bulk"), nil); pool != "bulk" {
		t.Fatalf("batch after the resume routed to %q, want bulk", pool)
	}
	if n := g.jobs.room(nil); n == 0 {
		t.Error("no job room after the resume")
	}
}

// Jobs take no new items outside the quiet hours of [jobs] windows, and do inside them.
func TestJobRoomWindows(t *testing.T) {
	g := testGateway(t, routeConfig)
	newFleet(t, g).ready("bulk", "bulk-1", 2, "interactive", "batch")
	now := time.Date(2026, 12, 3, 12, 0, 0, 0, time.Local)
	pauseNow = func() time.Time { return now }
	t.Cleanup(func() { pauseNow = time.Now })
	g.conf().Jobs.Windows = []string{"22:00-07:00"}
	if n := g.jobs.room(nil); n != 0 {
		t.Errorf("job room %d at noon, outside 22:00-07:00", n)
	}
	now = time.Date(2026, 12, 3, 23, 0, 0, 0, time.Local)
	if n := g.jobs.room(nil); n == 0 {
		t.Error("no job room at 23:00, inside 22:00-07:00")
	}
}

// Rule 5 on a chain of two devices: A's pause of batch on cuda:0 keeps A's batch request
// from bulk (there) only; while it waits for spare it reserves spare alone, leaving bulk
// to the others' work, and it waits (not no_worker) though spare has no live worker.
func TestPauseScopeOneDevice(t *testing.T) {
	g := testGateway(t, routeConfig)
	newFleet(t, g).ready("bulk", "bulk-1", 2, "interactive", "batch")
	if _, e := g.pauses.pause(g.conf(), &codec.PauseRequest{Class: "batch", Device: "cuda:0", ForMS: 60_000}, "account:A"); e != nil {
		t.Fatal(e)
	}
	route := passRouter(g, time.Now())
	a := newItem("batch", "tag", soon(), "bulk", "spare")
	a.Value.(*pending).account = "account:A"
	pool, err := route(a, map[string]bool{})
	var waits sched.Waits
	if pool != "" || !errors.As(err, &waits) || !slices.Equal(waits.Pools, []string{"spare"}) {
		t.Fatalf("A's batch request under its pause on cuda:0: %q %v, want it waiting, holding spare alone", pool, err)
	}
	b := newItem("batch", "tag", soon(), "bulk", "spare")
	b.Value.(*pending).account = "account:B"
	if pool, err := route(b, map[string]bool{"spare": true}); pool != "bulk" || err != nil {
		t.Fatalf("B's batch request behind it: %q %v, want bulk", pool, err)
	}
}
