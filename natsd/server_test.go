package natsd

import (
	"context"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// startArgs parses args and starts a server that the test shuts down.
func startArgs(t *testing.T, args ...string) *Server {
	t.Helper()
	opts, err := ParseArgs(args)
	if err != nil {
		t.Fatal(err)
	}
	return startOpts(t, opts)
}

func startOpts(t *testing.T, opts *server.Options) *Server {
	t.Helper()
	s, err := Start(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Shutdown)
	return s
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

// roundTrip serves "echo" on nc and checks one request/reply through it.
func roundTrip(t *testing.T, nc *nats.Conn) {
	t.Helper()
	sub, err := nc.Subscribe("echo", func(m *nats.Msg) { _ = m.Respond(append([]byte("re:"), m.Data...)) })
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	reply, err := nc.Request("echo", []byte("hi"), 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if string(reply.Data) != "re:hi" {
		t.Fatalf("reply = %q, want re:hi", reply.Data)
	}
}

func TestStartRandomPortRequestReply(t *testing.T) {
	s := startArgs(t, "-p", "-1")
	url := s.ClientURL()
	if !strings.HasPrefix(url, "nats://127.0.0.1:") || strings.HasSuffix(url, ":-1") || strings.HasSuffix(url, ":0") {
		t.Fatalf("ClientURL = %q, want nats://127.0.0.1:<bound port>", url)
	}
	if s.ClusterAddr() != "" || s.MonitorAddr() != "" {
		t.Errorf("cluster %q / monitor %q reported without -cluster / -m", s.ClusterAddr(), s.MonitorAddr())
	}
	roundTrip(t, connect(t, url))
}

func TestStartWildcardHostReportsLoopbackURL(t *testing.T) {
	s := startArgs(t, "-a", "0.0.0.0", "-p", "-1", "-m", "-1", "--cluster", "nats://127.0.0.1:-1")
	if url := s.ClientURL(); !strings.HasPrefix(url, "nats://127.0.0.1:") {
		t.Fatalf("ClientURL = %q", url)
	}
	if a := s.ClusterAddr(); !strings.HasPrefix(a, "127.0.0.1:") || strings.HasSuffix(a, ":0") {
		t.Errorf("ClusterAddr = %q, want 127.0.0.1:<bound port>", a)
	}
	if a := s.MonitorAddr(); !strings.HasPrefix(a, "0.0.0.0:") && !strings.HasPrefix(a, "[::]:") {
		t.Errorf("MonitorAddr = %q, want the wildcard host it follows from -a", a)
	}
	roundTrip(t, connect(t, s.ClientURL()))
}

func TestInProcessOnly(t *testing.T) {
	s := startOpts(t, &server.Options{DontListen: true, JetStream: true, StoreDir: t.TempDir()})
	if s.ClientURL() != "" {
		t.Errorf("ClientURL = %q for a DontListen server", s.ClientURL())
	}
	nc, err := s.ConnectInProcess()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	roundTrip(t, nc)
}

func TestStartPortInUse(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	port := ln.Addr().(*net.TCPAddr).Port
	opts, err := ParseArgs([]string{"-p", fmt.Sprint(port)})
	if err != nil {
		t.Fatal(err)
	}
	began := time.Now()
	s, err := Start(opts, WithReadyTimeout(30*time.Second))
	if err == nil {
		s.Shutdown()
		t.Fatal("Start succeeded on a port in use")
	}
	if !strings.Contains(err.Error(), "address already in use") {
		t.Errorf("err = %v, want the listener error", err)
	}
	if d := time.Since(began); d > 5*time.Second {
		t.Errorf("failure took %s: it should not wait for the ready timeout", d)
	}
}

func TestJetStreamSurvivesRestart(t *testing.T) {
	dir := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()

	s1, err := Start(mustParse(t, "-p", "-1", "-js", "-sd", dir))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s1.Shutdown)
	nc1 := connect(t, s1.ClientURL())
	js1, err := jetstream.New(nc1)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := js1.CreateStream(ctx, jetstream.StreamConfig{Name: "WORK", Subjects: []string{"work.>"}, Storage: jetstream.FileStorage}); err != nil {
		t.Fatal(err)
	}
	for i := 1; i <= 3; i++ {
		if _, err := js1.Publish(ctx, "work.item", []byte(fmt.Sprintf("m%d", i))); err != nil {
			t.Fatal(err)
		}
	}
	nc1.Close()
	s1.Shutdown()

	s2 := startOpts(t, mustParse(t, "-p", "-1", "-js", "-sd", dir))
	js2, err := jetstream.New(connect(t, s2.ClientURL()))
	if err != nil {
		t.Fatal(err)
	}
	stream, err := js2.Stream(ctx, "WORK")
	if err != nil {
		t.Fatalf("stream lost across restart: %v", err)
	}
	info, err := stream.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.State.Msgs != 3 {
		t.Fatalf("stream has %d messages after restart, want 3", info.State.Msgs)
	}
	for i := uint64(1); i <= 3; i++ {
		m, err := stream.GetMsg(ctx, i)
		if err != nil {
			t.Fatal(err)
		}
		if want := fmt.Sprintf("m%d", i); string(m.Data) != want {
			t.Errorf("message %d = %q, want %q", i, m.Data, want)
		}
	}
}

func TestShutdownTwice(t *testing.T) {
	s, err := Start(mustParse(t, "-p", "-1"))
	if err != nil {
		t.Fatal(err)
	}
	s.Shutdown()
	s.Shutdown()
	select {
	case <-s.Fatal():
		t.Errorf("Fatal closed by a clean shutdown: %v", s.Err())
	default:
	}
}

func mustParse(t *testing.T, args ...string) *server.Options {
	t.Helper()
	opts, err := ParseArgs(args)
	if err != nil {
		t.Fatal(err)
	}
	return opts
}
