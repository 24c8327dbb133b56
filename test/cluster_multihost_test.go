package test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	ortclient "github.com/ortbus/ortbus/client"
	"github.com/ortbus/ortbus/codec"
	"github.com/ortbus/ortbus/config"
	"github.com/ortbus/ortbus/internal/testkit/testenv"
)

// clusterClientRoot is the image folder as the clients see it; the gateway's path_map for
// the remote pool turns it into the folder on the worker's "host". Nothing exists there
// on this machine, so a request served from it proves the mapping.
const clusterClientRoot = "/clientview/images"

// TestClusterMultiHost runs the multi-host layout of deploy/multi-host.md on one machine:
// three NATS nodes (natsembed) on 127.0.0.1, .2 and .3 forming a cluster over mutual-TLS
// routes (nodes 2 and 3 route to node 1), with client TLS and deploy/cluster/permissions.conf;
// a gateway on node 1 (external NATS, not embedded) with a local pool `cpu` (interactive)
// that it supervises, and a remote pool `cuda` (local = false, batch) whose ortworker the
// test starts as a remote host would, on node 3, as user worker-cuda, with the gateway
// mapping /clientview/images to the folder the worker may read. The gateway logs in as
// user gateway, which has no worker rights: its local worker logs in as worker-cpu
// ([pools.cpu.nats]), without the gateway's password in its environment, and is live only
// because that login lets it heartbeat. Clients connect to node 1 as user client, with
// its inbox prefix. It checks that requests reach both pools (the remote one through the
// path map), that killing node 2 (SIGKILL) in the middle of a stream of requests loses
// none of them, and that a remote worker stopped with SIGSTOP is judged dead by its
// heartbeats and its held requests answered within 3 intervals + 0.5 s. JetStream runs on
// all three nodes: a job submitted by the client user runs on the remote pool, its streams
// replicated three times, under the permissions' gateway role.
func TestClusterMultiHost(t *testing.T) {
	tc := clusterWriteTLS(t)
	sec := newClusterSecrets(t)
	env := sec.nodeEnv(t)

	t0 := time.Now()
	p1 := freePort(t, "127.0.0.1")
	self := fmt.Sprintf("127.0.0.1:%d", p1)
	n1 := clusterStartNode(t, "node1", clusterWriteNode(t, tc, clusterNodeSpec{Name: "node1", Host: "127.0.0.1", JetStream: true, ClusterPort: p1, Routes: []string{self}}), env)
	n2 := clusterStartNode(t, "node2", clusterWriteNode(t, tc, clusterNodeSpec{Name: "node2", Host: "127.0.0.2", JetStream: true, Routes: []string{n1.Cluster}}), env)
	n3 := clusterStartNode(t, "node3", clusterWriteNode(t, tc, clusterNodeSpec{Name: "node3", Host: "127.0.0.3", JetStream: true, Routes: []string{n1.Cluster}}), env)
	nodes := []*clusterNode{n1, n2, n3}
	for _, n := range nodes {
		if !strings.HasPrefix(n.URL, "tls://") {
			t.Fatalf("node %s serves clients on %s, want TLS", n.Name, n.URL)
		}
	}
	clusterWaitMesh(t, nodes, sec, tc)
	t.Logf("three nodes meshed in %v: %s %s %s", time.Since(t0).Round(time.Millisecond), n1.URL, n2.URL, n3.URL)

	// The files, as the remote host sees them (the worker's allowed root), and their
	// client-side names.
	root := imageRoot(t)
	red := colourPNG(t, root, "red")
	clientRed := clusterClientRoot + "/red.png"

	// 250 ms beats, dead after 3 missed: killing node 2 sets JetStream's three-node streams
	// electing on a loaded 2-core machine, and a 300 ms silence of the remote worker was seen
	// there (its requests then answered worker_lost, though it never died).
	hb := config.Duration(250 * time.Millisecond)

	// The worker host: pool cuda (a CPU runtime here) on node 3, as worker-cuda.
	workerCfg := writeConfigFile(t, filepath.Join(t.TempDir(), "worker-cuda.toml"), &config.Config{
		NATS:     config.NATS{URL: n3.URL, User: "worker-cuda", TLSCA: tc.CA},
		Health:   config.Health{HeartbeatInterval: hb},
		Security: config.Security{AllowedRoots: []string{root}},
		Pools: map[string]*config.Pool{"cuda": {Runtime: testenv.RuntimeLib(t, "1.24.3"), Threads: 1, Slots: 2,
			Classes: []string{"batch"}, Models: []string{gwTagger, gwSlow}}},
		Models: gwModels(t),
	})

	// The app host: the gateway on node 1 with its local pool cpu and the remote pool,
	// whose device is another host's (not this host's "cpu", which the gateway would
	// share between the two pools). The gateway's password comes from the environment,
	// its local workers' from the pool's password file.
	gwDir := t.TempDir()
	cpuPass := clusterWriteFile(t, filepath.Join(gwDir, "worker-cpu.pass"), sec["worker-cpu"]+"\n")
	remotePool := false
	gw := &config.Config{
		NATS:    config.NATS{URL: n1.URL, User: "gateway", TLSCA: tc.CA, InboxPrefix: "_INBOX_gateway"},
		Gateway: config.Gateway{ID: "gw1", ShutdownGrace: config.Duration(3 * time.Second)},
		Health:  config.Health{HeartbeatInterval: hb, MissCount: 3},
		// Job streams on all three nodes, within the test nodes' 256MB file store.
		Jobs:     config.Jobs{Replicas: 3, ItemsMaxBytes: 16 << 20, ResultsMaxBytes: 64 << 20},
		Security: config.Security{AllowedRoots: []string{root}},
		Classes: map[string]*config.Class{
			"interactive": {Chain: []string{"cpu"}},
			"batch":       {Chain: []string{"cuda"}},
		},
		Pools: map[string]*config.Pool{
			"cpu": {Runtime: testenv.RuntimeLib(t, "1.30.0"), Threads: 1, Workers: 1, Slots: 1, Classes: []string{"interactive"},
				Models: []string{gwTagger}, NATS: &config.Credentials{User: "worker-cpu", PasswordFile: cpuPass}},
			"cuda": {Local: &remotePool, Device: "gpuhost:0", Classes: []string{"batch"}, Models: []string{gwTagger, gwSlow},
				PathMap: map[string]string{clusterClientRoot: root}},
		},
		Models: gwModels(t),
	}
	gw.SetOrder("classes", "interactive", "batch")
	gw.SetOrder("pools", "cpu", "cuda")
	gwCfg := writeConfigFile(t, filepath.Join(gwDir, "gateway.toml"), gw)

	remote := launch(t, workerCfg, "cuda", "ORTBUS_NATS_PASSWORD="+sec["worker-cuda"])
	g := launchGateway(t, gwCfg, false, "ORTBUS_NATS_PASSWORD="+sec["gateway"])
	remote.ready(t)
	client := clusterConnect(t, n1.URL, sec, "client", tc.CA)
	st := clusterWaitStatus(t, client.Conn, "the local and the remote worker live", func(st *codec.StatusReply) bool {
		return len(gwLive(st, "cpu")) == 1 && len(gwLive(st, "cuda")) == 1
	})
	for _, p := range st.Pools {
		if p.Local != (p.Name == "cpu") {
			t.Errorf("status: pool %s local = %v", p.Name, p.Local)
		}
	}
	// The local worker is live: its heartbeats reach the gateway, which only worker-cpu
	// may publish. And the gateway's password is not in its environment.
	for id, w := range gwLive(st, "cpu") {
		environ, err := os.ReadFile(fmt.Sprintf("/proc/%d/environ", w.PID))
		if err != nil {
			t.Fatalf("local worker %s: %v", id, err)
		}
		if strings.Contains("\x00"+string(environ), "\x00ORTBUS_NATS_PASSWORD=") {
			t.Errorf("local worker %s (pid %d) has ORTBUS_NATS_PASSWORD in its environment", id, w.PID)
		}
	}
	t.Logf("gateway and both pools ready %v after start", time.Since(t0).Round(time.Millisecond))

	call := func(t *testing.T, req *codec.Request) gwReply {
		t.Helper()
		b, err := codec.Marshal(req)
		if err != nil {
			t.Fatal(err)
		}
		m, err := client.Request("ortbus.v1.tag", b, gwReplyBound)
		if err != nil {
			t.Fatalf("tag %+v: %v", req, err)
		}
		return gwDecode(t, m)
	}
	checkServed := func(t *testing.T, key string, r gwReply, pool, worker string) {
		t.Helper()
		if r.Err != nil {
			t.Errorf("%s: %s: %s (details %v)", key, r.Err.Code, r.Err.Message, r.Err.Details)
			return
		}
		tr := r.tag(t)
		if tr.Pool != pool || (worker != "" && tr.Worker != worker) {
			t.Errorf("%s: served by %s/%s, want pool %s %s", key, tr.Pool, tr.Worker, pool, worker)
		}
		checkColourTag(t, tr, "red")
	}

	t.Run("Routing", func(t *testing.T) {
		checkServed(t, "interactive", call(t, &codec.Request{Path: red, Model: gwTagger}), "cpu", "cpu-0@gw1") // the gateway supervises it: <pool>-<slot>@<gateway id>
		// The client names the file by its client-side path; the remote worker reads it
		// under its own root.
		checkServed(t, "batch", call(t, &codec.Request{Path: clientRed, Model: gwTagger, Class: "batch"}), "cuda", remote.ID)
		// A path the remote pool's map does not cover never leaves the gateway.
		if r := call(t, &codec.Request{Path: red, Model: gwTagger, Class: "batch"}); r.code() != string(codec.CodeForbiddenPath) {
			t.Errorf("batch with an unmapped path: %s, want forbidden_path", r.code())
		}
	})

	t.Run("Job", func(t *testing.T) {
		// A job from the client user, under the cluster's permissions: the gateway creates
		// the replicated streams, runs the items on the remote pool and records results.
		c := ortclient.New(client.Conn)
		// The store opens once the cluster's JetStream has elected its leaders and placed
		// the replicated streams: the test waits for the gateway to say so, not for a
		// budget; jobStoreOpenBound only ends a test whose gateway never does. (A request
		// sent before the meta leader is lost: it cost a whole 30 s attempt, about one run
		// in two, until an attempt's first bound became short: gateway/jsopen.go.)
		g.awaitJobStore(t)
		ctx, cancel := context.WithTimeout(context.Background(), 4*gwReplyBound)
		defer cancel()
		sub, err := c.SubmitJob(ctx, &codec.JobSubmit{Job: "cluster", Op: "tag", Model: gwTagger, Items: []string{clientRed, clientRed, clientRed}})
		if err != nil {
			t.Fatalf("submit once the store is open: %v", err)
		}
		st, err := c.WatchJob(ctx, sub.Job, 20*time.Millisecond, nil)
		if err != nil || st.State != codec.JobDone || st.Done != 3 {
			t.Fatalf("job: %+v, %v; want 3 done", st, err)
		}
		n := 0
		if err := c.EachJobResult(ctx, sub.Job, func(r *codec.JobResult) error {
			n++
			if tr, ok := r.Result.(*codec.TagReply); !ok || tr.Pool != "cuda" {
				t.Errorf("item %d: %+v, want a tag reply from pool cuda", r.Index, r)
			} else {
				checkColourTag(t, tr, "red")
			}
			return nil
		}); err != nil || n != 3 {
			t.Fatalf("results: %d, %v", n, err)
		}
		// The client user has no JetStream rights: it reaches jobs only through the API.
		if err := client.PublishRequest("$JS.API.STREAM.PURGE.ORTBUS_JOB_RESULTS", client.NewInbox(), nil); err != nil {
			t.Fatal(err)
		}
		client.violation(t, "Publish", "$JS.API.STREAM.PURGE.ORTBUS_JOB_RESULTS")
	})

	t.Run("NodeLossMidStream", func(t *testing.T) {
		// A stream of requests, batch (remote pool, through node 1 -> node 3) and
		// interactive (local pool) alternately. Half is sent, node 2 is killed once some
		// answers are in (so requests are in flight), then the rest is sent.
		const n = 60
		in := clusterNewInbox(t, client.Conn)
		post := func(i int) error {
			req := &codec.Request{ID: fmt.Sprintf("r%02d", i), Path: red, Model: gwTagger}
			if i%2 == 0 {
				req.Path, req.Class = clientRed, "batch"
			}
			b, err := codec.Marshal(req)
			if err != nil {
				return err
			}
			return client.PublishRequest("ortbus.v1.tag", in.subject(req.ID), b)
		}
		killed := make(chan struct{})
		var release sync.Once // the sender is never left blocked, even if t fails first
		defer release.Do(func() { close(killed) })
		sendErr := make(chan error, 1)
		var sent atomic.Int32
		go func() {
			for i := 0; i < n; i++ {
				if i == n/2 {
					<-killed
				}
				if err := post(i); err != nil {
					sendErr <- err
					return
				}
				sent.Add(1)
				time.Sleep(5 * time.Millisecond)
			}
			sendErr <- nil
		}()
		got := map[string]gwReply{}
		var died time.Time
		for len(got) < n {
			m := in.next(t, fmt.Sprintf("answer %d of %d", len(got)+1, n))
			k := in.key(m)
			if _, dup := got[k]; dup {
				t.Errorf("a second answer for %s", k)
				continue
			}
			got[k] = gwDecode(t, m)
			if len(got) == 10 {
				if err := n2.lp.Signal(syscall.SIGKILL); err != nil {
					t.Fatal(err)
				}
				select {
				case <-n2.lp.Exited():
				case <-time.After(exitBound):
					t.Fatal("node 2 did not die")
				}
				died = time.Now()
				k := int(sent.Load())
				t.Logf("node 2 killed with %d of %d requests sent, %d of them in flight", k, n, k-len(got))
				release.Do(func() { close(killed) })
			}
		}
		if err := <-sendErr; err != nil {
			t.Fatalf("sending: %v", err)
		}
		for i := 0; i < n; i++ {
			k := fmt.Sprintf("r%02d", i)
			if i%2 == 0 {
				checkServed(t, k, got[k], "cuda", remote.ID)
			} else {
				checkServed(t, k, got[k], "cpu", "cpu-0@gw1") // the gateway supervises it: <pool>-<slot>@<gateway id>
			}
		}
		// Nothing more arrives: every request got exactly one answer.
		if err := client.Flush(); err != nil {
			t.Fatal(err)
		}
		select {
		case m := <-in.ch:
			t.Errorf("an extra answer for %s", in.key(m))
		default:
		}
		t.Logf("%d requests, %d answered, all served, the last %v after node 2 died", n, len(got), time.Since(died).Round(time.Millisecond))
		if u := client.ConnectedUrl(); !strings.Contains(u, "127.0.0.1") {
			t.Errorf("the client moved to %s", u)
		}
	})

	t.Run("RemoteWorkerStopped", func(t *testing.T) {
		// The claims go to the gateway (gw1); a spy with the gateway's credentials hears them.
		spy := clusterConnect(t, n1.URL, sec, "gateway", tc.CA)
		claims := newGWSpy(t, spy.Conn, "ortbus.claim.>")
		in := clusterNewInbox(t, client.Conn)
		post := func(id, model string) {
			b, err := codec.Marshal(&codec.Request{ID: id, Path: clientRed, Model: model, Class: "batch"})
			if err != nil {
				t.Fatal(err)
			}
			if err := client.PublishRequest("ortbus.v1.tag", in.subject(id), b); err != nil {
				t.Fatal(err)
			}
		}
		ids := []string{"s1", "s2", "s3"}
		for _, id := range ids {
			post(id, gwSlow)
		}
		// Two slots: s1 and s2 are held by the worker, s3 waits in the gateway.
		c1, c2 := gwClaimOf(t, claims, "s1"), gwClaimOf(t, claims, "s2")
		if c1.Worker != remote.ID || c2.Worker != remote.ID {
			t.Fatalf("claims by %s and %s, want %s", c1.Worker, c2.Worker, remote.ID)
		}
		pid := remote.lp.PID()
		if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
			t.Fatal(err)
		}
		stopped := time.Now()
		t.Cleanup(func() { syscall.Kill(pid, syscall.SIGCONT) }) // harmless once it is killed
		bound := gwMissCount*gwHeartbeat + 500*time.Millisecond
		got := map[string]gwReply{}
		for len(got) < len(ids) {
			m := in.next(t, "an answer of a request of the stopped worker")
			k := in.key(m)
			if _, dup := got[k]; dup {
				t.Errorf("a second answer for %s", k)
				continue
			}
			r := gwDecode(t, m)
			got[k] = r
			lat := r.At.Sub(stopped)
			t.Logf("%s: %s %v after the stop (%v)", k, r.code(), lat.Round(time.Millisecond), r.Err)
			switch {
			case lat > bound:
				t.Errorf("%s answered %v after the worker stopped, want within %v (3 heartbeats + 0.5 s)", k, lat, bound)
			case r.Err == nil && k != "s3":
				// Finished just before the stop: possible, but then it was not lost.
			case r.Err == nil:
				t.Errorf("s3 served while the only worker of its pool was stopped")
			case r.Err.Code != codec.CodeWorkerLost && r.Err.Code != codec.CodeNoWorker:
				t.Errorf("%s: %s, want worker_lost or no_worker", k, r.Err.Code)
			}
		}
		if got["s1"].Err == nil && got["s2"].Err == nil {
			t.Errorf("both held requests were served: the stop came too late to test anything")
		}
		st := clusterStatus(t, client.Conn)
		if l := gwLive(st, "cuda"); len(l) != 0 {
			t.Errorf("the stopped worker is still live in the status: %v", l)
		}
		// While the pool has no live worker, a batch request fails at once, clearly.
		if r := call(t, &codec.Request{Path: clientRed, Model: gwTagger, Class: "batch"}); r.code() != string(codec.CodeNoWorker) {
			t.Errorf("batch with the remote pool down: %s, want no_worker", r.code())
		}

		// Resumed, it heartbeats again and serves again; what it held was answered
		// already and is not answered twice.
		if err := syscall.Kill(pid, syscall.SIGCONT); err != nil {
			t.Fatal(err)
		}
		clusterWaitStatus(t, client.Conn, "the resumed worker live again", func(st *codec.StatusReply) bool {
			return len(gwLive(st, "cuda")) == 1
		})
		checkServed(t, "after resume", call(t, &codec.Request{Path: clientRed, Model: gwSlow, Class: "batch"}), "cuda", remote.ID)
		// The resumed worker finished s1 and s2 before the request just served (one slot
		// each, FIFO within a class); their answers went to the gateway, which must not
		// forward them.
		if err := client.Flush(); err != nil {
			t.Fatal(err)
		}
		select {
		case m := <-in.ch:
			t.Errorf("a second answer for %s after the worker resumed", in.key(m))
		default:
		}
	})

	if !g.alive() {
		t.Fatalf("the gateway died: %v", g.lp.State())
	}
	// The roles' permissions were enough for everything above: no worker (the remote one,
	// or the local one whose log is in the gateway's) was refused anything by the server.
	for who, log := range map[string]string{"remote worker": remote.lp.Log(), "gateway and local worker": g.log()} {
		if strings.Contains(strings.ToLower(log), "permissions violation") {
			t.Errorf("the %s met a permissions violation:\n%s", who, log)
		}
	}
}

