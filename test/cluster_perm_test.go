package test

import (
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"
	"golang.org/x/crypto/bcrypt"

	"github.com/ortbus/ortbus/codec"
	"github.com/ortbus/ortbus/config"
	"github.com/ortbus/ortbus/internal/testkit/testenv"
)

// TestClusterPermissions runs one NATS node (natsembed) on a config of the shape of
// deploy/cluster/nodeN.conf — TLS for clients and routes, JetStream, and
// deploy/cluster/permissions.conf itself — with passwords generated here and given to the
// node through the environment variables that permissions.conf names (some as bcrypt
// hashes), and proves, by what the server does, that each role can do its job and
// nothing else: every refusal is the server's permissions violation, waited for as an
// event, and a forged message's absence is proven by the order of delivery, not by a
// sleep. It also validates the deploy node configs with `natsembed -check` and loads the
// deploy/multi-host ortbus configs.
func TestClusterPermissions(t *testing.T) {
	tc := clusterWriteTLS(t)
	sec := newClusterSecrets(t)
	node := clusterStartNode(t, "perm", clusterWriteNode(t, tc, clusterNodeSpec{Name: "perm", Host: "127.0.0.1", Standalone: true, JetStream: true}), sec.nodeEnv(t))
	if !strings.HasPrefix(node.URL, "tls://127.0.0.1:") {
		t.Fatalf("node URL %q, want tls://127.0.0.1:PORT (the client port requires TLS)", node.URL)
	}
	url := node.URL

	t.Run("Authentication", func(t *testing.T) {
		// Each role logs in with its password (the node holds plaintext for some, bcrypt
		// hashes for others).
		for _, r := range clusterRoles {
			c, err := clusterDial(url, r.User, sec[r.User], tc.CA)
			if err != nil {
				t.Errorf("%s (bcrypt %v) cannot connect: %v", r.User, r.Bcrypt, err)
				continue
			}
			c.Close()
		}
		refused := []struct {
			what, user, pw, ca, want string
		}{
			{"no credentials", "", "", tc.CA, "authorization violation"},
			{"a wrong password", "client", sec["client"] + "x", tc.CA, "authorization violation"},
			{"another role's password", "worker-cuda", sec["gateway"], tc.CA, "authorization violation"},
			{"a bcrypt hash as the password", "gateway", bcryptOf(t, sec["gateway"]), tc.CA, "authorization violation"},
			{"a server certificate of another CA", "client", sec["client"], tc.OtherCA, "certificate signed by unknown authority"},
		}
		for _, c := range refused {
			nc, err := clusterDial(url, c.user, c.pw, c.ca, nats.MaxReconnects(0))
			if err == nil {
				nc.Close()
				t.Errorf("%s: connected, want it refused", c.what)
				continue
			}
			if !strings.Contains(strings.ToLower(err.Error()), c.want) {
				t.Errorf("%s: %v, want an error with %q", c.what, err, c.want)
			}
		}
	})

	client := clusterConnect(t, url, sec, "client", tc.CA)
	gw := clusterConnect(t, url, sec, "gateway", tc.CA)
	wcpu := clusterConnect(t, url, sec, "worker-cpu", tc.CA)
	ops := clusterConnect(t, url, sec, "ops", tc.CA)

	t.Run("ClientRequestsTheAPI", func(t *testing.T) {
		// The gateway's role serves the API as the micro service ortbus does (queue group
		// ortbus-gateway) and answers its requests and micro's $SRV ones.
		svc, err := micro.AddService(gw.Conn, micro.Config{Name: "ortbus", Version: "0.0.1", QueueGroup: "ortbus-gateway"})
		if err != nil {
			t.Fatal(err)
		}
		defer svc.Stop()
		if err := svc.AddGroup("ortbus.v1").AddEndpoint("status", micro.HandlerFunc(func(r micro.Request) {
			r.Respond([]byte("status of the test gateway"))
		})); err != nil {
			t.Fatal(err)
		}
		gw.noErrors(t)
		m, err := client.Request("ortbus.v1.status", []byte{0x80}, clusterEventBound)
		if err != nil {
			t.Fatalf("client: request ortbus.v1.status: %v", err)
		}
		if string(m.Data) != "status of the test gateway" {
			t.Errorf("client: status answer %q", m.Data)
		}
		// The answer came to the client's own inboxes, the only ones it may subscribe to.
		if !strings.HasPrefix(m.Subject, "_INBOX_client.") {
			t.Errorf("client: the answer came on %s, want the client's inbox prefix", m.Subject)
		}
		// The operators' API: ops may use it, the gateways serve it in their queue group.
		opsSub, err := gw.QueueSubscribe("ortbus.ops.>", "ortbus-gateway", func(m *nats.Msg) { m.Respond([]byte("cancelled")) })
		if err != nil {
			t.Fatal(err)
		}
		defer opsSub.Unsubscribe()
		gw.noErrors(t)
		if m, err := ops.Request("ortbus.ops.cancel", []byte(`{"id":"r1"}`), clusterEventBound); err != nil || string(m.Data) != "cancelled" {
			t.Fatalf("ops: request ortbus.ops.cancel: %v %v", m, err)
		} else if !strings.HasPrefix(m.Subject, "_INBOX_ops.") {
			t.Errorf("ops: the answer came on %s, want the ops inbox prefix", m.Subject)
		}
		// An operator discovers the service (nats micro ls / info).
		for _, subj := range []string{"$SRV.PING.ortbus", "$SRV.INFO.ortbus"} {
			m, err := ops.Request(subj, nil, clusterEventBound)
			if err != nil {
				t.Fatalf("ops: request %s: %v", subj, err)
			}
			var info struct {
				Name string `json:"name"`
			}
			if err := json.Unmarshal(m.Data, &info); err != nil || info.Name != "ortbus" {
				t.Errorf("ops: %s answered %q (%v), want the service ortbus", subj, m.Data, err)
			}
		}
		client.noErrors(t)
		ops.noErrors(t)
		gw.noErrors(t)
		// A client cannot use micro discovery.
		if err := client.PublishRequest("$SRV.PING", client.NewRespInbox(), nil); err != nil {
			t.Fatal(err)
		}
		client.violation(t, "Publish", "$SRV.PING")
	})

	t.Run("ClientCannotForge", func(t *testing.T) {
		// A spy with the gateway's credentials hears, on ONE channel (so in the order the
		// server delivered them), every subject a forgery could reach a gateway or worker on.
		// A second spy, with worker-cpu's credentials, hears the subjects only workers may
		// subscribe to (the gateway user has no worker rights), on a channel of its own.
		ch, wch := make(chan *nats.Msg, 64), make(chan *nats.Msg, 64)
		var subs []*nats.Subscription
		for _, s := range []struct {
			c              *clusterConn
			subject, queue string
			ch             chan *nats.Msg
		}{
			{gw, "ortbus.hb.>", "", ch}, {gw, "ortbus.claim.>", "", ch},
			{gw, "ortbus.v1.>", "ortbus-gateway", ch}, {gw, "ortbus.ops.>", "ortbus-gateway", ch},
			{wcpu, "ortbus.cancel", "", wch}, {wcpu, "infer.cpu.*", "ortworker-cpu", wch}, {wcpu, "infer.cpu.*.*", "", wch}, {wcpu, "ortbus.worker.*.drain", "", wch},
		} {
			sub, err := s.c.ChanQueueSubscribe(s.subject, s.queue, s.ch)
			if err != nil {
				t.Fatal(err)
			}
			subs = append(subs, sub)
		}
		defer func() {
			for _, s := range subs {
				s.Unsubscribe()
			}
		}()
		gw.noErrors(t) // the spies' subscriptions are in place and allowed
		wcpu.noErrors(t)

		hb, err := codec.Marshal(&codec.Heartbeat{V: codec.WireVersion, Worker: "w1", Pool: "cpu", State: codec.StateReady, Slots: 8, Classes: []string{"batch"}, SentMS: time.Now().UnixMilli()})
		if err != nil {
			t.Fatal(err)
		}
		forged := []struct{ subject, what string }{
			{"infer.cpu.batch", "a work item straight to pool cpu's workers"},
			{"infer.cpu.batch.cpu-0", "a work item straight to worker cpu-0"},
			{"ortbus.hb.cpu.w1", "a heartbeat of a worker w1 of pool cpu"},
			{"ortbus.claim.app.cpu.w1", "a claim to gateway app"},
			{"ortbus.cancel", "a cancel on the workers' subject"},
			{"ortbus.worker.cpu-0.drain", "a drain of worker cpu-0"},
			{"ortbus.ops.cancel", "a cancel on the operators' subject"},
		}
		for _, f := range forged {
			data := []byte(`{"id":"forged"}`)
			if f.subject == "ortbus.hb.cpu.w1" {
				data = hb
			}
			if err := client.Publish(f.subject, data); err != nil {
				t.Fatal(err)
			}
		}
		// The marker: allowed, and heard by the spy. The server handles one connection's
		// messages in order, and delivers them to one connection in order: had it let any
		// forgery through, the spy would have got it before the marker.
		if err := client.Publish("ortbus.v1.zz-marker", []byte("marker")); err != nil {
			t.Fatal(err)
		}
		select {
		case m := <-ch:
			if m.Subject != "ortbus.v1.zz-marker" {
				t.Fatalf("the spy got %s (%q) before the marker: a client forged it", m.Subject, m.Data)
			}
		case <-time.After(clusterEventBound):
			t.Fatalf("the spy never got the marker")
		}
		// The server had handled every forgery before the marker; the gateway's cancel,
		// sent after the marker arrived, is the worker spy's marker: a forgery that reached
		// it would have come first.
		if err := gw.Publish("ortbus.cancel", []byte("cancel marker")); err != nil {
			t.Fatal(err)
		}
		select {
		case m := <-wch:
			if m.Subject != "ortbus.cancel" || string(m.Data) != "cancel marker" {
				t.Fatalf("the worker spy got %s (%q) before the gateway's cancel: a client forged it", m.Subject, m.Data)
			}
		case <-time.After(clusterEventBound):
			t.Fatalf("the worker spy never got the gateway's cancel")
		}
		for _, f := range forged {
			err := client.violation(t, "Publish", f.subject)
			t.Logf("client refused %s: %v", f.what, err)
		}
		// Nor may it listen to anything but its inboxes.
		for _, s := range []string{"ortbus.hb.>", "infer.>", "ortbus.v1.>", "ortbus.ops.>"} {
			if _, err := client.SubscribeSync(s); err != nil {
				t.Fatal(err)
			}
			client.violation(t, "Subscription", s)
		}
		client.noErrors(t)
	})

	t.Run("GatewayBeats", func(t *testing.T) {
		// Failover: the gateways beat, and clients (and gateways) hear the beats; no one
		// else may beat for a gateway.
		beats, err := client.SubscribeSync("ortbus.gw.*.hb")
		if err != nil {
			t.Fatal(err)
		}
		defer beats.Unsubscribe()
		client.noErrors(t)
		for _, c := range []*clusterConn{client, wcpu} {
			if err := c.Publish("ortbus.gw.app.hb", []byte("forged")); err != nil {
				t.Fatal(err)
			}
			c.violation(t, "Publish", "ortbus.gw.app.hb")
		}
		if err := gw.Publish("ortbus.gw.app.hb", []byte("beat")); err != nil {
			t.Fatal(err)
		}
		gw.noErrors(t)
		// The gateway's beat is the first the client hears: no forgery came before it.
		m, err := beats.NextMsg(clusterEventBound)
		if err != nil || string(m.Data) != "beat" {
			t.Fatalf("client heard %v, %v; want the gateway's beat", m, err)
		}
	})

	t.Run("Worker", func(t *testing.T) {
		// A worker of pool cpu takes its pool's work in its queue group and answers it —
		// once: the server refuses a second answer to the same request.
		replied := make(chan string, 1)
		sub, err := wcpu.QueueSubscribe("infer.cpu.*", "ortworker-cpu", func(m *nats.Msg) {
			m.Respond([]byte("result"))
			m.Respond([]byte("a second answer"))
			replied <- m.Reply
		})
		if err != nil {
			t.Fatal(err)
		}
		defer sub.Unsubscribe()
		hbs, err := gw.SubscribeSync("ortbus.hb.cpu.*")
		if err != nil {
			t.Fatal(err)
		}
		defer hbs.Unsubscribe()
		wcpu.noErrors(t)
		gw.noErrors(t)
		m, err := gw.Request("infer.cpu.batch", []byte("item"), clusterEventBound)
		if err != nil {
			t.Fatalf("gateway: request to the cpu worker: %v", err)
		}
		if string(m.Data) != "result" {
			t.Errorf("gateway got %q, want the worker's first answer", m.Data)
		}
		wcpu.violation(t, "Publish", <-replied)

		// Its heartbeats and claims (ortbus.claim.<gateway>.<pool>.<worker>) reach the
		// gateway, the gateway's cancels reach it.
		cls, err := gw.SubscribeSync("ortbus.claim.app.>")
		if err != nil {
			t.Fatal(err)
		}
		defer cls.Unsubscribe()
		cancels, err := wcpu.SubscribeSync("ortbus.cancel")
		if err != nil {
			t.Fatal(err)
		}
		defer cancels.Unsubscribe()
		gw.noErrors(t)
		wcpu.noErrors(t)
		for _, p := range []struct {
			from         *clusterConn
			subject, msg string
			to           *nats.Subscription
		}{
			{wcpu, "ortbus.hb.cpu.cpu-remote1", "beat", hbs},
			{wcpu, "ortbus.claim.app.cpu.cpu-remote1", "claim", cls},
			{gw, "ortbus.cancel", "cancel", cancels},
		} {
			if err := p.from.Publish(p.subject, []byte(p.msg)); err != nil {
				t.Fatal(err)
			}
			if m, err := p.to.NextMsg(clusterEventBound); err != nil || string(m.Data) != p.msg {
				t.Fatalf("%s on %s: got %v %v", p.from.User, p.subject, m, err)
			}
		}
		// It cannot publish another pool's heartbeats, claim in another pool's name (nor in
		// none), send work or use either API.
		for _, s := range []string{"ortbus.hb.cuda.w1", "ortbus.claim.app.cuda.w1", "ortbus.claim.app", "infer.cpu.batch", "ortbus.v1.status", "ortbus.ops.cancel"} {
			if err := wcpu.Publish(s, []byte("x")); err != nil {
				t.Fatal(err)
			}
			wcpu.violation(t, "Publish", s)
		}
		// It cannot take another pool's work, nor its own pool's queue items outside the
		// queue group (listening beside the queue would see every item of the pool), nor
		// another pool's items sent to one worker.
		for _, s := range []struct{ subject, queue string }{{"infer.cuda.>", ""}, {"infer.cuda.batch", "ortworker-cuda"}, {"infer.cpu.batch", ""}, {"infer.cpu.batch", "other"},
			{"infer.cuda.batch.cuda-w1", ""}, {"infer.cpu.>", ""}} {
			if _, err := wcpu.QueueSubscribeSync(s.subject, s.queue); err != nil {
				t.Fatal(err)
			}
			wcpu.violation(t, "Subscription", s.subject)
		}
		wcpu.noErrors(t)
	})

	t.Run("GatewayHasNoWorkerRights", func(t *testing.T) {
		// The gateway user holds no worker rights, not even of its local pool cpu (whose
		// workers log in as worker-cpu): it cannot take any pool's work, hear cancels or
		// control verbs, nor forge a heartbeat or a claim.
		for _, s := range []struct{ subject, queue string }{
			{"infer.cpu.*", "ortworker-cpu"}, {"infer.cuda.batch", "ortworker-cuda"},
			{"ortbus.cancel", ""}, {"ortbus.worker.*.drain", ""},
		} {
			if _, err := gw.QueueSubscribeSync(s.subject, s.queue); err != nil {
				t.Fatal(err)
			}
			gw.violation(t, "Subscription", s.subject)
		}
		for _, s := range []string{"ortbus.hb.cpu.cpu-0", "ortbus.hb.cuda.w1", "ortbus.claim.app.cpu.cpu-0"} {
			if err := gw.Publish(s, []byte("x")); err != nil {
				t.Fatal(err)
			}
			gw.violation(t, "Publish", s)
		}
		gw.noErrors(t)
	})

	t.Run("Inboxes", func(t *testing.T) {
		// Each role that makes requests may subscribe to its own inbox prefix only, so no
		// user reads another's replies; nats.go's default _INBOX is open to nobody.
		for _, c := range []struct {
			conn    *clusterConn
			allowed string
			refused []string
		}{
			{client, "_INBOX_client.>", []string{"_INBOX.>", "_INBOX_ops.>", "_INBOX_gateway.>"}},
			{ops, "_INBOX_ops.>", []string{"_INBOX.>", "_INBOX_client.>"}},
			{gw, "_INBOX_gateway.>", []string{"_INBOX.>", "_INBOX_client.>"}},
			{wcpu, "", []string{"_INBOX.>", "_INBOX_gateway.>"}},
		} {
			for _, s := range c.refused {
				if _, err := c.conn.SubscribeSync(s); err != nil {
					t.Fatal(err)
				}
				c.conn.violation(t, "Subscription", s)
			}
			if c.allowed != "" {
				sub, err := c.conn.SubscribeSync(c.allowed)
				if err != nil {
					t.Fatal(err)
				}
				c.conn.noErrors(t)
				sub.Unsubscribe()
			}
			c.conn.noErrors(t)
		}
	})

	t.Run("DeployNodeConfigsCheck", func(t *testing.T) { clusterCheckDeployNodes(t, tc) })

	t.Run("DeployOrtbusConfigs", func(t *testing.T) {
		files, err := filepath.Glob(filepath.Join(testenv.RepoRoot(t), "deploy", "multi-host", "*.toml"))
		if err != nil || len(files) < 2 {
			t.Fatalf("deploy/multi-host configs: %v %v", files, err)
		}
		for _, f := range files {
			c, err := config.Load(f)
			if err != nil {
				t.Errorf("%v", err)
				continue
			}
			for _, name := range c.PoolNames() {
				if p := c.Pools[name]; !p.IsLocal() && len(p.PathMap) == 0 {
					t.Errorf("%s: remote pool %s has no path_map", f, name)
				}
			}
		}
	})
}

