package test

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/ortbus/ortbus/codec"
	"github.com/ortbus/ortbus/config"
	"github.com/ortbus/ortbus/natsd"
)

// The acceptance tests of the gateway: real gateway processes (with their embedded NATS
// or an external one) supervising real ortworker processes on both runtime versions,
// driven only through the client API (ortbus.v1.<op>, HTTP /metrics, the nats CLI) and
// judged by replies, claims and work items seen on the bus, status and process ids.

// The heartbeat interval and miss count of every gateway config here (gwConfig.write and
// the hostile stack): a silent worker is dead after gwMissCount × gwHeartbeat.
const (
	gwHeartbeat = 200 * time.Millisecond
	gwMissCount = 3
)

// TestGatewayRouting checks routing on the shared gateway: batch work runs on bt while
// interactive requests are served by ia (both classes in service at once), an explicit
// pool is honoured, an unknown pool fails with unknown_pool and a pool that does not serve
// the class with bad_request.
func TestGatewayRouting(t *testing.T) {
	g, img := sharedGateway(t)
	claims := newGWSpy(t, g.NC, "ortbus.claim.>")
	in := newInbox(t, g.NC)
	ia0, bt0 := g.supervised(t, "ia", 0), g.supervised(t, "bt", 0)
	// Batch work on bt, queued and running...
	const nBatch = 8
	for i := 0; i < nBatch; i++ {
		g.post(t, in, "tag", fmt.Sprintf("b%d", i), &codec.Request{ID: fmt.Sprintf("route-b%d", i), Path: img["blue"], Class: "batch", Model: gwSlow})
	}
	gwClaimOf(t, claims, "route-b0")
	// ...while interactive requests are served by ia, one after the other.
	for i := 0; i < 4; i++ {
		start := time.Now()
		r := g.call(t, "tag", &codec.Request{Path: img["red"], Model: gwTagger}, gwReplyBound)
		tr := r.tag(t)
		if tr.Pool != "ia" || tr.Worker != ia0 || tr.Runtime != "1.30.0" {
			t.Errorf("interactive request served by pool %s worker %s runtime %s, want ia %s 1.30.0", tr.Pool, tr.Worker, tr.Runtime, ia0)
		}
		checkColourTag(t, tr, "red")
		t.Logf("interactive %d: %v (timing %+v)", i, time.Since(start).Round(time.Microsecond), tr.Timing)
	}
	// An explicit pool is honoured even though the class's first pool is free.
	r := g.call(t, "tag", &codec.Request{Path: img["green"], Model: gwTagger, Pool: "bt"}, gwReplyBound)
	tr := r.tag(t)
	if tr.Pool != "bt" || tr.Worker != bt0 || tr.Runtime != "1.24.3" {
		t.Errorf("pool: bt request served by pool %s worker %s runtime %s, want bt %s 1.24.3", tr.Pool, tr.Worker, tr.Runtime, bt0)
	}
	checkColourTag(t, tr, "green")
	// Both classes were in service at the same time: batch work was still going on.
	if n := len(in.ch); n >= nBatch {
		t.Errorf("all %d batch answers were in before the interactive requests were done: no overlap", n)
	}
	order, got := gwCollect(t, in, nBatch)
	for _, k := range order {
		tr := got[k].tag(t)
		if tr.Pool != "bt" || tr.Worker != bt0 || tr.Runtime != "1.24.3" {
			t.Errorf("batch %s served by pool %s worker %s runtime %s, want bt %s 1.24.3", k, tr.Pool, tr.Worker, tr.Runtime, bt0)
		}
		checkColourTag(t, tr, "blue")
	}

	// An unknown pool fails at once, and never silently elsewhere.
	r = g.call(t, "tag", &codec.Request{Path: img["red"], Pool: "nope"}, gwReplyBound)
	if r.code() != string(codec.CodeUnknownPool) || r.Err.Details["pool"] != "nope" {
		t.Errorf("pool nope: got %s %v, want unknown_pool naming the pool", r.code(), r.Err)
	}
	// A pool that does not serve the class is refused too.
	r = g.call(t, "tag", &codec.Request{Path: img["red"], Pool: "ia", Class: "batch"}, gwReplyBound)
	if r.code() != string(codec.CodeBadRequest) {
		t.Errorf("batch request with pool ia: got %s, want bad_request", r.code())
	}
}

// TestGatewayReuse sends 200 requests, 8 at a time, through the shared gateway: the same
// two worker processes serve them all, with no new session, no restart and no other child
// process of the gateway.
func TestGatewayReuse(t *testing.T) {
	g, img := sharedGateway(t)
	before := g.waitStatus(t, "both workers live", func(st *codec.StatusReply) bool {
		return len(gwLive(st, "ia")) == 1 && len(gwLive(st, "bt")) == 1
	})
	kids := gwChildPIDs(t, g.lp.PID())
	slices.Sort(kids)
	var servedBefore uint64
	for _, w := range before.Workers {
		servedBefore += w.Served
	}
	const n, conc = 200, 8
	start := time.Now()
	msgs := make(chan *nats.Msg, n)
	errs := make(chan error, n)
	for c := 0; c < conc; c++ {
		go func() {
			b, _ := codec.Marshal(&codec.Request{Path: img["red"], Model: gwTagger})
			for i := 0; i < n/conc; i++ {
				m, err := g.NC.Request("ortbus.v1.tag", b, gwReplyBound)
				if err != nil {
					errs <- err
					continue
				}
				msgs <- m
			}
		}()
	}
	perPool := map[string]int{}
	for i := 0; i < n; i++ {
		select {
		case err := <-errs:
			t.Fatalf("request %d: %v", i, err)
		case m := <-msgs:
			tr := gwDecode(t, m).tag(t)
			perPool[tr.Worker]++
		}
	}
	t.Logf("%d requests in %v, by worker %v", n, time.Since(start).Round(time.Millisecond), perPool)
	after := g.waitStatus(t, "the served counters to count them", func(st *codec.StatusReply) bool {
		var s uint64
		for _, w := range st.Workers {
			s += w.Served
		}
		return s >= servedBefore+n
	})
	for _, pool := range []string{"ia", "bt"} {
		for id, w0 := range gwLive(before, pool) {
			w1, ok := gwLive(after, pool)[id]
			switch {
			case !ok:
				t.Errorf("worker %s is no longer live after %d requests", id, n)
			case w1.PID != w0.PID:
				t.Errorf("worker %s: pid %d became %d", id, w0.PID, w1.PID)
			case w1.SessionsCreated != w0.SessionsCreated:
				t.Errorf("worker %s: sessions_created %d became %d", id, w0.SessionsCreated, w1.SessionsCreated)
			case w1.Restarts != 0:
				t.Errorf("worker %s restarted %d times", id, w1.Restarts)
			default:
				t.Logf("worker %s: pid %d, sessions_created %d, served %d -> %d", id, w1.PID, w1.SessionsCreated, w0.Served, w1.Served)
			}
		}
	}
	if got := len(after.Workers); got != 2 {
		t.Errorf("status lists %d workers, want 2", got)
	}
	kidsAfter := gwChildPIDs(t, g.lp.PID())
	slices.Sort(kidsAfter)
	if !slices.Equal(kids, kidsAfter) || len(kids) != 2 {
		t.Errorf("gateway's child processes %v became %v, want the same two", kids, kidsAfter)
	}
}