// clusterWaitMesh waits until a message published on each node reaches a subscriber on
// each other node: every route of the full mesh (2-3 learnt from node 1) is up. The
// probes are heartbeats of pool cpu, published as worker-cpu and heard as gateway.
func clusterWaitMesh(t *testing.T, nodes []*clusterNode, sec clusterSecrets, tc *clusterTLS) {
	t.Helper()
	var all []*clusterConn
	defer func() {
		for _, c := range all {
			c.Close()
		}
	}()
	dial := func(n *clusterNode, user string) *clusterConn {
		c, err := clusterDial(n.URL, user, sec[user], tc.CA)
		if err != nil {
			t.Fatalf("connect to %s as %s: %v", n.Name, user, err)
		}
		all = append(all, c)
		return c
	}
	conns := make([]*clusterConn, len(nodes))   // publishers
	hearers := make([]*clusterConn, len(nodes)) // subscribers
	for i, n := range nodes {
		conns[i], hearers[i] = dial(n, "worker-cpu"), dial(n, "gateway")
	}
	deadline := time.Now().Add(clusterStartBound)
	for j := range conns {
		to := hearers[j]
		subject := "ortbus.hb.cpu.meshprobe-" + nodes[j].Name
		sub, err := to.SubscribeSync(subject)
		if err != nil {
			t.Fatal(err)
		}
		if err := to.Flush(); err != nil {
			t.Fatal(err)
		}
		for i, from := range conns {
			if i == j {
				continue
			}
			// One deadline for the whole probe; each try waits pollEvery for its message.
			what := fmt.Sprintf("a message from %s to %s (the cluster meshed, all pairs within %v)", nodes[i].Name, nodes[j].Name, clusterStartBound)
			checkFor(t, what, time.Until(deadline), 0, func() error {
				if err := from.Publish(subject, []byte(nodes[i].Name)); err != nil {
					t.Fatal(err)
				}
				m, err := sub.NextMsg(pollEvery)
				switch {
				case err == nil && string(m.Data) == nodes[i].Name:
					return nil
				case err == nil:
					return fmt.Errorf("got %q", m.Data)
				case errors.Is(err, nats.ErrTimeout):
					return err
				}
				t.Fatal(err)
				return nil
			})
			// Probes of this sender still in flight are skipped by the next sender's
			// check of the data.
		}
		sub.Unsubscribe()
	}
}
