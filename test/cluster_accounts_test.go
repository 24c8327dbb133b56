package test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	ortclient "github.com/ortbus/ortbus/client"
	"github.com/ortbus/ortbus/codec"
	"github.com/ortbus/ortbus/config"
	"github.com/ortbus/ortbus/internal/testkit/testenv"
	"github.com/ortbus/ortbus/jobs"
	"github.com/ortbus/ortbus/subjects"
)

// accountsRoles are the users of deploy/accounts/accounts.conf: ortbus's own (account
// ORTBUS) and one per example application account (APP1, APP2). Some get their password
// as a bcrypt hash, some as plaintext.
var accountsRoles = []clusterRole{
	{"gateway", "ORTBUS_NATS_GATEWAY_PASSWORD", true},
	{"worker-cuda", "ORTBUS_NATS_WORKER_CUDA_PASSWORD", false},
	{"worker-openvino", "ORTBUS_NATS_WORKER_OPENVINO_PASSWORD", true},
	{"worker-cpu", "ORTBUS_NATS_WORKER_CPU_PASSWORD", true},
	{"ops", "ORTBUS_NATS_OPS_PASSWORD", false},
	{"app1", "ORTBUS_NATS_APP1_PASSWORD", true},
	{"app2", "ORTBUS_NATS_APP2_PASSWORD", false},
}

// accountsDeployDir is deploy/accounts of the repository.
func accountsDeployDir(t testing.TB) string {
	return filepath.Join(testenv.RepoRoot(t), "deploy", "accounts")
}