// TestGatewayPriorityAndDeadline queues 30 slow batch items on bt, then an interactive
// request for bt and a batch request of timeout_ms 1: the interactive one overtakes every
// queued batch item, the expired one is answered deadline_exceeded at once and never
// dispatched, and bt's worker counts exactly the 31 results.
func TestGatewayPriorityAndDeadline(t *testing.T) {
	g, img := sharedGateway(t)
	claims := newGWSpy(t, g.NC, "ortbus.claim.>")
	dispatched := newGWSpy(t, g.NC, "infer.bt.>")
	in := newInbox(t, g.NC)
	bt0ID := g.supervised(t, "bt", 0)
	bt0, ok := gwLive(g.status(t), "bt")[bt0ID]
	if !ok {
		t.Fatalf("%s is not live", bt0ID)
	}
	const nBatch = 30
	for i := 0; i < nBatch; i++ {
		id := fmt.Sprintf("b%02d", i)
		g.post(t, in, "tag", id, &codec.Request{ID: id, Path: img["blue"], Class: "batch", Model: gwSlow})
	}
	gwClaimOf(t, claims, "b00") // bt's one slot is busy; b01..b29 wait in the gateway
	sentDL := g.post(t, in, "tag", "dl", &codec.Request{ID: "dl", Path: img["blue"], Class: "batch", Model: gwSlow, TimeoutMS: 1})
	sentInt := g.post(t, in, "tag", "int", &codec.Request{ID: "int", Path: img["red"], Class: "interactive", Pool: "bt", Model: gwSlow})
	order, got := gwCollect(t, in, nBatch+2)

	// The interactive request overtook every queued batch item.
	okBefore := 0
	for _, k := range order {
		if k == "int" {
			break
		}
		if k != "dl" {
			okBefore++
		}
	}
	ti := got["int"].tag(t)
	if ti.Pool != "bt" {
		t.Errorf("interactive request with pool bt served by %s", ti.Pool)
	}
	if okBefore > 1 {
		t.Errorf("interactive answer came after %d batch answers, want at most the 1 running when it arrived; order %v", okBefore, order)
	}
	last := got[order[len(order)-1]].tag(t)
	t.Logf("interactive: answered after %d batch item(s), %v after submission, queue %v infer %v; last batch item queued %v",
		okBefore, got["int"].At.Sub(sentInt).Round(time.Millisecond), time.Duration(ti.Timing.QueueUS)*time.Microsecond,
		time.Duration(ti.Timing.InferUS)*time.Microsecond, time.Duration(last.Timing.QueueUS)*time.Microsecond)
	for _, k := range order {
		if k == "int" || k == "dl" {
			continue
		}
		if tr := got[k].tag(t); tr.Pool != "bt" || (k > "b01" && tr.Timing.QueueUS < ti.Timing.QueueUS) {
			t.Errorf("batch %s: pool %s, queue_us %d (interactive %d)", k, tr.Pool, tr.Timing.QueueUS, ti.Timing.QueueUS)
		}
	}

	// The 1 ms request behind the queue: deadline_exceeded at once, never dispatched.
	if c := got["dl"].code(); c != string(codec.CodeDeadlineExceeded) {
		t.Errorf("timeout_ms 1 behind a queue: got %s, want deadline_exceeded", c)
	}
	t.Logf("deadline_exceeded answered %v after submission, %d-th of %d answers", got["dl"].At.Sub(sentDL).Round(time.Millisecond), slices.Index(order, "dl")+1, len(order))
	if i := slices.Index(order, "dl"); i > 2 {
		t.Errorf("deadline_exceeded was answer %d, want it before the batch items still queued", i+1)
	}
	ids := gwDispatchedIDs(t, dispatched.drain(t, g.NC))
	if slices.Contains(ids, "dl") {
		t.Errorf("the expired request was dispatched to a worker: %v", ids)
	}
	// (b00 and a prefetched b01 leave in one dispatch pass, in either order.)
	if i := slices.Index(ids, "int"); i < 0 || i > 2 || (i == 2 && !slices.Contains(ids[:2], "b01")) {
		t.Errorf("interactive request dispatched at %d, want right after the running b00 (and b01, if it was prefetched); dispatch order %v", i, ids)
	}
	if len(ids) != nBatch+1 {
		t.Errorf("%d work items dispatched to bt, want %d (every request exactly once): %v", len(ids), nBatch+1, ids)
	}
	// And the worker never counted it: served grew by exactly the 31 results.
	st := g.waitStatus(t, bt0ID+" to count the 31 results", func(st *codec.StatusReply) bool {
		w, ok := gwLive(st, "bt")[bt0ID]
		return ok && w.Served >= bt0.Served+nBatch+1
	})
	w := gwLive(st, "bt")[bt0ID]
	if w.Served != bt0.Served+nBatch+1 || w.Failed != bt0.Failed {
		t.Errorf("%s served %d -> %d, failed %d -> %d; want +%d and +0", bt0ID, bt0.Served, w.Served, bt0.Failed, w.Failed, nBatch+1)
	}
}

