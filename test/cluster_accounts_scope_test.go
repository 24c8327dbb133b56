package test

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"testing"
	"time"

	ortclient "github.com/ortbus/ortbus/client"
	"github.com/ortbus/ortbus/codec"
	"github.com/ortbus/ortbus/config"
	"github.com/ortbus/ortbus/internal/testkit/testenv"
)

// accountsEnv is the account deployment of deploy/accounts as TestAccountScopes runs it:
// one NATS node with accounts.conf, a gateway of identity = "account" logged in as
// gateway (account ORTBUS) with one local cpu pool of one worker and one slot, the result
// cache on, a cpu device with a capacity for leases; the applications app1 (APP1) and
// app2 (APP2), and the operator ops inside ORTBUS.
type accountsEnv struct {
	app1, app2, ops *clusterConn
	c1, c2, cops    *ortclient.Client
	root            string
}

// startAccounts starts an accountsEnv for t.
func startAccounts(t *testing.T) *accountsEnv {
	t.Helper()
	tc := clusterWriteTLS(t)
	sec := newRoleSecrets(t, accountsRoles)
	node := clusterStartNode(t, "node", clusterWriteNode(t, tc, clusterNodeSpec{Name: "node", Host: "127.0.0.1", Standalone: true, JetStream: true,
		Include: filepath.Join(accountsDeployDir(t), "accounts.conf")}), sec.nodeEnvFor(t, accountsRoles))
	gwDir := t.TempDir()
	cpuPass := clusterWriteFile(t, filepath.Join(gwDir, "worker-cpu.pass"), sec["worker-cpu"]+"\n")
	root := imageRoot(t)
	gw := &config.Config{
		NATS: config.NATS{URL: node.URL, User: "gateway", TLSCA: tc.CA, InboxPrefix: "_INBOX_gateway",
			ReplyPrefixes: []string{"_R_", "_INBOX_ops"}},
		Gateway:  config.Gateway{ID: "acct", ShutdownGrace: config.Duration(3 * time.Second), Identity: config.IdentityAccount},
		Health:   config.Health{HeartbeatInterval: config.Duration(gwHeartbeat), MissCount: gwMissCount},
		Jobs:     config.Jobs{ItemsMaxBytes: 16 << 20, ResultsMaxBytes: 64 << 20},
		Cache:    config.Cache{Enabled: true, MaxBytes: 16 << 20},
		Security: config.Security{AllowedRoots: []string{root}},
		Devices:  map[string]config.Device{"cpu": {Capacity: 1 << 30, SafeFraction: 0.5}},
		Classes: map[string]*config.Class{
			"interactive": {Chain: []string{"cpu"}},
			"batch":       {Chain: []string{"cpu"}},
		},
		Pools: map[string]*config.Pool{
			"cpu": {Runtime: testenv.RuntimeLib(t, "1.30.0"), Threads: 1, Workers: 1, Slots: 1, Classes: []string{"interactive", "batch"},
				Models: []string{gwTagger}, NATS: &config.Credentials{User: "worker-cpu", PasswordFile: cpuPass}},
		},
		Models: gwModels(t),
	}
	gw.SetOrder("classes", "interactive", "batch")
	gw.SetOrder("pools", "cpu")
	gw.SetOrder("models", gwTagger, gwSlow)
	launchGateway(t, writeConfigFile(t, filepath.Join(gwDir, "gateway.toml"), gw), false, "ORTBUS_NATS_PASSWORD="+sec["gateway"])
	e := &accountsEnv{
		app1: clusterConnect(t, node.URL, sec, "app1", tc.CA),
		app2: clusterConnect(t, node.URL, sec, "app2", tc.CA),
		ops:  clusterConnect(t, node.URL, sec, "ops", tc.CA),
		root: root,
	}
	clusterWaitStatus(t, e.ops.Conn, "the cpu worker live", func(st *codec.StatusReply) bool { return len(gwLive(st, "cpu")) == 1 })
	e.c1, e.c2, e.cops = ortclient.New(e.app1.Conn), ortclient.New(e.app2.Conn), ortclient.New(e.ops.Conn)
	return e
}

