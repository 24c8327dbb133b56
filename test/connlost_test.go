package test

import (
	"context"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/ortbus/ortbus/codec"
	"github.com/ortbus/ortbus/config"
	"github.com/ortbus/ortbus/internal/testkit/testenv"
	"github.com/ortbus/ortbus/models/onnxgen"
	"github.com/ortbus/ortbus/natsd"
)

// TestNATSConnectionClosedExits: a gateway (with one supervised worker) and a worker of
// a remote pool log in to a NATS server with a password from a file; the server is
// restarted with the password changed, as when it is rotated. Reconnecting, each gets an
// authorization error twice and nats.go closes its connection for good. None of them may
// then stay up answering nothing: the remote worker exits 4, the gateway stops its
// supervised worker and exits 1, so that their supervisors restart them (and they read
// the password again).
func TestNATSConnectionClosedExits(t *testing.T) {
	t.Parallel()
	host, portText, err := net.SplitHostPort(freeAddr(t)) // one address across the restart
	if err != nil {
		t.Fatal(err)
	}
	port, _ := strconv.Atoi(portText)
	startNATS := func(password string) *natsd.Server {
		srv, err := natsd.Start(&server.Options{Host: host, Port: port, Username: "ortbus", Password: password})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(srv.Shutdown)
		return srv
	}
	srv := startNATS("before-rotation")
	pwFile := filepath.Join(t.TempDir(), "nats-password")
	if err := os.WriteFile(pwFile, []byte("before-rotation\n"), 0o600); err != nil {
		t.Fatal(err)
	}

	root := imageRoot(t)
	remote := false
	rt := testenv.RuntimeLib(t, testenv.Versions[0])
	c := &config.Config{
		NATS:     config.NATS{URL: srv.ClientURL(), User: "ortbus", PasswordFile: pwFile},
		Gateway:  config.Gateway{ShutdownGrace: config.Duration(3 * time.Second)},
		Health:   config.Health{HeartbeatInterval: config.Duration(gwHeartbeat), MissCount: gwMissCount},
		Security: config.Security{AllowedRoots: []string{root}},
		Pools: map[string]*config.Pool{
			"sup": {Runtime: rt, Threads: 1, Workers: 1, Slots: 1, Classes: []string{"interactive"}, Models: []string{gwTagger}},
			"ext": {Runtime: rt, Threads: 1, Slots: 1, Local: &remote, Classes: []string{"batch"}, Models: []string{gwTagger}},
		},
		Models: map[string]*config.Model{gwTagger: {Kind: config.KindTaggerPixAI, Dir: filepath.Join(testenv.Models(t), onnxgen.TaggerDir)}},
	}
	c.SetOrder("pools", "sup", "ext")
	cfgPath := writeConfigFile(t, filepath.Join(t.TempDir(), "gateway.toml"), c)

	w := launch(t, cfgPath, "ext")
	w.ready(t)
	g := launchGateway(t, cfgPath, false)
	api := &httpClient{addr: g.Ready.HTTP}
	checkFor(t, "both pools live in /v1/status", gwReplyBound, pollEvery, func() error {
		r := api.send(context.Background(), http.MethodGet, "/v1/status", "")
		if r.err != nil {
			return r.err
		}
		var st codec.StatusReply
		if err := codec.Decode(r.body, &st, true); err != nil {
			return err
		}
		if len(gwLive(&st, "sup")) != 1 || len(gwLive(&st, "ext")) != 1 {
			return lastStatus{&st}
		}
		return nil
	})
	if r := api.send(context.Background(), http.MethodGet, "/readyz", ""); r.err != nil || r.status != http.StatusOK {
		t.Fatalf("GET /readyz before the rotation: %d %s %v", r.status, r.body, r.err)
	}
	supervised := gwChildPIDs(t, g.lp.PID())
	if len(supervised) == 0 {
		t.Fatal("the gateway supervises no worker process")
	}

	srv.Shutdown()
	startNATS("after-rotation")

	if st := w.wait(t); st.ExitCode() != 4 {
		t.Errorf("remote worker: %v, want exit status 4 (connection closed for good); stderr:\n%s", st, w.lp.Log())
	}
	st, err := g.lp.Wait(exitBound)
	if err != nil {
		t.Fatalf("gateway: %v; log:\n%s", err, g.log())
	}
	if st.ExitCode() != 1 {
		t.Errorf("gateway: %v, want exit status 1; log:\n%s", st, g.log())
	}
	for _, who := range []struct{ name, log string }{{"gateway", g.log()}, {"remote worker", w.lp.Log()}} {
		if !strings.Contains(who.log, "NATS connection closed for good") || !strings.Contains(strings.ToLower(who.log), "authorization violation") {
			t.Errorf("%s: the log does not say that the connection was closed, and why:\n%s", who.name, who.log)
		}
	}
	for _, pid := range supervised {
		if !gwProcessGone(pid) {
			t.Errorf("supervised worker %d outlives its gateway", pid)
		}
	}
	if r := api.send(context.Background(), http.MethodGet, "/readyz", ""); r.err == nil && r.status == http.StatusOK {
		t.Errorf("GET /readyz after the loss: %d %s, want no ready answer", r.status, r.body)
	}
}