// TestAccountOwners runs the account-based deployment of deploy/accounts: one NATS node
// (natsembed) on a config of the shape of deploy/accounts/node.conf — client TLS,
// JetStream, and deploy/accounts/accounts.conf itself, with passwords generated here and
// given through the environment variables it names — and a gateway with
// gateway.identity = "account" logged in as user gateway of account ORTBUS (a local cpu
// pool whose worker logs in as worker-cpu, jobs in JetStream, a cpu device with a declared
// capacity for leases). The applications app1 (account APP1) and app2 (account APP2) reach
// the API only through their service imports, the operator ops from inside ORTBUS. With
// real requests it proves that an application cannot read another's replies (app2
// listening to everything of its account sees nothing of app1's traffic), nor list, read,
// cancel or take the id of another's job, nor renew or release another's lease, nor cancel
// another's request (in flight, or before it arrives); and that each can do all of these
// to its own, and ops sees every job.
func TestAccountOwners(t *testing.T) {
	tc := clusterWriteTLS(t)
	sec := newRoleSecrets(t, accountsRoles)

	t.Run("DeployFiles", func(t *testing.T) { accountsCheckDeploy(t, tc) })

	node := clusterStartNode(t, "node", clusterWriteNode(t, tc, clusterNodeSpec{Name: "node", Host: "127.0.0.1", Standalone: true, JetStream: true,
		Include: filepath.Join(accountsDeployDir(t), "accounts.conf")}), sec.nodeEnvFor(t, accountsRoles))
	if !strings.HasPrefix(node.URL, "tls://127.0.0.1:") {
		t.Fatalf("node URL %q, want tls://127.0.0.1:PORT", node.URL)
	}

	// Images; app1's are named so that any of its traffic seen elsewhere gives itself away.
	root := imageRoot(t)
	red := colourPNG(t, root, "red")
	const app1Mark = "app1-private"
	app1Red := filepath.Join(root, app1Mark+"-red.png")
	app1Blue := filepath.Join(root, app1Mark+"-blue.png")
	for src, dst := range map[string]string{red: app1Red, colourPNG(t, root, "blue"): app1Blue} {
		b, err := os.ReadFile(src)
		if err != nil {
			t.Fatal(err)
		}
		clusterWriteFile(t, dst, string(b))
	}

	// The gateway, as in deploy/accounts/gateway.toml: identity = "account" (an
	// application's answers relayed by the gateway on its own: a work item may not carry an
	// _R_ reply subject), the reply prefixes of imported requests (_R_) and of the
	// operator, its local pool's worker as worker-cpu.
	gwDir := t.TempDir()
	cpuPass := clusterWriteFile(t, filepath.Join(gwDir, "worker-cpu.pass"), sec["worker-cpu"]+"\n")
	gw := &config.Config{
		NATS: config.NATS{URL: node.URL, User: "gateway", TLSCA: tc.CA, InboxPrefix: "_INBOX_gateway",
			ReplyPrefixes: []string{"_R_", "_INBOX_ops"}},
		Gateway:  config.Gateway{ID: "acct", ShutdownGrace: config.Duration(3 * time.Second), Identity: config.IdentityAccount},
		Health:   config.Health{HeartbeatInterval: config.Duration(gwHeartbeat), MissCount: gwMissCount},
		Jobs:     config.Jobs{ItemsMaxBytes: 16 << 20, ResultsMaxBytes: 64 << 20}, // within the test node's 256MB store
		Cache:    config.Cache{Enabled: true, MaxBytes: 16 << 20},
		Security: config.Security{AllowedRoots: []string{root}},
		Devices:  map[string]config.Device{"cpu": {Capacity: 1 << 30, SafeFraction: 0.5}}, // budget 512 MiB, for leases
		Classes: map[string]*config.Class{
			"interactive": {Chain: []string{"cpu"}},
			"batch":       {Chain: []string{"cpu"}},
		},
		Pools: map[string]*config.Pool{
			"cpu": {Runtime: testenv.RuntimeLib(t, "1.30.0"), Threads: 1, Workers: 1, Slots: 1, Classes: []string{"interactive", "batch"},
				Models: []string{gwTagger, gwSlow}, NATS: &config.Credentials{User: "worker-cpu", PasswordFile: cpuPass}},
		},
		Models: gwModels(t),
	}
	gw.SetOrder("classes", "interactive", "batch")
	gw.SetOrder("pools", "cpu")
	gw.SetOrder("models", gwTagger, gwSlow)
	g := launchGateway(t, writeConfigFile(t, filepath.Join(gwDir, "gateway.toml"), gw), false, "ORTBUS_NATS_PASSWORD="+sec["gateway"])

	app1 := clusterConnect(t, node.URL, sec, "app1", tc.CA)
	app2 := clusterConnect(t, node.URL, sec, "app2", tc.CA)
	ops := clusterConnect(t, node.URL, sec, "ops", tc.CA)
	clusterWaitStatus(t, ops.Conn, "the cpu worker live", func(st *codec.StatusReply) bool { return len(gwLive(st, "cpu")) == 1 })
	c1, c2, cops := ortclient.New(app1.Conn), ortclient.New(app2.Conn), ortclient.New(ops.Conn)

	// app2 listens to everything of its account from the start; at the end, after a marker
	// of its own, it must have seen nothing of app1's.
	spy := accountsListen(t, app2)

	// Each application's request/reply inbox (nats.go answers a connection's requests
	// under one prefix): app2's own, the only one its spy may see.
	inboxOf := func(c *clusterConn) string {
		t.Helper()
		m, err := c.Request("ortbus.v1.status", []byte{0x80}, clusterEventBound)
		if err != nil {
			t.Fatalf("%s: status: %v", c.User, err)
		}
		if !strings.HasPrefix(m.Subject, "_INBOX.") {
			t.Fatalf("%s: the answer came on %s, want its own _INBOX in its account", c.User, m.Subject)
		}
		return subjects.InboxOwner(m.Subject)
	}
	app1Inboxes := []string{inboxOf(app1)}
	app2Inboxes := []string{inboxOf(app2)}

	ctx, cancel := context.WithTimeout(context.Background(), 4*gwReplyBound)
	defer cancel()

	t.Run("Tag", func(t *testing.T) {
		b, err := codec.Marshal(&codec.Request{ID: "app1-tag", Path: app1Red, Model: gwTagger})
		if err != nil {
			t.Fatal(err)
		}
		m, err := app1.Request("ortbus.v1.tag", b, gwReplyBound)
		if err != nil {
			t.Fatalf("app1: tag: %v", err)
		}
		r := gwDecode(t, m)
		checkColourTag(t, r.tag(t), "red")
		if subjects.InboxOwner(m.Subject) != app1Inboxes[0] {
			t.Errorf("app1's answer came on %s, want its own inbox %s", m.Subject, app1Inboxes[0])
		}
	})

	t.Run("Jobs", func(t *testing.T) {
		// Job ids are per account (jobs/owner.go): app2 uses the id app1 will use before
		// app1 does, and both are their own jobs; neither learns of the other's.
		const job = "app1-job"
		app1Key, app2Key := jobs.Key("account:APP1", job), jobs.Key("account:APP2", job)
		g.awaitJobStore(t)
		if _, err := c2.SubmitJob(ctx, &codec.JobSubmit{Job: job, Op: "tag", Model: gwTagger, Items: []string{red}}); err != nil {
			t.Fatalf("app2: submit once the store is open: %v", err)
		}
		if st, err := c2.WatchJob(ctx, job, 20*time.Millisecond, nil); err != nil || st.State != codec.JobDone || st.Total != 1 || st.Job != job {
			t.Fatalf("app2's job %s: %+v, %v; want its 1 item done", job, st, err)
		}
		submit := &codec.JobSubmit{Job: job, Op: "tag", Model: gwTagger, Items: []string{app1Red, app1Blue}}
		if rep, err := c1.SubmitJob(ctx, submit); err != nil || rep.Job != job || rep.Total != 2 {
			t.Fatalf("app1: submit %s, an id app2 uses too: %+v, %v; want its own job of 2 items", job, rep, err)
		}
		st, err := c1.WatchJob(ctx, job, 20*time.Millisecond, nil)
		if err != nil || st.State != codec.JobDone || st.Done != 2 || st.Job != job {
			t.Fatalf("app1's job: %+v, %v; want 2 done", st, err)
		}
		// app2's other job, which app1 must not see either.
		if _, err := c2.SubmitJob(ctx, &codec.JobSubmit{Job: "app2-job", Op: "tag", Model: gwTagger, Items: []string{red}}); err != nil {
			t.Fatalf("app2: submit its own job: %v", err)
		}
		if st, err := c2.WatchJob(ctx, "app2-job", 20*time.Millisecond, nil); err != nil || st.State != codec.JobDone {
			t.Fatalf("app2's job: %+v, %v", st, err)
		}

		listed := func(c *ortclient.Client, who string) []string {
			t.Helper()
			l, err := c.ListJobs(ctx)
			if err != nil {
				t.Fatalf("%s: job.list: %v", who, err)
			}
			var ids []string
			for _, j := range l.Jobs {
				ids = append(ids, j.Job)
			}
			slices.Sort(ids)
			return ids
		}
		if ids := listed(c1, "app1"); !slices.Equal(ids, []string{job}) {
			t.Errorf("app1's job.list: %v, want only %s", ids, job)
		}
		if ids := listed(c2, "app2"); !slices.Equal(ids, []string{job, "app2-job"}) {
			t.Errorf("app2's job.list: %v, want its %s and app2-job", ids, job)
		}
		// ops sees every job, a tenant's by its key.
		keys := []string{app1Key, app2Key, jobs.Key("account:APP2", "app2-job")}
		slices.Sort(keys)
		if ids := listed(cops, "ops"); !slices.Equal(ids, keys) {
			t.Errorf("ops' job.list: %v, want both applications' jobs by key %v", ids, keys)
		}
		// A forged Nats-Request-Info naming APP1 is replaced by the server: app2 still
		// lists only its own (each of one item; app1's has two).
		forged := nats.NewMsg("ortbus.v1.job.list")
		forged.Data = []byte{0x80}
		forged.Header.Set("Nats-Request-Info", `{"acc":"APP1"}`)
		if m, err := app2.RequestMsg(forged, gwReplyBound); err != nil {
			t.Fatalf("app2: job.list with a forged header: %v", err)
		} else {
			var l codec.JobListReply
			err := ortclient.Decode(m, &l)
			if err != nil || len(l.Jobs) != 2 || l.Jobs[0].Total != 1 || l.Jobs[1].Total != 1 {
				t.Errorf("app2's job.list with a forged Nats-Request-Info of APP1: %+v, %v; want only its own two jobs", l, err)
			}
		}

		// app2 cannot read, page or cancel app1's job, by app1's key either: it does not
		// exist for app2.
		_, err = c2.JobStatus(ctx, app1Key)
		wantCode(t, "app2's job.status of app1's key", err, codec.CodeUnknownJob)
		_, err = c2.JobResults(ctx, app1Key, 0, 0)
		wantCode(t, "app2's job.results of app1's key", err, codec.CodeUnknownJob)
		_, err = c2.CancelJob(ctx, app1Key)
		wantCode(t, "app2's job.cancel of app1's key", err, codec.CodeUnknownJob)
		_, err = c2.PauseJob(ctx, app1Key)
		wantCode(t, "app2's job.pause of app1's key", err, codec.CodeUnknownJob)
		_, err = c2.ResumeJob(ctx, app1Key)
		wantCode(t, "app2's job.resume of app1's key", err, codec.CodeUnknownJob)
		// The id names app2's own job to app2: its results, re-submit and cancel reach that.
		if r, err := c2.JobResults(ctx, job, 0, 0); err != nil || len(r.Results) != 1 || r.Results[0].Path != red {
			t.Errorf("app2's job.results of its %s: %+v, %v; want its one result, of %s", job, r, err, red)
		}
		// A re-submit of the same id and items by app2 is its own job again: the same
		// items, no conflict that would tell it app1 has one.
		if rep, err := c2.SubmitJob(ctx, &codec.JobSubmit{Job: job, Op: "tag", Model: gwTagger, Items: []string{red}}); err != nil || rep.Total != 1 {
			t.Errorf("app2's re-submit of its %s: %+v, %v", job, rep, err)
		}
		if st, err := c2.CancelJob(ctx, job); err != nil || st.Total != 1 || st.Job != job {
			t.Errorf("app2's job.cancel of its %s: %+v, %v; want its own job of 1 item", job, st, err)
		}

		// app1's job is untouched: done, its two results readable by app1 (and ops, by key).
		for who, c := range map[string]*ortclient.Client{"app1": c1, "ops": cops} {
			id := map[string]string{"app1": job, "ops": app1Key}[who]
			st, err := c.JobStatus(ctx, id)
			if err != nil || st.State != codec.JobDone || st.Done != 2 || st.Job != id {
				t.Errorf("%s: app1's job after app2's: %+v, %v; want done, 2 done, as %s", who, st, err, id)
			}
		}
		n := 0
		if err := c1.EachJobResult(ctx, job, func(r *codec.JobResult) error {
			n++
			if r.Path != app1Red && r.Path != app1Blue {
				t.Errorf("app1's result of %s: not one of its items", r.Path)
			}
			return nil
		}); err != nil || n != 2 {
			t.Errorf("app1's results: %d, %v; want 2", n, err)
		}
	})

	// The result cache is per owner: app1's answer for bytes (its red image) is never
	// served to app2, which sends the same bytes under another name and computes its own;
	// each one's stats and purge reach only its own entries.
	t.Run("Cache", func(t *testing.T) {
		// Green bytes, which no job above saw: app2's copy, and app1's under its own name.
		green := colourPNG(t, root, "green")
		b, err := os.ReadFile(green)
		if err != nil {
			t.Fatal(err)
		}
		app1Green := clusterWriteFile(t, filepath.Join(root, app1Mark+"-green.png"), string(b))
		tag := func(c *ortclient.Client, who, path string) *codec.TagReply {
			t.Helper()
			r, err := c.Tag(ctx, codec.Request{Path: path, Model: gwTagger})
			if err != nil {
				t.Fatalf("%s: tag %s: %v", who, path, err)
			}
			checkColourTag(t, r, "green")
			return r
		}
		entries := func(c *ortclient.Client) uint64 {
			t.Helper()
			st, err := c.CacheStats(ctx, "")
			if err != nil || !st.Enabled {
				t.Fatalf("cache.stats: %+v %v", st, err)
			}
			return st.Entries
		}
		// An interactive answer is stored after it is answered: wait for it.
		stored := func(c *ortclient.Client, who string, want uint64) {
			t.Helper()
			checkFor(t, who+"'s entry stored", 2*gwReplyBound, pollEvery, func() error {
				if n := entries(c); n != want {
					return fmt.Errorf("%s sees %d entries, want %d", who, n, want)
				}
				return nil
			})
		}
		n1, n2 := entries(c1), entries(c2)
		if r := tag(c1, "app1", app1Green); r.Timing.Cached {
			t.Fatalf("app1's first request for new bytes: timing %+v, want computed", r.Timing)
		}
		stored(c1, "app1", n1+1)
		if r := tag(c1, "app1", app1Green); !r.Timing.Cached {
			t.Errorf("app1's second request for its image: timing %+v, want cached", r.Timing)
		}
		if r := tag(c2, "app2", green); r.Timing.Cached {
			t.Fatalf("app2 was served from the cache bytes only app1's entry holds: %+v", r.Timing)
		}
		stored(c2, "app2", n2+1)
		if r := tag(c2, "app2", green); !r.Timing.Cached {
			t.Errorf("app2's second request: timing %+v, want cached (its own entry)", r.Timing)
		}
		if st, err := c2.PurgeCache(ctx, ""); err != nil || st.Purged != n2+1 || st.Entries != 0 {
			t.Errorf("app2's purge: %+v %v, want its %d entries purged and none left", st, err, n2+1)
		}
		if r := tag(c1, "app1", app1Green); !r.Timing.Cached {
			t.Errorf("app2's purge removed app1's entry: timing %+v", r.Timing)
		}
		if n := entries(c1); n != n1+1 {
			t.Errorf("app1 sees %d entries after app2's purge, want %d", n, n1+1)
		}
		if n := entries(cops); n != n1+1 {
			t.Errorf("ops sees %d entries, want app1's %d (app2 purged its own)", n, n1+1)
		}
	})

	t.Run("Leases", func(t *testing.T) {
		l, err := c1.AcquireLease(ctx, "cpu", 100<<20, "interactive", "app1", 60000)
		if err != nil || l.Lease == "" {
			t.Fatalf("app1: acquire: %+v, %v", l, err)
		}
		_, err = c2.RenewLease(ctx, l.Lease, 60000)
		wantCode(t, "app2's renew of app1's lease", err, codec.CodeBadRequest)
		_, err = c2.ReleaseLease(ctx, l.Lease)
		wantCode(t, "app2's release of app1's lease", err, codec.CodeBadRequest)
		// Still app1's: it renews it, then releases it.
		if _, err := c1.RenewLease(ctx, l.Lease, 60000); err != nil {
			t.Errorf("app1's renew of its lease after app2's tries: %v", err)
		}
		if r, err := c1.ReleaseLease(ctx, l.Lease); err != nil || !r.Released {
			t.Errorf("app1's release of its lease: %+v, %v", r, err)
		}
		clusterWaitStatus(t, ops.Conn, "no lease left on cpu", func(st *codec.StatusReply) bool {
			for _, d := range st.Devices {
				if d.Device == "cpu" {
					return len(d.Leases) == 0 && d.LeasedBytes == 0
				}
			}
			return false
		})
	})

	t.Run("Gate", func(t *testing.T) {
		// A gated lease's wrapper runs in an application's account: the device's gate
		// reaches it (the ORTBUS account exports ortbus.gate.>).
		sub, err := app1.Conn.SubscribeSync("ortbus.gate.>")
		if err != nil {
			t.Fatal(err)
		}
		defer sub.Unsubscribe()
		l, err := c1.Lease(ctx, &codec.LeaseRequest{Action: codec.LeaseAcquire, Device: "cpu", Bytes: 1 << 20, Class: "batch", Holder: "app1", TTLMS: 60000, Gate: true})
		if err != nil || !l.Gate {
			t.Fatalf("app1: a gated lease: %+v, %v", l, err)
		}
		defer c1.ReleaseLease(ctx, l.Lease)
		m, err := sub.NextMsg(gwReplyBound)
		if err != nil {
			t.Fatalf("app1 hears no gate of its gated lease's device: %v", err)
		}
		var g codec.Gate
		if err := codec.Unmarshal(m.Data, &g); err != nil || g.Device != "cpu" || g.Gateway != l.Gateway {
			t.Errorf("the gate app1 hears: %+v, %v; want cpu's, of gateway %s", g, err, l.Gateway)
		}
	})

	t.Run("Cancel", func(t *testing.T) {
		in := newInboxAt(t, app1.Conn, app1.NewInbox())
		app1Inboxes = append(app1Inboxes, in.prefix)
		post := func(id string) {
			t.Helper()
			b, err := codec.Marshal(&codec.Request{ID: id, Path: app1Red, Model: gwSlow})
			if err != nil {
				t.Fatal(err)
			}
			if err := app1.PublishRequest("ortbus.v1.tag", in.subject(id), b); err != nil {
				t.Fatal(err)
			}
		}
		cancelAs := func(c *clusterConn, id string) codec.CancelReply {
			t.Helper()
			b, err := codec.Marshal(&codec.Cancel{ID: id})
			if err != nil {
				t.Fatal(err)
			}
			m, err := c.Request("ortbus.v1.cancel", b, gwReplyBound)
			if err != nil {
				t.Fatalf("%s: cancel %s: %v", c.User, id, err)
			}
			var cr codec.CancelReply
			if err := ortclient.Decode(m, &cr); err != nil {
				t.Fatalf("%s: cancel %s: %v", c.User, id, err)
			}
			return cr
		}

		// A cancel that comes before its request: app2's cancel of an id app1 is about to
		// use is remembered as app2's, and does not cancel app1's request.
		if cr := cancelAs(app2, "app1-early"); cr.Found {
			t.Errorf("app2's cancel of an unknown id: %+v, want found false", cr)
		}
		post("app1-early")
		if r := gwDecode(t, in.next(t, "the answer to app1-early")); r.code() != "ok" {
			t.Errorf("app1-early, cancelled early by app2: answered %s, want its result", r.code())
		}

		// Slow requests on one slot: the first runs, the others wait in the gateway.
		const n = 8
		ids := make([]string, n)
		for i := range ids {
			ids[i] = fmt.Sprintf("app1-slow-%d", i)
			post(ids[i])
		}
		// All of them admitted: every one is either answered (and read) or queued or
		// running. (Answers are counted before status is asked: a request answered in
		// between is in neither count, so the sum never overstates.)
		got := map[string]gwReply{}
		clusterWaitStatus(t, ops.Conn, "app1's slow requests all admitted", func(st *codec.StatusReply) bool {
			for {
				select {
				case m := <-in.ch:
					got[in.key(m)] = gwDecode(t, m)
					continue
				default:
				}
				break
			}
			for _, c := range st.Classes {
				if c.Name == "interactive" {
					return c.Queued+c.Running+len(got) >= n
				}
			}
			return false
		})
		// Ids are per owner: app2 uses the id of one of app1's requests in flight, and each
		// is answered under its own id (before: bad_request "already in progress").
		dup := ids[n-2]
		b, err := codec.Marshal(&codec.Request{ID: dup, Path: app1Red, Model: gwTagger})
		if err != nil {
			t.Fatal(err)
		}
		m, err := app2.Request("ortbus.v1.tag", b, gwReplyBound)
		if err != nil {
			t.Fatalf("app2's tag with app1's id %s: %v", dup, err)
		}
		if tr := gwDecode(t, m).tag(t); tr.ID != dup {
			t.Errorf("app2's tag with id %s: answered with id %q", dup, tr.ID)
		}
		target := ids[n-1] // the last: queued behind the others
		cr2 := cancelAs(app2, target)
		cr1 := cancelAs(app1, target)
		if cr2.Found {
			t.Errorf("app2's cancel of app1's request %s: %+v, want found false", target, cr2)
		}
		for len(got) < n {
			m := in.next(t, fmt.Sprintf("answer %d of %d", len(got)+1, n))
			got[in.key(m)] = gwDecode(t, m)
		}
		for _, id := range ids[:n-1] {
			if c := got[id].code(); c != "ok" {
				t.Errorf("%s: answered %s, want its result", id, c)
			} else if tr := got[id].tag(t); tr.ID != id {
				t.Errorf("%s: answered with id %q, want its own", id, tr.ID)
			}
		}
		switch c := got[target].code(); {
		case cr2.Found:
			// reported above; its answer is app2's doing
		case cr1.Found && c != string(codec.CodeCancelled):
			t.Errorf("%s, cancelled by app1 (found): answered %s, want cancelled", target, c)
		case !cr1.Found && c != "ok":
			t.Errorf("%s: app1's cancel found nothing, answered %s; want its result", target, c)
		case !cr1.Found:
			// The request was answered before app1's cancel: app2's found nothing, but
			// the check is weaker (this machine served eight slow requests faster than
			// two cancels went round).
			t.Logf("%s was answered before app1's own cancel", target)
		default:
			t.Logf("%s: app2's cancel found nothing, app1's cancelled it", target)
		}
	})

	t.Run("NoRepliesOfOthers", func(t *testing.T) {
		// The marker: app2's own request. Every message the server delivered to app2's
		// spy before the marker's answer came before it on the same connection: had
		// anything of app1's reached APP2, it would be there.
		seen := spy.until(t, app2)
		mine := func(s string) bool {
			for _, p := range app2Inboxes {
				if strings.HasPrefix(s, p+".") {
					return true
				}
			}
			return strings.HasPrefix(s, spy.marker+".")
		}
		for _, m := range seen {
			if strings.HasPrefix(m.Subject, "ortbus.v1.") && mine(m.Reply) {
				continue // app2's own requests (some name app1's job, request ids or files)
			}
			text := m.Subject + " " + m.Reply + " " + string(m.Data) + " " + fmt.Sprint(m.Header)
			leaked := strings.Contains(text, app1Mark)
			for _, p := range app1Inboxes {
				leaked = leaked || strings.Contains(text, p)
			}
			switch {
			case leaked:
				t.Errorf("app2 saw app1's traffic: %s (reply %s): %q", m.Subject, m.Reply, m.Data)
			case mine(m.Subject):
				// answers to app2's own requests
			case strings.HasPrefix(m.Subject, "ortbus.gw.") && strings.HasSuffix(m.Subject, ".hb"):
				// the gateways' beats (stream import)
			case strings.HasPrefix(m.Subject, "ortbus.gate."):
				// the devices' compute gates (stream import): a device's, not an app's (a
				// pressed lease is named by its tag, a hash of its id)
			default:
				t.Errorf("app2 saw a message not its own: %s (reply %s)", m.Subject, m.Reply)
			}
		}
		t.Logf("app2's spy saw %d messages, none of app1's", len(seen))
	})
	for _, c := range []*clusterConn{app1, app2, ops} {
		c.noErrors(t)
	}
}