// TestGatewayCancel cancels queued batch requests on the shared gateway: answered
// cancelled before the work ahead of them, never dispatched; only their sender may cancel
// them, a cancel sent right behind its request still cancels it, and an unknown id is not
// found.
func TestGatewayCancel(t *testing.T) {
	g, img := sharedGateway(t)
	claims := newGWSpy(t, g.NC, "ortbus.claim.>")
	dispatched := newGWSpy(t, g.NC, "infer.bt.>")
	in := newInbox(t, g.NC)
	for _, id := range []string{"c0", "c1", "c2"} {
		g.post(t, in, "tag", id, &codec.Request{ID: id, Path: img["blue"], Class: "batch", Model: gwSlow})
	}
	gwClaimOf(t, claims, "c0")
	// c2 waits in the gateway, and c1 too, unless the gateway prefetched it to the worker
	// (one batch item beyond its slot, when no interactive work was on the device within
	// the reserve window). (Each op is its own subscription of the micro service, so a
	// cancel may overtake the tag requests sent before it: wait until status shows them
	// queued.)
	g.waitStatus(t, "c1 and c2 queued, or c2 queued and c1 prefetched", func(st *codec.StatusReply) bool {
		for _, c := range st.Classes {
			if c.Name == "batch" {
				return c.Queued == 2 || (c.Queued == 1 && slices.ContainsFunc(claims.drain(t, g.NC), func(m *nats.Msg) bool {
					var x codec.Claim
					return codec.Unmarshal(m.Data, &x) == nil && x.ID == "c1" && x.State == codec.ClaimTaken
				}))
			}
		}
		return false
	})
	start := time.Now()
	if cr := g.cancel(t, in, "c2"); cr.ID != "c2" || !cr.Found {
		t.Errorf("cancel reply %+v, want c2 found", cr)
	}
	m := in.next(t, "the cancelled answer")
	lat := time.Since(start)
	if k := in.key(m); k != "c2" {
		t.Fatalf("first answer after the cancel is %s, want c2", k)
	}
	if c := gwDecode(t, m).code(); c != string(codec.CodeCancelled) {
		t.Errorf("cancelled request answered %s, want cancelled", c)
	}
	// "At once" is the ordering above (answered before the running c0 and the queued
	// c1); the time is logged, not bounded, since a loaded machine can stretch it.
	t.Logf("queued request answered cancelled %v after the cancel", lat.Round(time.Microsecond))
	// Only the sender (or an operator) may cancel: another connection's cancel of c1
	// finds nothing, and c1 is still answered with its result below.
	r := g.call(t, "cancel", &codec.Request{ID: "c1"}, gwReplyBound)
	var cr codec.CancelReply
	if err := codec.Unmarshal(r.Msg.Data, &cr); err != nil || cr.Found {
		t.Errorf("cancel from another connection: %+v (%v), want found false", cr, err)
	}
	// A cancel sent right behind its request still cancels it, although the gateway
	// may see the cancel first (each op is a subscription of its own).
	g.post(t, in, "tag", "c3", &codec.Request{ID: "c3", Path: img["blue"], Class: "batch", Model: gwSlow})
	g.cancel(t, in, "c3")
	order, got := gwCollect(t, in, 3)
	for _, k := range []string{"c0", "c1"} {
		got[k].tag(t)
	}
	if c := got["c3"].code(); c != string(codec.CodeCancelled) || order[0] != "c3" {
		t.Errorf("request cancelled right after it was sent: %s, answer %d of %v; want cancelled, first", c, slices.Index(order, "c3")+1, order)
	}
	if ids := gwDispatchedIDs(t, dispatched.drain(t, g.NC)); slices.Contains(ids, "c2") || slices.Contains(ids, "c3") {
		t.Errorf("a cancelled request was dispatched: %v", ids)
	}
	r = g.call(t, "cancel", &codec.Request{ID: "no-such-request"}, gwReplyBound)
	if err := codec.Unmarshal(r.Msg.Data, &cr); err != nil || cr.Found {
		t.Errorf("cancel of an unknown id: %+v (%v), want found false", cr, err)
	}
}

// TestGatewayOverload sends 50 slow interactive requests at once to the shared gateway
// (queue bound 10, two one-slot workers): about 12 are served and the rest answered
// overloaded at once, before any result.
func TestGatewayOverload(t *testing.T) {
	g, img := sharedGateway(t)
	in := newInbox(t, g.NC)
	const n, bound, capacity = 50, 10, 2 // interactive: queue bound 10, ia + bt one slot each
	sent := map[string]time.Time{}
	for i := 0; i < n; i++ {
		k := fmt.Sprintf("o%02d", i)
		sent[k] = g.post(t, in, "tag", k, &codec.Request{Path: img["red"], Model: gwSlow})
	}
	order, got := gwCollect(t, in, n)
	var ok, over int
	var firstOK time.Time
	var maxOver time.Duration
	for _, k := range order {
		r := got[k]
		switch r.code() {
		case "ok":
			if ok == 0 {
				firstOK = r.At
			}
			ok++
			checkColourTag(t, r.tag(t), "red")
		case string(codec.CodeOverloaded):
			over++
			if ok > 0 {
				t.Errorf("overloaded answer %s came after a result: not at once", k)
			}
			maxOver = max(maxOver, r.At.Sub(sent[k]))
			if r.Err.Details["class"] != "interactive" {
				t.Errorf("overloaded details %v, want class interactive", r.Err.Details)
			}
		default:
			t.Errorf("%s: %s %v", k, r.code(), r.Err)
		}
	}
	t.Logf("%d requests at once: %d ok, %d overloaded (slowest overloaded answer %v; first result %v after the burst, last %v)",
		n, ok, over, maxOver.Round(time.Microsecond), firstOK.Sub(sent["o49"]).Round(time.Millisecond), got[order[n-1]].At.Sub(sent["o49"]).Round(time.Millisecond))
	if ok < bound || ok > bound+capacity+2 || ok+over != n {
		t.Errorf("%d ok and %d overloaded of %d, want about %d ok (bound %d + %d running) and the rest overloaded", ok, over, n, bound+capacity, bound, capacity)
	}
	// "At once" is checked as an ordering (no overloaded answer after a result);
	// maxOver is logged, not bounded.
}