// clusterCheckDeployNodes runs `natsembed -c nodeN.conf -check` on copies of
// deploy/cluster (its TLS paths pointed at tc's files, which -check opens, and its store
// dir at a temporary one) with every password variable set: each node config is valid.
// Without one of the variables, or with a TLS file missing, -check refuses the config and
// names what is missing.
func clusterCheckDeployNodes(t *testing.T, tc *clusterTLS) {
	src := clusterDeployDir(t)
	copyDeploy := func(tlsDir string) string {
		dir := t.TempDir()
		for _, f := range []string{"node1.conf", "node2.conf", "node3.conf", "permissions.conf"} {
			b, err := os.ReadFile(filepath.Join(src, f))
			if err != nil {
				t.Fatal(err)
			}
			s := string(b)
			if strings.HasPrefix(f, "node") && (!strings.Contains(s, "/etc/ortbus/tls/") || !strings.Contains(s, "include ./permissions.conf")) {
				t.Fatalf("%s no longer names its TLS files under /etc/ortbus/tls/ or includes ./permissions.conf: update this test", f)
			}
			s = strings.ReplaceAll(s, "/etc/ortbus/tls/", tlsDir+"/")
			s = strings.ReplaceAll(s, "/var/lib/ortbus/nats", filepath.Join(dir, "js"))
			if err := os.WriteFile(filepath.Join(dir, f), []byte(s), 0o600); err != nil {
				t.Fatal(err)
			}
		}
		return dir
	}
	env := newClusterSecrets(t).nodeEnv(t)
	check := func(conf string, env []string) (int, string) {
		cmd := exec.Command(clusterNatsembed(t), "-c", conf, "-check")
		cmd.Env = env
		out, err := cmd.CombinedOutput()
		var ee *exec.ExitError
		if err != nil && !errors.As(err, &ee) {
			t.Fatalf("natsembed -check: %v", err)
		}
		return cmd.ProcessState.ExitCode(), string(out)
	}
	dir := copyDeploy(tc.Dir)
	for _, n := range []string{"node1.conf", "node2.conf", "node3.conf"} {
		if code, out := check(filepath.Join(dir, n), env); code != 0 || !strings.Contains(out, "configuration is valid") {
			t.Errorf("deploy/cluster/%s: natsembed -check exited %d: %s", n, code, out)
		}
	}
	var without []string
	for _, kv := range env {
		if !strings.HasPrefix(kv, "ORTBUS_NATS_OPS_PASSWORD=") {
			without = append(without, kv)
		}
	}
	if code, out := check(filepath.Join(dir, "node1.conf"), without); code == 0 || !strings.Contains(out, "ORTBUS_NATS_OPS_PASSWORD") {
		t.Errorf("without ORTBUS_NATS_OPS_PASSWORD: -check exited %d: %s; want a refusal naming the variable", code, out)
	}
	missing := filepath.Join(t.TempDir(), "no-tls-here")
	if code, out := check(filepath.Join(copyDeploy(missing), "node1.conf"), env); code == 0 || !strings.Contains(out, missing) {
		t.Errorf("without the TLS files: -check exited %d: %s; want a refusal naming the file", code, out)
	}
}

// bcryptOf is a bcrypt hash of pw.
func bcryptOf(t testing.TB, pw string) string {
	h, err := bcrypt.GenerateFromPassword([]byte(pw), bcrypt.MinCost)
	if err != nil {
		t.Fatal(err)
	}
	return string(h)
}
