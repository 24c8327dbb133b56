package test

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/ortbus/ortbus/client"
	"github.com/ortbus/ortbus/codec"
	"github.com/ortbus/ortbus/config"
	"github.com/ortbus/ortbus/gateway"
	"github.com/ortbus/ortbus/internal/testkit/testenv"
	"github.com/ortbus/ortbus/natsd"
)

// TestGatewayFailover: two gateways serve the same queue group over one NATS server with
// JetStream; a remote pool's worker (one slot, the slow tagger) serves both. Calls from a
// Go client with failover on, interactive and batch mixed, are sent at once; gateway A is
// killed with -9 while it holds some of them, dispatched and queued. Every call must end
// with its one answer, a correct result: those A held are sent again by the client when
// A's beats stop, and gateway B runs them. B keeps serving afterwards.
func TestGatewayFailover(t *testing.T) {
	t.Parallel()
	opts, err := natsd.ParseArgs([]string{"-a", "127.0.0.1", "-p", "-1", "-js", "-sd", t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	srv, err := natsd.Start(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Shutdown)
	root := imageRoot(t)
	write := func(id string) string {
		remote := false
		c := &config.Config{
			NATS:     config.NATS{URL: srv.ClientURL()},
			Gateway:  config.Gateway{ID: id, Failover: true, ShutdownGrace: config.Duration(3 * time.Second)},
			Health:   config.Health{HeartbeatInterval: config.Duration(200 * time.Millisecond), MissCount: 3},
			Security: config.Security{AllowedRoots: []string{root}},
			Classes: map[string]*config.Class{
				"interactive": {Chain: []string{"fo"}},
				"batch":       {Chain: []string{"fo"}},
			},
			Pools: map[string]*config.Pool{"fo": {Runtime: testenv.RuntimeLib(t, "1.30.0"), Threads: 1, Slots: 1, Local: &remote,
				Classes: []string{"interactive", "batch"}, Models: []string{gwSlow}}},
			Models: map[string]*config.Model{gwSlow: {Kind: config.KindTaggerPixAI, Dir: gwSlowTaggerDir(t)}},
		}
		c.SetOrder("classes", "interactive", "batch")
		return writeConfigFile(t, filepath.Join(t.TempDir(), id+".toml"), c)
	}
	cfgA, cfgB := write("gwa"), write("gwb")
	w := launch(t, cfgA, "fo") // the remote pool's worker, as another host would run it
	w.ready(t)
	a := startGateway(t, cfgA)
	b := startGateway(t, cfgB)
	a.waitLive(t, "fo", 1)
	b.waitLive(t, "fo", 1)
	c, err := client.Connect(srv.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.Failover = true
	checkFor(t, "the client hearing both gateways", gwReplyBound, pollEvery, func() error {
		gws, err := c.Gateways()
		if err == nil && !slices.Equal(gws, []string{"gwa", "gwb"}) {
			err = fmt.Errorf("gateways heard: %v", gws)
		}
		return err
	})
	path := colourPNG(t, root, "blue")

	// Fire the calls at once; with one slow worker slot each gateway soon holds one
	// request dispatched and others queued.
	const calls = 16
	type outcome struct {
		r   *codec.TagReply
		err error
	}
	results := make([]outcome, calls)
	var wg sync.WaitGroup
	ctx, cancel := context.WithTimeout(context.Background(), 2*gwReplyBound)
	defer cancel()
	for i := range calls {
		wg.Add(1)
		go func() {
			defer wg.Done()
			req := codec.Request{ID: fmt.Sprintf("fo-%02d", i), Path: path, Model: gwSlow}
			if i%2 == 1 {
				req.Class = "batch"
			}
			r, err := c.Tag(ctx, req)
			results[i] = outcome{r, err}
		}()
	}
	// A holds requests when it has one in flight and one queued.
	held := 0
	checkFor(t, "gateway A holding a dispatched and a queued request", gwReplyBound, 5*time.Millisecond, func() error {
		m := gwScrape(t, a.Ready.HTTP)
		inflight, queued := metricSum(m, "ortbus_inflight{"), metricSum(m, "ortbus_queued{")
		if inflight < 1 || queued < 1 {
			return fmt.Errorf("in flight %v, queued %v", inflight, queued)
		}
		held = int(inflight + queued)
		return nil
	})
	a.lp.Kill()
	t.Logf("killed gateway A holding %d requests (1 dispatched) of %d sent", held, calls)
	wg.Wait()
	for i, o := range results {
		switch {
		case o.err != nil:
			t.Errorf("call %d: %v", i, o.err)
		case o.r.General["blue"] < 0.9:
			t.Errorf("call %d: wrong tags %v", i, o.r.General)
		}
	}
	// B keeps serving, and A's requests were answered by B (A is dead): the proof that
	// the resends worked is that every call above succeeded although A held `held`.
	after, cancelAfter := context.WithTimeout(context.Background(), gwReplyBound)
	defer cancelAfter()
	if r, err := c.Tag(after, codec.Request{Path: path, Model: gwSlow}); err != nil || r.General["blue"] < 0.9 {
		t.Fatalf("a call after the failover: %+v, %v", r, err)
	}
}

// TestFailoverWorkerIdentity: two gateways on one bus (failover on, as deploy/
// multi-host.md sets them up) each supervise a local pool of the same name, one worker
// each. Their workers get distinct ids (<pool>-<slot>@<gateway id>), both gateways see
// both as live, and every request sent through them is taken by exactly one worker:
// with equal ids both workers subscribed to infer.<pool>.<class>.<worker> and ran every
// item sent to that id (half of the requests ran twice).
func TestFailoverWorkerIdentity(t *testing.T) {
	t.Parallel()
	opts, err := natsd.ParseArgs([]string{"-a", "127.0.0.1", "-p", "-1", "-js", "-sd", t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	srv, err := natsd.Start(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Shutdown)
	root := imageRoot(t)
	write := func(id string) string {
		c := &config.Config{
			NATS:     config.NATS{URL: srv.ClientURL()},
			Gateway:  config.Gateway{ID: id, Failover: true, ShutdownGrace: config.Duration(3 * time.Second)},
			Health:   config.Health{HeartbeatInterval: config.Duration(gwHeartbeat), MissCount: gwMissCount},
			Security: config.Security{AllowedRoots: []string{root}},
			Classes: map[string]*config.Class{
				"interactive": {Chain: []string{"fo"}},
				"batch":       {Chain: []string{"fo"}},
			},
			Pools: map[string]*config.Pool{"fo": {Runtime: testenv.RuntimeLib(t, "1.30.0"), Threads: 1, Workers: 1, Slots: 1,
				Classes: []string{"interactive", "batch"}, Models: []string{gwTagger}}},
			Models: map[string]*config.Model{gwTagger: gwModels(t)[gwTagger]},
		}
		c.SetOrder("classes", "interactive", "batch")
		return writeConfigFile(t, filepath.Join(t.TempDir(), id+".toml"), c)
	}
	a := startGateway(t, write("gwa"))
	b := startGateway(t, write("gwb"))
	want := []string{gateway.WorkerID("fo", 0, 0, "gwa"), gateway.WorkerID("fo", 0, 0, "gwb")}
	if want[0] != "fo-0@gwa" || want[1] != "fo-0@gwb" {
		t.Fatalf("supervised ids %v, want fo-0@gwa and fo-0@gwb", want)
	}
	if got := []string{a.supervised(t, "fo", 0), b.supervised(t, "fo", 0)}; !slices.Equal(got, want) {
		t.Fatalf("the gateways' own workers: %v, want %v", got, want)
	}
	for _, g := range []*gatewayProc{a, b} {
		// Either gateway answers the status asked on the bus: each sees both workers.
		live := g.waitLive(t, "fo", 2)
		if ids := slices.Sorted(maps.Keys(live)); !slices.Equal(ids, want) {
			t.Fatalf("live workers of fo: %v, want %v", ids, want)
		}
	}

	// Every claim a worker publishes (taken: it queued the item), by request id.
	spy, err := nats.Connect(srv.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	defer spy.Close()
	var mu sync.Mutex
	taken := map[string][]string{}
	if _, err := spy.Subscribe("ortbus.claim.>", func(m *nats.Msg) {
		var c codec.Claim
		if codec.Unmarshal(m.Data, &c) == nil && c.State == codec.ClaimTaken {
			mu.Lock()
			taken[c.ID] = append(taken[c.ID], c.Worker)
			mu.Unlock()
		}
	}); err != nil {
		t.Fatal(err)
	}
	if err := spy.Flush(); err != nil {
		t.Fatal(err)
	}

	c, err := client.Connect(srv.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.Failover = true
	checkFor(t, "the client hearing both gateways", gwReplyBound, pollEvery, func() error {
		gws, err := c.Gateways()
		if err == nil && !slices.Equal(gws, []string{"gwa", "gwb"}) {
			err = fmt.Errorf("gateways heard: %v", gws)
		}
		return err
	})
	path := colourPNG(t, root, "red")
	const calls = 60
	ctx, cancel := context.WithTimeout(context.Background(), 2*gwReplyBound)
	defer cancel()
	servedBy := make([]string, calls)
	var wg sync.WaitGroup
	for i := range calls {
		wg.Add(1)
		go func() {
			defer wg.Done()
			req := codec.Request{ID: fmt.Sprintf("id-%02d", i), Path: path, Model: gwTagger}
			if i%2 == 1 {
				req.Class = "batch"
			}
			r, err := c.Tag(ctx, req)
			switch {
			case err != nil:
				t.Errorf("call %d: %v", i, err)
			case r.General["red"] < 0.9:
				t.Errorf("call %d: wrong tags %v", i, r.General)
			default:
				servedBy[i] = r.Worker
			}
		}()
	}
	wg.Wait()
	// Claims are published before the answers; a round trip of the spy's own and a beat
	// of time let the last of them arrive.
	time.Sleep(2 * gwHeartbeat)
	if err := spy.Flush(); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	twice := 0
	for i := range calls {
		id := fmt.Sprintf("id-%02d", i)
		switch ws := taken[id]; {
		case len(ws) == 0:
			t.Errorf("%s: no worker claimed it", id)
		case len(ws) > 1:
			twice++
			t.Errorf("%s: taken by %d workers: %v", id, len(ws), ws)
		}
		if servedBy[i] != "" && !slices.Contains(want, servedBy[i]) {
			t.Errorf("%s: served by %q, want one of %v", id, servedBy[i], want)
		}
	}
	byWorker := map[string]int{}
	for _, w := range servedBy {
		byWorker[w]++
	}
	t.Logf("%d requests through two gateways: served %v; %d ran more than once", calls, byWorker, twice)
}

// supervised is the id of the worker g supervises in slot of pool, before any restart:
// gateway.WorkerID with g's id as its own status names it (over its HTTP API: on a bus
// that several gateways share, ortbus.v1.status is answered by any of them).
func (g *gatewayProc) supervised(t testing.TB, pool string, slot int) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+g.Ready.HTTP+"/v1/status", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("GET /v1/status: %v", err)
	}
	defer resp.Body.Close()
	var st codec.StatusReply
	if err := json.NewDecoder(resp.Body).Decode(&st); err != nil || resp.StatusCode != http.StatusOK || st.Gateway == "" {
		t.Fatalf("GET /v1/status: %d, gateway %q, %v", resp.StatusCode, st.Gateway, err)
	}
	return gateway.WorkerID(pool, slot, 0, st.Gateway)
}

// metricSum adds the values of every sample line of /metrics text starting with prefix.
func metricSum(text, prefix string) float64 {
	var sum float64
	for _, line := range strings.Split(text, "\n") {
		if !strings.HasPrefix(line, prefix) {
			continue
		}
		var v float64
		if i := strings.LastIndexByte(line, ' '); i > 0 {
			fmt.Sscan(line[i+1:], &v)
		}
		sum += v
	}
	return sum
}