// TestGatewayMetrics checks ortbus_requests_total on /metrics of the shared gateway: ok,
// unknown_pool and forbidden_path requests each grow their own series by exactly their
// count and nothing else grows; then a batch result, a deadline_exceeded, a cancelled and
// overloaded answers grow theirs.
func TestGatewayMetrics(t *testing.T) {
	g, img := sharedGateway(t)
	// The baseline; a gateway that has answered nothing yet has no series (nor the
	// counter's TYPE line, which gwRequestCounts checks in the scrapes after).
	before := gwParseRequestCounts(t, gwScrape(t, g.Ready.HTTP))
	for i := 0; i < 5; i++ {
		g.call(t, "tag", &codec.Request{Path: img["red"], Model: gwTagger}, gwReplyBound).tag(t)
	}
	for i := 0; i < 2; i++ {
		if r := g.call(t, "tag", &codec.Request{Path: img["red"], Model: gwTagger, Pool: "nope"}, gwReplyBound); r.code() != string(codec.CodeUnknownPool) {
			t.Fatalf("pool nope: %s", r.code())
		}
	}
	if r := g.call(t, "tag", &codec.Request{Path: "/etc/hostname", Model: gwTagger}, gwReplyBound); r.code() != string(codec.CodeForbiddenPath) {
		t.Fatalf("path outside the allowed roots: %s", r.code())
	}
	// A worker answers a client straight and tells the gateway a hop later: counted once
	// the gateway has heard of every answer (nothing in flight).
	gwSettle(t, g)
	after := gwRequestCounts(t, g.Ready.HTTP)
	want := map[string]float64{
		gwMetricKey("tag", "interactive", "ia", gwTagger, "ok"):             5,
		gwMetricKey("tag", "interactive", "", gwTagger, "unknown_pool"):     2,
		gwMetricKey("tag", "interactive", "ia", gwTagger, "forbidden_path"): 1,
	}
	keys := map[string]bool{}
	for k := range after {
		keys[k] = true
	}
	for k := range want {
		keys[k] = true
	}
	for k := range keys {
		if d := after[k] - before[k]; d != want[k] {
			t.Errorf("ortbus_requests_total{%s} grew by %v, want %v", k, d, want[k])
		}
	}
	t.Logf("ortbus_requests_total: %d series", len(after))

	// The answers of the queue path have their series too: batch results, and requests
	// answered by the gateway without a pool (expired in the queue, cancelled there,
	// shed). Four slow batch items keep bt's one slot busy while the others wait.
	claims := newGWSpy(t, g.NC, "ortbus.claim.>")
	in := newInbox(t, g.NC)
	const nBatch = 4
	for i := 0; i < nBatch; i++ {
		id := fmt.Sprintf("m-b%d", i)
		g.post(t, in, "tag", id, &codec.Request{ID: id, Path: img["blue"], Class: "batch", Model: gwSlow})
	}
	gwClaimOf(t, claims, "m-b0")
	g.post(t, in, "tag", "m-dl", &codec.Request{ID: "m-dl", Path: img["blue"], Class: "batch", Model: gwSlow, TimeoutMS: 1})
	// (The gateway cancels it whether it sees the cancel or the request first.)
	g.post(t, in, "tag", "m-c", &codec.Request{ID: "m-c", Path: img["blue"], Class: "batch", Model: gwSlow})
	g.cancel(t, in, "m-c")
	_, got := gwCollect(t, in, nBatch+2)
	for k, r := range got {
		want := "ok"
		switch k {
		case "m-dl":
			want = string(codec.CodeDeadlineExceeded)
		case "m-c":
			want = string(codec.CodeCancelled)
		}
		if r.code() != want {
			t.Errorf("%s: %s %v, want %s", k, r.code(), r.Err, want)
		}
	}
	const nBurst = 20 // interactive: queue bound 10, ia + bt one slot each
	for i := 0; i < nBurst; i++ {
		g.post(t, in, "tag", fmt.Sprintf("m-o%02d", i), &codec.Request{Path: img["red"], Model: gwSlow})
	}
	_, got = gwCollect(t, in, nBurst)
	var ok, over float64
	for k, r := range got {
		switch r.code() {
		case "ok":
			ok++
		case string(codec.CodeOverloaded):
			over++
		default:
			t.Errorf("%s: %s %v", k, r.code(), r.Err)
		}
	}
	t.Logf("%d slow interactive requests at once: %v ok, %v overloaded", nBurst, ok, over)
	if over == 0 {
		t.Errorf("%d slow interactive requests at once, none overloaded", nBurst)
	}
	gwSettle(t, g)
	last := gwRequestCounts(t, g.Ready.HTTP)
	for k, n := range map[string]float64{
		gwMetricKey("tag", "batch", "bt", gwSlow, "ok"):              nBatch,
		gwMetricKey("tag", "batch", "", gwSlow, "deadline_exceeded"): 1,
		gwMetricKey("tag", "batch", "", gwSlow, "cancelled"):         1,
		gwMetricKey("tag", "interactive", "", gwSlow, "overloaded"):  over,
	} {
		if d := last[k] - after[k]; d != n {
			t.Errorf("ortbus_requests_total{%s} grew by %v, want %v", k, d, n)
		}
	}
	ia, bt := gwMetricKey("tag", "interactive", "ia", gwSlow, "ok"), gwMetricKey("tag", "interactive", "bt", gwSlow, "ok")
	if d := last[ia] - after[ia] + last[bt] - after[bt]; d != ok {
		t.Errorf("ortbus_requests_total{%s} and {%s} grew by %v together, want the %v results", ia, bt, d, ok)
	}
}