// wantCode fails t unless err is an error reply with code.
func wantCode(t *testing.T, what string, err error, code codec.Code) {
	t.Helper()
	if got := codec.CodeOf(err); got != code {
		t.Errorf("%s: %v (code %q), want %s", what, err, got, code)
	}
}

// accountsSpy records every message a connection's subscription to ">" receives.
type accountsSpy struct {
	mu     sync.Mutex
	seen   []*nats.Msg
	marker string // the inbox of the marker request
	done   chan struct{}
	once   sync.Once
}

// accountsListen subscribes c to everything of its account.
func accountsListen(t *testing.T, c *clusterConn) *accountsSpy {
	t.Helper()
	s := &accountsSpy{marker: c.NewInbox(), done: make(chan struct{})}
	sub, err := c.Subscribe(">", func(m *nats.Msg) {
		s.mu.Lock()
		s.seen = append(s.seen, m)
		s.mu.Unlock()
		if strings.HasPrefix(m.Subject, s.marker+".") {
			s.once.Do(func() { close(s.done) })
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sub.Unsubscribe() })
	c.noErrors(t) // the subscription is in place and allowed
	return s
}

// until sends the marker (a status request of c answered to the spy's marker inbox) and
// returns what the spy saw up to its answer.
func (s *accountsSpy) until(t *testing.T, c *clusterConn) []*nats.Msg {
	t.Helper()
	if err := c.PublishRequest("ortbus.v1.status", s.marker+".status", []byte{0x80}); err != nil {
		t.Fatal(err)
	}
	select {
	case <-s.done:
	case <-time.After(clusterEventBound):
		t.Fatalf("%s: the spy never saw the answer to the marker", c.User)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.seen)
}

// accountsCheckDeploy validates deploy/accounts: `natsembed -c node.conf -check` on a
// copy (TLS paths pointed at tc's files, the store at a temporary dir) with every
// password variable set, and refused without one; gateway.toml loads, with identity
// "account" and the reply prefix of imported requests.
func accountsCheckDeploy(t *testing.T, tc *clusterTLS) {
	src := accountsDeployDir(t)
	dir := t.TempDir()
	for _, f := range []string{"node.conf", "accounts.conf"} {
		b, err := os.ReadFile(filepath.Join(src, f))
		if err != nil {
			t.Fatal(err)
		}
		s := string(b)
		if f == "node.conf" && (!strings.Contains(s, "/etc/ortbus/tls/") || !strings.Contains(s, "include ./accounts.conf")) {
			t.Fatalf("%s no longer names its TLS files under /etc/ortbus/tls/ or includes ./accounts.conf: update this test", f)
		}
		s = strings.ReplaceAll(s, "/etc/ortbus/tls/", tc.Dir+"/")
		s = strings.ReplaceAll(s, "/var/lib/ortbus/nats", filepath.Join(dir, "js"))
		clusterWriteFile(t, filepath.Join(dir, f), s)
	}
	env := newRoleSecrets(t, accountsRoles).nodeEnvFor(t, accountsRoles)
	check := func(env []string) (int, string) {
		cmd := exec.Command(clusterNatsembed(t), "-c", filepath.Join(dir, "node.conf"), "-check")
		cmd.Env = env
		out, err := cmd.CombinedOutput()
		var ee *exec.ExitError
		if err != nil && !errors.As(err, &ee) {
			t.Fatalf("natsembed -check: %v", err)
		}
		return cmd.ProcessState.ExitCode(), string(out)
	}
	if code, out := check(env); code != 0 || !strings.Contains(out, "configuration is valid") {
		t.Errorf("deploy/accounts/node.conf: natsembed -check exited %d: %s", code, out)
	}
	var without []string
	for _, kv := range env {
		if !strings.HasPrefix(kv, "ORTBUS_NATS_APP2_PASSWORD=") {
			without = append(without, kv)
		}
	}
	if code, out := check(without); code == 0 || !strings.Contains(out, "ORTBUS_NATS_APP2_PASSWORD") {
		t.Errorf("without ORTBUS_NATS_APP2_PASSWORD: -check exited %d: %s; want a refusal naming the variable", code, out)
	}
	c, err := config.Load(filepath.Join(src, "gateway.toml"))
	if err != nil {
		t.Fatalf("deploy/accounts/gateway.toml: %v", err)
	}
	if c.Gateway.Identity != config.IdentityAccount || !slices.Contains(c.NATS.Replies(), "_R_") {
		t.Errorf("deploy/accounts/gateway.toml: identity %q, reply prefixes %v; want account, with _R_",
			c.Gateway.Identity, c.NATS.Replies())
	}
}
