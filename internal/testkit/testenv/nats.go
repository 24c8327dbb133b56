package testenv

import (
	"testing"

	"github.com/nats-io/nats.go"

	"github.com/ortbus/ortbus/natsd"
)

// InProcessNATS starts an embedded NATS server with no listener (in-process connections
// only) and returns a connection to it; both are stopped when t ends. It is for unit
// tests that drive a handler in process.
func InProcessNATS(t testing.TB) *nats.Conn {
	t.Helper()
	return inProcess(t, "-p", "-1")
}

// InProcessJetStream is InProcessNATS with JetStream on, its store in a directory of t's.
func InProcessJetStream(t testing.TB) *nats.Conn {
	t.Helper()
	return inProcess(t, "-p", "-1", "-js", "-sd", t.TempDir())
}

func inProcess(t testing.TB, args ...string) *nats.Conn {
	t.Helper()
	opts, err := natsd.ParseArgs(args)
	if err != nil {
		t.Fatal(err)
	}
	opts.DontListen = true
	srv, err := natsd.Start(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Shutdown)
	nc, err := srv.ConnectInProcess()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	return nc
}