// TestGatewayNatsCLI drives the shared gateway with the nats CLI (natscli v0.5.0): micro
// ls, info and stats show the ortbus service and count its tag requests, nats req gets a
// JSON tag reply, and nats sub shows a worker's heartbeat as readable JSON.
func TestGatewayNatsCLI(t *testing.T) {
	g, img := sharedGateway(t)
	natsCLI := gwInstallNatsCLI(t)
	home := t.TempDir()
	run := func(args ...string) string {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		cmd := exec.CommandContext(ctx, natsCLI, append([]string{"--server", g.Ready.NATSURL}, args...)...)
		cmd.Env = append(os.Environ(), "HOME="+home, "XDG_CONFIG_HOME="+filepath.Join(home, ".config"), "NO_COLOR=1")
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("nats %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		return string(out)
	}
	if out := run("micro", "ls"); !strings.Contains(out, "ortbus") {
		t.Errorf("nats micro ls does not list ortbus:\n%s", out)
	}
	info := run("micro", "info", "ortbus")
	for _, s := range []string{"ortbus.v1.tag", "ortbus.v1.status", "ortbus-gateway", "0.1.0"} {
		if !strings.Contains(info, s) {
			t.Errorf("nats micro info ortbus does not show %q:\n%s", s, info)
		}
	}
	tagRequests := func() (n, errs int) {
		var stats []struct {
			Endpoints []struct {
				Name        string `json:"name"`
				Subject     string `json:"subject"`
				NumRequests int    `json:"num_requests"`
				NumErrors   int    `json:"num_errors"`
			} `json:"endpoints"`
		}
		out := run("micro", "stats", "ortbus", "--json")
		if err := json.Unmarshal([]byte(out), &stats); err != nil {
			t.Fatalf("nats micro stats ortbus --json: %v\n%s", err, out)
		}
		for _, s := range stats {
			for _, e := range s.Endpoints {
				if e.Subject == "ortbus.v1.tag" {
					n += e.NumRequests
					errs += e.NumErrors
				}
			}
		}
		return n, errs
	}
	n0, e0 := tagRequests()
	for i := 0; i < 3; i++ {
		g.call(t, "tag", &codec.Request{Path: img["red"], Model: gwTagger}, gwReplyBound).tag(t)
	}
	g.call(t, "tag", &codec.Request{Path: img["red"], Pool: "nope"}, gwReplyBound)
	n1, e1 := tagRequests()
	if n1-n0 != 4 || e1-e0 != 1 {
		t.Errorf("micro stats: tag requests %d -> %d, errors %d -> %d; want +4 and +1", n0, n1, e0, e1)
	}
	if out := run("micro", "stats", "ortbus"); !strings.Contains(out, strconv.Itoa(n1)) {
		t.Errorf("nats micro stats ortbus does not show %d requests:\n%s", n1, out)
	}
	t.Logf("micro stats: tag endpoint %d requests, %d errors", n1, e1)

	body, _ := json.Marshal(map[string]string{"path": img["red"], "model": gwTagger})
	out := run("req", "ortbus.v1.tag", string(body), "-H", "Content-Type:application/json", "--raw")
	var tr codec.TagReply
	if err := json.Unmarshal([]byte(strings.TrimSpace(out)), &tr); err != nil {
		t.Fatalf("nats req ortbus.v1.tag: not a JSON tag reply: %v\n%s", err, out)
	}
	checkColourTag(t, &tr, "red")
	if tr.Pool != "ia" || tr.Model != gwTagger {
		t.Errorf("nats req reply: pool %s model %s", tr.Pool, tr.Model)
	}

	// A heartbeat as an operator sees it: readable JSON naming the worker and its runtime.
	out = run("sub", "ortbus.hb.ia.>", "--count", "1", "--raw")
	var hb codec.Heartbeat
	if err := json.Unmarshal([]byte(strings.TrimSpace(out)), &hb); err != nil || hb.Pool != "ia" || hb.Runtime != "1.30.0" || hb.State != codec.StateReady {
		t.Errorf("nats sub ortbus.hb.ia.>: not a readable heartbeat of pool ia (%v):\n%s", err, out)
	}
}

// gwInstallNatsCLI builds the nats CLI (natscli v0.5.0) from the Go module proxy into a
// temporary directory, failing the test (not skipping it) when that is impossible.
func gwInstallNatsCLI(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "go", "install", "github.com/nats-io/natscli/nats@v0.5.0")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "GOBIN="+dir)
	start := time.Now()
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("cannot build the nats CLI (GOBIN=%s go install github.com/nats-io/natscli/nats@v0.5.0 needs the Go module proxy or a module cache that has it): %v\n%s", dir, err, out)
	}
	t.Logf("nats CLI built in %v", time.Since(start).Round(time.Millisecond))
	return filepath.Join(dir, "nats")
}