// TestAccountScopes runs, under identity = "account" (deploy/accounts), what each
// application reaches of the shared gateway beyond its own requests and jobs (those are
// TestAccountOwners'): a client's cancel sent before its request wins over a cache hit;
// status names only the caller's own leases (the operator sees all); a pause holds only
// the caller's own work unless the operator paused, and status says whose pause it is.
func TestAccountScopes(t *testing.T) {
	e := startAccounts(t)
	ctx, cancel := context.WithTimeout(context.Background(), 4*gwReplyBound)
	defer cancel()
	noCache := false

	// An application's request posted to its own inbox, answered there under its id.
	in1 := newInboxAt(t, e.app1.Conn, e.app1.NewInbox())
	post := func(c *clusterConn, in *inbox, r codec.Request) {
		t.Helper()
		b, err := codec.Marshal(&r)
		if err != nil {
			t.Fatal(err)
		}
		if err := c.PublishRequest("ortbus.v1.tag", in.subject(r.ID), b); err != nil {
			t.Fatal(err)
		}
	}
	answer := func(in *inbox, id string) gwReply {
		t.Helper()
		m := in.next(t, "the answer to "+id)
		if k := in.key(m); k != id {
			t.Fatalf("an answer to %s (%s) came before the one to %s", k, gwDecode(t, m).code(), id)
		}
		return gwDecode(t, m)
	}

	t.Run("CacheEarlyCancel", func(t *testing.T) {
		red := colourPNG(t, e.root, "red")
		entries := func() uint64 {
			st, err := e.c1.CacheStats(ctx, "")
			if err != nil || !st.Enabled {
				t.Fatalf("cache.stats: %+v %v", st, err)
			}
			return st.Entries
		}
		n := entries()
		post(e.app1, in1, codec.Request{ID: "first", Path: red, Model: gwTagger})
		if r := answer(in1, "first"); r.code() != "ok" || r.tag(t).Timing.Cached {
			t.Fatalf("the first request of its bytes: %s, want computed", r.code())
		}
		checkFor(t, "app1's answer stored", gwReplyBound, pollEvery, func() error {
			if got := entries(); got != n+1 {
				return fmt.Errorf("%d entries, want %d", got, n+1)
			}
			return nil
		})
		// app1 cancels an id, then sends its request: the answer is in the cache, and the
		// cancel still wins (before: the hit was answered, the cancel ignored).
		if cr, err := e.c1.Cancel(ctx, "early"); err != nil || cr.Found {
			t.Fatalf("app1's cancel of an id not sent yet: %+v %v, want found false", cr, err)
		}
		post(e.app1, in1, codec.Request{ID: "early", Path: red, Model: gwTagger})
		if r := answer(in1, "early"); r.code() != string(codec.CodeCancelled) {
			t.Errorf("app1's request cancelled before it was sent, its answer cached: %s, want cancelled", r.code())
		}
		// The next request of the same bytes is a hit, and the only answer after the
		// cancelled one (no second answer to "early" came before it).
		post(e.app1, in1, codec.Request{ID: "after", Path: red, Model: gwTagger})
		if r := answer(in1, "after"); r.code() != "ok" || !r.tag(t).Timing.Cached {
			t.Errorf("the next request of the bytes: %s, want a cache hit", r.code())
		}
	})

	t.Run("StatusLeases", func(t *testing.T) {
		const holder = "app1-private-holder"
		l, err := e.c1.AcquireLease(ctx, "cpu", 100<<20, "interactive", holder, 60000)
		if err != nil || l.Lease == "" {
			t.Fatalf("app1: acquire: %+v, %v", l, err)
		}
		defer e.c1.ReleaseLease(ctx, l.Lease)
		cpu := func(c *ortclient.Client, who string) codec.DeviceStatus {
			t.Helper()
			st, err := c.Status(ctx)
			if err != nil {
				t.Fatalf("%s: status: %v", who, err)
			}
			for _, d := range st.Devices {
				if d.Device == "cpu" {
					return d
				}
			}
			t.Fatalf("%s: no device cpu in status", who)
			return codec.DeviceStatus{}
		}
		for _, x := range []struct {
			who    string
			c      *ortclient.Client
			leases []codec.LeaseReply // holder and lease id of each
		}{
			{"app1", e.c1, []codec.LeaseReply{{Holder: holder, Lease: l.Lease}}},
			{"app2", e.c2, nil},
			{"ops", e.cops, []codec.LeaseReply{{Holder: holder}}},
		} {
			d := cpu(x.c, x.who)
			var got []codec.LeaseReply
			for _, s := range d.Leases {
				got = append(got, codec.LeaseReply{Holder: s.Holder, Lease: s.Lease})
			}
			if !slices.Equal(got, x.leases) {
				t.Errorf("%s's status lists the leases %+v, want %+v", x.who, got, x.leases)
			}
			if d.LeasedBytes != 100<<20 {
				t.Errorf("%s's status: leased_bytes %d, want app1's lease counted", x.who, d.LeasedBytes)
			}
		}
	})

	t.Run("PauseScope", func(t *testing.T) {
		blue := colourPNG(t, e.root, "blue")
		batch := func(id string) codec.Request {
			return codec.Request{ID: id, Path: blue, Model: gwTagger, Class: "batch", Cache: &noCache}
		}
		queued := func(want int) func(*codec.StatusReply) bool {
			return func(st *codec.StatusReply) bool {
				for _, c := range st.Classes {
					if c.Name == "batch" {
						return c.Queued == want
					}
				}
				return false
			}
		}
		pauses := func(c *ortclient.Client, who string) []string {
			t.Helper()
			st, err := c.Status(ctx)
			if err != nil {
				t.Fatalf("%s: status: %v", who, err)
			}
			var out []string
			for _, p := range st.Pauses {
				out = append(out, p.Class+"/"+p.Owner)
			}
			return out
		}

		if _, err := e.c1.Pause(ctx, &codec.PauseRequest{Class: "batch", ForMS: 60_000}); err != nil {
			t.Fatalf("app1: pause batch: %v", err)
		}
		post(e.app1, in1, batch("a1-batch"))
		clusterWaitStatus(t, e.ops.Conn, "app1's batch request held by its pause", queued(1))
		// app2's batch work runs while app1's own pause lasts (before: held for app1).
		r2 := batch("a2-batch")
		m, err := e.app2.Request("ortbus.v1.tag", mustMarshal(t, &r2), gwReplyBound)
		if err != nil {
			t.Fatalf("app2's batch request under app1's pause: %v", err)
		}
		if r := gwDecode(t, m); r.code() != "ok" {
			t.Errorf("app2's batch request under app1's pause: %s", r.code())
		}
		clusterWaitStatus(t, e.ops.Conn, "app1's batch request still held", queued(1))
		// So are app1's job items, and app2's job runs to its end meanwhile.
		jobState := func(c *ortclient.Client, job string) *codec.JobStatus {
			t.Helper()
			st, err := c.JobStatus(ctx, job)
			if err != nil {
				t.Fatalf("status of job %s: %v", job, err)
			}
			return st
		}
		if _, err := e.c1.SubmitJob(ctx, &codec.JobSubmit{Job: "a1-paused-job", Op: "tag", Model: gwTagger, Items: []string{blue}, Options: &codec.Request{Cache: &noCache}}); err != nil {
			t.Fatalf("app1: job submit under its pause: %v", err)
		}
		clusterWaitStatus(t, e.ops.Conn, "app1's job item held by its pause beside its request", queued(2))
		if _, err := e.c2.SubmitJob(ctx, &codec.JobSubmit{Job: "a2-job", Op: "tag", Model: gwTagger, Items: []string{blue}, Options: &codec.Request{Cache: &noCache}}); err != nil {
			t.Fatalf("app2: job submit under app1's pause: %v", err)
		}
		checkFor(t, "app2's job done under app1's pause", gwReplyBound, pollEvery, func() error {
			if st := jobState(e.c2, "a2-job"); st.Done != 1 {
				return fmt.Errorf("app2's job: %+v", st)
			}
			return nil
		})
		if st := jobState(e.c1, "a1-paused-job"); st.Done != 0 || st.Failed != 0 {
			t.Errorf("app1's job ran under app1's own pause: %+v", st)
		}
		for who, want := range map[string][]string{"ops": {"batch/account:APP1"}, "app1": {"batch/account:APP1"}, "app2": nil} {
			c := map[string]*ortclient.Client{"ops": e.cops, "app1": e.c1, "app2": e.c2}[who]
			if got := pauses(c, who); !slices.Equal(got, want) {
				t.Errorf("%s's status lists the pauses %v, want %v", who, got, want)
			}
		}
		if r, err := e.c1.Pause(ctx, &codec.PauseRequest{Action: codec.PauseResume, Class: "batch"}); err != nil || !r.Resumed {
			t.Fatalf("app1: resume: %+v %v", r, err)
		}
		if r := answer(in1, "a1-batch"); r.code() != "ok" {
			t.Errorf("app1's batch request after its resume: %s", r.code())
		}
		checkFor(t, "app1's job done after its resume", gwReplyBound, pollEvery, func() error {
			if st := jobState(e.c1, "a1-paused-job"); st.Done != 1 {
				return fmt.Errorf("app1's job: %+v", st)
			}
			return nil
		})

		// The operator's pause holds everyone's work, and both see it as the operator's.
		if _, err := e.cops.Pause(ctx, &codec.PauseRequest{Class: "batch", ForMS: 60_000}); err != nil {
			t.Fatalf("ops: pause batch: %v", err)
		}
		in2 := newInboxAt(t, e.app2.Conn, e.app2.NewInbox())
		post(e.app2, in2, batch("a2-held"))
		clusterWaitStatus(t, e.ops.Conn, "app2's batch request held by the operator's pause", queued(1))
		if got := pauses(e.c2, "app2"); !slices.Equal(got, []string{"batch/"}) {
			t.Errorf("app2's status lists the pauses %v under the operator's, want batch/ (the operator's)", got)
		}
		if _, err := e.cops.Pause(ctx, &codec.PauseRequest{Action: codec.PauseResume, Class: "batch"}); err != nil {
			t.Fatal(err)
		}
		if r := answer(in2, "a2-held"); r.code() != "ok" {
			t.Errorf("app2's batch request after the operator's resume: %s", r.code())
		}
	})
	for _, c := range []*clusterConn{e.app1, e.app2, e.ops} {
		c.noErrors(t)
	}
}
