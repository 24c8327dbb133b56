package main

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/ortbus/ortbus/codec"
	"github.com/ortbus/ortbus/internal/launch"
)

// binary is the natsembed executable built once by TestMain for every test.
var binary string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "natsembed-test")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	binary = filepath.Join(dir, "natsembed")
	out, err := exec.Command("go", "build", "-o", binary, ".").CombinedOutput()
	if err != nil {
		fmt.Fprintf(os.Stderr, "go build: %v\n%s", err, out)
		_ = os.RemoveAll(dir)
		os.Exit(1)
	}
	code := m.Run()
	_ = os.RemoveAll(dir)
	os.Exit(code)
}

// proc is one natsembed process started by a test.
type proc struct {
	lp    *launch.Proc
	ready codec.Event
}

// start runs natsembed with args, waits for its ready line, and kills it at cleanup if the
// test has not stopped it.
func start(t *testing.T, args ...string) *proc {
	t.Helper()
	lp, err := launch.Start(binary, args, launch.Options{Name: "natsembed " + strings.Join(args, " ")})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		lp.Kill()
		if t.Failed() {
			t.Logf("natsembed %s stderr:\n%s", strings.Join(args, " "), lp.Log())
		}
	})
	ev, err := lp.Ready(context.Background(), 15*time.Second)
	if err != nil {
		t.Fatalf("%v\n%s", err, lp.Log())
	}
	return &proc{lp: lp, ready: ev}
}

// stop sends sig and returns the exit code.
func (p *proc) stop(t *testing.T, sig syscall.Signal) int {
	t.Helper()
	if err := p.lp.Signal(sig); err != nil {
		t.Fatal(err)
	}
	st, err := p.lp.Wait(10 * time.Second)
	if err != nil {
		t.Fatal(err)
	}
	return st.ExitCode()
}

func connect(t *testing.T, url string) *nats.Conn {
	t.Helper()
	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatalf("connect %s: %v", url, err)
	}
	t.Cleanup(nc.Close)
	return nc
}

// awaitDelivery publishes on pub until sub receives a message, bounded by a deadline:
// routes and the subscription's interest reach other nodes asynchronously, and the
// delivery itself is the event that says they have.
func awaitDelivery(t *testing.T, pub *nats.Conn, sub *nats.Conn, subject string) {
	t.Helper()
	got := make(chan *nats.Msg, 64)
	s, err := sub.ChanSubscribe(subject, got)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = s.Unsubscribe() }()
	if err := sub.Flush(); err != nil {
		t.Fatal(err)
	}
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	deadline := time.After(15 * time.Second)
	for {
		if err := pub.Publish(subject, []byte("hello")); err != nil {
			t.Fatal(err)
		}
		select {
		case m := <-got:
			if string(m.Data) != "hello" {
				t.Fatalf("got %q", m.Data)
			}
			return
		case <-tick.C:
		case <-deadline:
			t.Fatalf("no message on %s across the cluster", subject)
		}
	}
}

func TestClusterOfThree(t *testing.T) {
	common := []string{"-p", "-1", "--cluster", "nats://127.0.0.1:-1", "--cluster_name", "t"}
	n1 := start(t, append([]string{"-n", "n1", "-m", "-1"}, common...)...)
	if !strings.HasPrefix(n1.ready.NATSURL, "nats://127.0.0.1:") || !strings.HasPrefix(n1.ready.Cluster, "127.0.0.1:") || !strings.HasPrefix(n1.ready.Monitor, "127.0.0.1:") {
		t.Fatalf("ready line %+v: want loopback nats_url, cluster and monitor", n1.ready)
	}
	routes := "nats://" + n1.ready.Cluster
	n2 := start(t, append([]string{"-n", "n2", "--routes", routes}, common...)...)
	n3 := start(t, append([]string{"-n", "n3", "--routes", routes}, common...)...)
	if n2.ready.Monitor != "" {
		t.Errorf("monitor %q reported without -m", n2.ready.Monitor)
	}

	resp, err := http.Get("http://" + n1.ready.Monitor + "/healthz")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Errorf("/healthz on the monitor port: %s", resp.Status)
	}

	c1, c2, c3 := connect(t, n1.ready.NATSURL), connect(t, n2.ready.NATSURL), connect(t, n3.ready.NATSURL)
	awaitDelivery(t, c1, c3, "ortbus.test.n1-to-n3")
	// n2 and n3 were only told about n1: this delivery needs the full mesh they learn by gossip.
	awaitDelivery(t, c2, c3, "ortbus.test.n2-to-n3")
}

func TestSignalsExitZero(t *testing.T) {
	for _, sig := range []syscall.Signal{syscall.SIGTERM, syscall.SIGINT} {
		p := start(t, "-p", "-1", "-js", "-sd", t.TempDir())
		connect(t, p.ready.NATSURL)
		if code := p.stop(t, sig); code != 0 {
			t.Errorf("%v: exit code %d, want 0\n%s", sig, code, p.lp.Log())
		}
	}
}

func TestCheckConfigFile(t *testing.T) {
	dir := t.TempDir()
	write := func(name, content string) string {
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		return path
	}
	valid := write("valid.conf", fmt.Sprintf(`
server_name: n1
listen: 127.0.0.1:4222
http: 127.0.0.1:8222
jetstream { store_dir: %q }
cluster {
  name: ortbus
  listen: 127.0.0.1:6222
  routes: [ nats://10.0.0.2:6222 ]
}
`, filepath.Join(dir, "js")))
	cases := []struct {
		name string
		args []string
		ok   bool
		want string // in stderr
	}{
		{"valid", []string{"-c", valid, "-check"}, true, "valid"},
		{"valid with nats-server -t", []string{"-t", "-c", valid}, true, "valid"},
		{"syntax error", []string{"-check", "-c", write("syntax.conf", "listen: [\n")}, false, "syntax.conf"},
		{"bad value", []string{"-check", "-c", write("value.conf", "port: \"many\"\n")}, false, "value.conf"},
		{"invalid cluster", []string{"-check", "-c", write("cluster.conf", "cluster { name: \"two words\", port: 6222 }\n")}, false, "cluster name"},
		{"missing file", []string{"-check", "-c", filepath.Join(dir, "nope.conf")}, false, "nope.conf"},
		{"bad flag", []string{"-check", "-bogus"}, false, "-bogus"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var stderr bytes.Buffer
			cmd := exec.Command(binary, c.args...)
			cmd.Stderr = &stderr
			err := cmd.Run()
			if c.ok && err != nil {
				t.Fatalf("rejected: %v\n%s", err, stderr.String())
			}
			if !c.ok && err == nil {
				t.Fatalf("accepted\n%s", stderr.String())
			}
			if !strings.Contains(stderr.String(), c.want) {
				t.Errorf("stderr %q does not mention %q", stderr.String(), c.want)
			}
			if _, statErr := os.Stat(filepath.Join(dir, "js")); statErr == nil {
				t.Error("-check created the JetStream store dir")
			}
		})
	}
}