// TestGatewayRuntimeMissing runs a gateway whose batch pool's runtime library does not
// exist: batch requests (a chain of that one pool) fail at once with runtime_missing,
// naming the pool and every path searched, while interactive requests are served by the
// other pool.
func TestGatewayRuntimeMissing(t *testing.T) {
	root := imageRoot(t)
	red := colourPNG(t, root, "red")
	missing := filepath.Join(t.TempDir(), "no-such-ort", "libonnxruntime.so.1")
	cfg := gwConfig{
		Root: root,
		Pools: []gwPool{
			{Name: "ia", Version: "1.30.0", Classes: []string{"interactive"}, Models: []string{gwTagger}},
			{Name: "bt", Runtime: missing, Classes: []string{"batch", "interactive"}, Models: []string{gwTagger}},
		},
		Classes: []gwClass{
			{Name: "interactive", Chain: []string{"ia", "bt"}},
			{Name: "batch", Chain: []string{"bt"}},
		},
	}.write(t)
	g := startGateway(t, cfg)

	for _, req := range []*codec.Request{
		{Path: red, Class: "batch", Model: gwTagger},
		{Path: red, Class: "interactive", Pool: "bt", Model: gwTagger},
	} {
		start := time.Now()
		r := g.call(t, "tag", req, gwReplyBound)
		lat := time.Since(start)
		if r.code() != string(codec.CodeRuntimeMissing) {
			t.Errorf("class %s pool %q: got %s %v, want runtime_missing", req.Class, req.Pool, r.code(), r.Err)
			continue
		}
		searched, _ := r.Err.Details["searched"].([]any)
		if r.Err.Details["pool"] != "bt" || !slices.Contains(searched, any(missing)) || !strings.Contains(r.Err.Message, missing) {
			t.Errorf("runtime_missing %q details %v: want pool bt and %s among the searched paths", r.Err.Message, r.Err.Details, missing)
		}
		t.Logf("class %s pool %q: runtime_missing in %v: %s (searched %v)", req.Class, req.Pool, lat.Round(time.Microsecond), r.Err.Message, searched)
		if lat > time.Second {
			t.Errorf("runtime_missing took %v, want it at once", lat)
		}
	}
	for i := 0; i < 3; i++ {
		tr := g.call(t, "tag", &codec.Request{Path: red, Model: gwTagger}, gwReplyBound).tag(t)
		if tr.Pool != "ia" || tr.Runtime != "1.30.0" {
			t.Errorf("interactive served by %s (%s), want ia (1.30.0)", tr.Pool, tr.Runtime)
		}
		checkColourTag(t, tr, "red")
	}
	st := g.status(t)
	for _, p := range st.Pools {
		if p.Name == "bt" && (p.Error == nil || p.Error.Code != codec.CodeRuntimeMissing || p.Live != 0) {
			t.Errorf("status of pool bt: live %d error %+v, want runtime_missing", p.Live, p.Error)
		}
	}
}

// gwFailuresConfig is one pool "ch" of two one-slot workers with the fault switch on, and
// a crash-loop limit out of reach. Restarts wait 250 ms at first, so that a replacement
// loading its runtime does not take the CPU (two cores) from the retry of what its
// predecessor held.
func gwFailuresConfig(t *testing.T, root string) string {
	return gwConfig{
		Root: root,
		Gateway: config.Gateway{RestartBackoffMin: config.Duration(250 * time.Millisecond), RestartBackoffMax: config.Duration(time.Second),
			CrashLoopCount: 100, CrashLoopWindow: config.Duration(time.Minute)},
		Pools: []gwPool{{Name: "ch", Version: "1.30.0", Workers: 2, Classes: []string{"interactive", "batch"}, Models: []string{gwSlow, gwTagger},
			Env: map[string]string{"ORTBUS_FAULT_INJECT": "1"}}},
	}.write(t)
}

// gwSlotOf is a supervised worker's slot: its id (<pool>-<slot>[-r<n>]@<gateway>) without
// the -rN restart suffix.
func gwSlotOf(id string) string {
	base, gw, _ := strings.Cut(id, "@")
	if i := strings.LastIndex(base, "-r"); i > 0 {
		if _, err := strconv.Atoi(base[i+2:]); err == nil {
			base = base[:i]
		}
	}
	return base + "@" + gw
}

// gwWaitReplaced waits until the worker old (pid) has a live replacement in its slot, with
// another id and pid, and the pool has n live workers again; it returns the replacement.
func gwWaitReplaced(t *testing.T, g *gatewayProc, pool string, n int, old string, pid int) codec.WorkerStatus {
	t.Helper()
	var repl codec.WorkerStatus
	g.waitStatus(t, "a replacement of "+old, func(st *codec.StatusReply) bool {
		live := gwLive(st, pool)
		if len(live) != n {
			return false
		}
		for id, w := range live {
			if gwSlotOf(id) == gwSlotOf(old) && id != old && w.PID != pid {
				repl = w
				return true
			}
		}
		return false
	})
	return repl
}

// gwServedBy sends small requests one at a time until one is served by worker id (the
// pool's queue group picks a worker at random), failing t after 50.
func gwServedBy(t *testing.T, g *gatewayProc, path, id string) int {
	t.Helper()
	for i := 1; i <= 50; i++ {
		if tr := g.call(t, "tag", &codec.Request{Path: path, Model: gwTagger}, gwReplyBound).tag(t); tr.Worker == id {
			return i
		}
	}
	t.Fatalf("50 requests, none served by %s", id)
	return 0
}

// gwWarm sends slow requests until every live worker of pool has served one, so that a
// retry is timed on a gwWarm session.
func gwWarm(t *testing.T, g *gatewayProc, pool, path string) map[string]codec.WorkerStatus {
	t.Helper()
	live := g.waitLive(t, pool, 2)
	done := map[string]bool{}
	for i := 0; len(done) < len(live); i++ {
		if i == 50 {
			t.Fatalf("50 requests, served only by %v of %d workers", done, len(live))
		}
		done[g.call(t, "tag", &codec.Request{Path: path, Model: gwSlow}, gwReplyBound).tag(t).Worker] = true
	}
	return live
}

