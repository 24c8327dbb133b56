package test

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/ortbus/ortbus/codec"
	"github.com/ortbus/ortbus/internal/testenv"
	"github.com/ortbus/ortbus/natsd"
)

// TestGatewayFailover: two gateways serve the same queue group over one NATS; a remote
// pool's worker serves both. Gateway A is killed with -9 while it holds requests, some
// dispatched to the worker and some still queued. Gateway B takes over: every client gets
// exactly one reply — the queued ones run (once) and succeed, the dispatched ones are
// answered worker_lost naming the gateway and are not run again — and B keeps serving.
func TestGatewayFailover(t *testing.T) {
	opts, err := natsd.ParseArgs([]string{"-p", "-1"})
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
		q := strconv.Quote
		text := fmt.Sprintf(`[nats]
url = %s
[gateway]
id = %s
failover = true
shutdown_grace = "3s"
[health]
heartbeat_interval = "200ms"
[security]
allowed_roots = [%s]
[pools.fo]
runtime = %s
threads = 1
slots = 1
local = false
classes = ["interactive"]
models = ["slow"]
[models.slow]
kind = "tagger-pixai"
dir = %s
`, q(srv.ClientURL()), q(id), q(root), q(testenv.RuntimeLib(t, "1.30.0")), q(gwSlowTaggerDir(t)))
		dir := filepath.Join(t.TempDir(), id)
		os.MkdirAll(dir, 0o755)
		p := filepath.Join(dir, "ortbus.toml")
		if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	cfgA, cfgB := write("gwa"), write("gwb")
	w := launch(t, cfgA, "fo") // the remote pool's worker, as another host would run it
	w.ready(t)
	a := startGateway(t, cfgA)
	b := startGateway(t, cfgB)
	a.waitLive(t, "fo", 1)
	b.waitLive(t, "fo", 1)
	nc, err := nats.Connect(srv.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	journal := newGWSpy(t, nc, "ortbus.gw.gwa.log")
	in := newInbox(t, nc)
	path := colourPNG(t, root, "blue")

	// Send a burst; with one slow worker slot, gateway A soon holds at least one request
	// dispatched and one still queued (each gateway keeps one in flight at the worker).
	const sent = 12
	for i := 0; i < sent; i++ {
		key := "r" + strconv.Itoa(i)
		b, _ := codec.Marshal(&codec.Request{ID: key, Path: path})
		if err := nc.PublishRequest("ortbus.v1.tag", in.subject(key), b); err != nil {
			t.Fatal(err)
		}
	}
	accepted, dispatched := map[string]bool{}, map[string]bool{}
	journal.until(t, "gateway A holding a dispatched and a queued request", func(m *nats.Msg) bool {
		var e codec.JournalEntry
		if codec.Unmarshal(m.Data, &e) != nil {
			return false
		}
		switch e.State {
		case codec.JournalAccepted:
			accepted[e.ID] = true
		case codec.JournalDispatched:
			dispatched[e.ID] = true
		case codec.JournalDone:
			delete(accepted, e.ID)
			delete(dispatched, e.ID)
		}
		return len(dispatched) > 0 && len(accepted) > len(dispatched)
	})
	killed := time.Now()
	a.cmd.Process.Kill()
	<-a.exited
	t.Logf("killed gateway A holding %d requests (%d dispatched) of %d sent", len(accepted), len(dispatched), sent)

	ok, lost := 0, 0
	got := map[string]bool{}
	for len(got) < sent {
		m := in.next(t, "a reply after gateway A died")
		key := in.key(m)
		if got[key] {
			t.Fatalf("request %s answered twice", key)
		}
		got[key] = true
		r := gwDecode(t, m)
		switch {
		case r.Err == nil:
			ok++
			if tr := r.tag(t); tr.General["blue"] < 0.9 {
				t.Fatalf("%s: wrong tags %v", key, tr.General)
			}
		case r.Err.Code == codec.CodeWorkerLost && r.Err.Details["gateway"] == "gwa":
			lost++
			if !dispatched[key] {
				t.Fatalf("%s was never dispatched by A but was answered worker_lost", key)
			}
		default:
			t.Fatalf("%s: unexpected error %v", key, r.Err)
		}
	}
	// A's queued requests can only have been answered by B's takeover (A is dead), so
	// every request answered proves it; a request A had dispatched is answered
	// worker_lost, unless it finished before the kill.
	if lost > len(dispatched) {
		t.Fatalf("%d answered worker_lost; A had %d dispatched", lost, len(dispatched))
	}
	took := time.Since(killed)
	// No request ran twice: the worker ran each successful one once, and each lost one
	// (its answer went to the dead gateway) at most once.
	hb := waitWorker(t, nc, w.ID, func(h *codec.Heartbeat) bool { return h.Queued["interactive"] == 0 && h.Running["interactive"] == 0 })
	if int(hb.Served) < ok || int(hb.Served) > ok+lost {
		t.Fatalf("worker served %d; %d ok + %d lost: something ran twice or not at all", hb.Served, ok, lost)
	}
	// B keeps serving.
	if r := b.call(t, "tag", &codec.Request{Path: path}, 10*time.Second); r.Err != nil {
		t.Fatalf("gateway B after failover: %v", r.Err)
	}
	t.Logf("all %d answered %s after the kill: %d ok, %d worker_lost; worker ran %d", sent, took.Round(time.Millisecond), ok, lost, hb.Served)
}

// waitWorker polls a worker's stats until ok holds (bounded).
func waitWorker(t *testing.T, nc *nats.Conn, id string, ok func(*codec.Heartbeat) bool) *codec.Heartbeat {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		hb := stats(t, nc, id)
		if ok(hb) {
			return hb
		}
		if time.Now().After(deadline) {
			t.Fatalf("worker %s never reached the state: %+v", id, hb)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