// TestGatewayWorkerFailures kills, stops and crashes the workers of a supervised pool
// while they hold requests: every held request is answered (retried on the other worker,
// or worker_lost) within the bounds of the contract, a request that kills every worker
// that takes it is answered poison_input, each dead worker is replaced, and the gateway
// serves on.
func TestGatewayWorkerFailures(t *testing.T) {
	root := imageRoot(t)
	red := colourPNG(t, root, "red")
	g := startGateway(t, gwFailuresConfig(t, root))
	g.waitLive(t, "ch", 2)

	// checkHeld checks the answers of requests: those held by the dead worker within
	// bound of the death (0: no bound, the latency logged), each a result from another
	// worker or worker_lost.
	checkHeld := func(t *testing.T, got map[string]gwReply, held map[string]bool, dead string, died time.Time, bound time.Duration) {
		t.Helper()
		for k, r := range got {
			switch {
			case r.Err == nil:
				if tr := r.tag(t); held[k] && tr.Worker == dead {
					t.Errorf("%s answered by the dead worker %s", k, dead)
				}
			case r.Err.Code == codec.CodeWorkerLost && held[k]:
			default:
				t.Errorf("%s: %s %v", k, r.code(), r.Err)
			}
			if held[k] {
				lat := r.At.Sub(died)
				t.Logf("%s (held by %s): %s %v after the death", k, dead, r.code(), lat.Round(time.Millisecond))
				if bound > 0 && lat > bound {
					t.Errorf("%s answered %v after its worker died, want within %v", k, lat, bound)
				}
			}
		}
	}

	t.Run("Kill9", func(t *testing.T) {
		live := gwWarm(t, g, "ch", red)
		claims := newGWSpy(t, g.NC, "ortbus.claim.>")
		in := newInbox(t, g.NC)
		g.post(t, in, "tag", "k1", &codec.Request{ID: "k1", Path: red, Model: gwSlow})
		c := gwClaimOf(t, claims, "k1")
		victim := live[c.Worker]
		if err := syscall.Kill(victim.PID, syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		died := time.Now()
		_, got := gwCollect(t, in, 1)
		checkHeld(t, got, map[string]bool{"k1": true}, c.Worker, died, 0)
		// The death was the process's exit, seen at once by the supervisor, not the
		// heartbeats' silence: the gateway never took it for a silent worker (whose
		// requests would wait gwMissCount heartbeats first).
		if log := g.log(); !strings.Contains(log, `msg="worker exited" worker=`+c.Worker) || strings.Contains(log, `msg="killing a silent worker" worker=`+c.Worker) {
			t.Errorf("%s's death was not its exit (gateway log):\n%s", c.Worker, log)
		}
		repl := gwWaitReplaced(t, g, "ch", 2, c.Worker, victim.PID)
		t.Logf("%s (pid %d) replaced by %s (pid %d) %v after the kill", c.Worker, victim.PID, repl.Worker, repl.PID, time.Since(died).Round(time.Millisecond))
		if !gwProcessGone(victim.PID) {
			t.Errorf("killed worker pid %d still exists", victim.PID)
		}
		n := gwServedBy(t, g, red, repl.Worker)
		t.Logf("the replacement served request %d after it came", n)
	})

	t.Run("HeartbeatLoss", func(t *testing.T) {
		live := gwWarm(t, g, "ch", red)
		claims := newGWSpy(t, g.NC, "ortbus.claim.>")
		in := newInbox(t, g.NC)
		for _, id := range []string{"s1", "s2"} {
			g.post(t, in, "tag", id, &codec.Request{ID: id, Path: red, Model: gwSlow})
		}
		c1, c2 := gwClaimOf(t, claims, "s1"), gwClaimOf(t, claims, "s2")
		victim := live[c1.Worker]
		held := map[string]bool{"s1": true, "s2": c2.Worker == c1.Worker}
		if err := syscall.Kill(victim.PID, syscall.SIGSTOP); err != nil {
			t.Fatal(err)
		}
		stopped := time.Now()
		t.Cleanup(func() { syscall.Kill(victim.PID, syscall.SIGCONT) }) // only if the test failed before the gateway killed it
		_, got := gwCollect(t, in, 2)
		checkHeld(t, got, held, c1.Worker, stopped, gwMissCount*gwHeartbeat+500*time.Millisecond)
		repl := gwWaitReplaced(t, g, "ch", 2, c1.Worker, victim.PID)
		t.Logf("stopped %s (pid %d) replaced by %s (pid %d) %v after the stop", c1.Worker, victim.PID, repl.Worker, repl.PID, time.Since(stopped).Round(time.Millisecond))
		if !gwProcessGone(victim.PID) {
			t.Errorf("the silent worker (pid %d) was not killed", victim.PID)
		}
		gwServedBy(t, g, red, repl.Worker)
	})

	t.Run("PoisonNativeCrash", func(t *testing.T) {
		live := g.waitLive(t, "ch", 2)
		claims := newGWSpy(t, g.NC, "ortbus.claim.>")
		in := newInbox(t, g.NC)
		poison := filepath.Join(root, "__ortbus_fault_segv__.png")
		sent := g.post(t, in, "tag", "p1", &codec.Request{ID: "p1", Path: poison, Model: gwTagger})
		_, got := gwCollect(t, in, 1)
		r := got["p1"]
		if r.code() != string(codec.CodePoisonInput) {
			t.Fatalf("a request that crashes its workers: got %s %v, want poison_input", r.code(), r.Err)
		}
		t.Logf("poison_input %v after submission: %s", r.At.Sub(sent).Round(time.Millisecond), r.Err.Message)
		// Claims are not required here: a worker that crashes at once may die before its
		// claim leaves its buffer; the deaths are what counts.
		var holders []string
		for _, m := range claims.drain(t, g.NC) {
			var c codec.Claim
			if codec.Unmarshal(m.Data, &c) == nil && c.ID == "p1" {
				holders = append(holders, c.Worker)
			}
		}
		t.Logf("claims of the poison request seen: %v", holders)
		if w, _ := r.Err.Details["worker"].(string); live[w].PID == 0 {
			t.Errorf("poison_input details %v, want one of the workers %v", r.Err.Details, slices.Collect(maps.Keys(live)))
		}
		// Both died of the native crash and are replaced; the pool serves on.
		st := g.waitStatus(t, "two replacements", func(st *codec.StatusReply) bool {
			l := gwLive(st, "ch")
			if len(l) != 2 {
				return false
			}
			for id := range l {
				if _, old := live[id]; old {
					return false
				}
			}
			return true
		})
		for _, w := range live {
			if !gwProcessGone(w.PID) {
				t.Errorf("crashed worker %s pid %d still exists", w.Worker, w.PID)
			}
		}
		for id, w := range gwLive(st, "ch") {
			t.Logf("replacement %s pid %d (restarts %d)", id, w.PID, w.Restarts)
		}
		tr := g.call(t, "tag", &codec.Request{Path: red, Model: gwSlow}, gwReplyBound).tag(t)
		checkColourTag(t, tr, "red")
	})

	if !g.alive() {
		t.Fatal("the gateway died")
	}
	h := g.call(t, "health", &codec.Request{}, gwReplyBound)
	var hr codec.HealthReply
	if h.Err != nil || codec.Unmarshal(h.Msg.Data, &hr) != nil || hr.Status != "ok" || hr.Workers != 2 {
		t.Errorf("health after the failures: %+v (%v), want ok with 2 workers", hr, h.Err)
	}
}

// TestGatewayNATSRestart runs a gateway on an external NATS server and restarts that
// server mid-run: the gateway and its worker reconnect (the worker is not replaced) and
// requests succeed again.
func TestGatewayNATSRestart(t *testing.T) {
	start := func(port string) *natsd.Server {
		t.Helper()
		opts, err := natsd.ParseArgs([]string{"-p", port})
		if err != nil {
			t.Fatal(err)
		}
		srv, err := natsd.Start(opts)
		if err != nil {
			t.Fatalf("NATS on port %s: %v", port, err)
		}
		return srv
	}
	srv := start("-1")
	t.Cleanup(func() { srv.Shutdown() })
	natsURL := srv.ClientURL()
	u, err := url.Parse(natsURL)
	if err != nil {
		t.Fatal(err)
	}
	root := imageRoot(t)
	red := colourPNG(t, root, "red")
	cfg := gwConfig{
		NATSURL: natsURL,
		Root:    root,
		Pools:   []gwPool{{Name: "nr", Version: "1.30.0", Classes: []string{"interactive"}, Models: []string{gwTagger}}},
	}.write(t)
	g := startGateway(t, cfg)
	if g.Ready.NATSURL != natsURL {
		t.Errorf("ready line names %s, want the external %s", g.Ready.NATSURL, natsURL)
	}
	g.call(t, "tag", &codec.Request{Path: red, Model: gwTagger}, gwReplyBound).tag(t)
	nr0 := g.supervised(t, "nr", 0)
	w0, ok := g.waitLive(t, "nr", 1)[nr0]
	if !ok {
		t.Fatalf("%s is not live", nr0)
	}

	srv.Shutdown()
	down := time.Now()
	// Keep the server down until the gateway has heard no heartbeat for longer than the
	// miss threshold (its HTTP side stays up and says so), as in a real restart.
	gwWaitHeartbeatAge(t, g, nr0, 2*gwMissCount*gwHeartbeat)
	srv = start(u.Port())
	up := time.Now()
	t.Logf("NATS down for %v", up.Sub(down).Round(time.Millisecond))

	// Requests succeed again: retried, each with a short timeout, until one does (retries
	// that fail at once, no responders yet, are paced at pollEvery).
	b, _ := codec.Marshal(&codec.Request{Path: red, Model: gwTagger})
	var failures []string
	checkFor(t, "a successful request after the NATS restart", gwReplyBound, pollEvery, func() error {
		m, err := g.NC.Request("ortbus.v1.tag", b, 300*time.Millisecond)
		if err == nil {
			r := gwDecode(t, m)
			if r.Err == nil {
				tr := r.tag(t)
				t.Logf("served again by %s %v after the restart (attempt %d; before: %v)", tr.Worker, time.Since(up).Round(time.Millisecond), len(failures)+1, failures)
				return nil
			}
			err = r.Err
		}
		failures = append(failures, err.Error())
		return fmt.Errorf("%d attempts: %v", len(failures), failures)
	})
	for i := 0; i < 5; i++ {
		g.call(t, "tag", &codec.Request{Path: red, Model: gwTagger}, gwReplyBound).tag(t)
	}
	w1, ok := g.waitLive(t, "nr", 1)[nr0]
	if !ok || w1.PID != w0.PID || w1.Restarts != 0 {
		t.Errorf("after the NATS restart: %s live %v pid %d restarts %d, want the same worker (pid %d) reconnected", nr0, ok, w1.PID, w1.Restarts, w0.PID)
	}
	if !g.alive() {
		t.Fatal("the gateway died")
	}
}

// gwWaitHeartbeatAge polls the gateway's /metrics until worker's heartbeat age exceeds
// age, or the worker is no longer listed as live there.
func gwWaitHeartbeatAge(t *testing.T, g *gatewayProc, worker string, age time.Duration) {
	t.Helper()
	checkFor(t, fmt.Sprintf("heartbeat age of %s over %v (or %s no longer live)", worker, age, worker), gwReplyBound, pollEvery, func() error {
		if a, ok := gwHeartbeatAge(t, g.Ready.HTTP, worker); ok && a <= age {
			return fmt.Errorf("heartbeat age of %s still %v", worker, a)
		}
		return nil
	})
}
