package gateway

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/ortbus/ortbus/config"
	"github.com/ortbus/ortbus/natsconn"
	"github.com/ortbus/ortbus/natsd"
)

// lostBound only bounds a failure: a passing run never waits it out.
const lostBound = 30 * time.Second

// passwordServer starts a NATS server on 127.0.0.1:port (0: any) whose one user is
// ortbus with password pass.
func passwordServer(t *testing.T, port int, pass string) *natsd.Server {
	t.Helper()
	if port == 0 {
		port = server.RANDOM_PORT
	}
	srv, err := natsd.Start(&server.Options{Host: "127.0.0.1", Port: port, Username: "ortbus", Password: pass})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Shutdown)
	return srv
}

// TestRunStopsWhenNATSConnectionClosed: a password changed under a running gateway (its
// server restarted with another one) makes nats.go close the connection for good after
// two authorization errors; Run then shuts down and returns that error instead of serving
// nothing for ever.
func TestRunStopsWhenNATSConnectionClosed(t *testing.T) {
	srv := passwordServer(t, 0, "first")
	pw := filepath.Join(t.TempDir(), "pw")
	if err := os.WriteFile(pw, []byte("first\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	c, err := config.Parse(fmt.Appendf(nil, "[nats]\nurl = %q\nuser = \"ortbus\"\npassword_file = %q\n[gateway]\nshutdown_grace = \"30s\"\n", srv.ClientURL(), pw), "gw.toml")
	if err != nil {
		t.Fatal(err)
	}
	ready := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		done <- Run(context.Background(), Options{Config: c, HTTPListen: "-", Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
			OnReady: func(Ready) { close(ready) }})
	}()
	select {
	case <-ready:
	case err := <-done:
		t.Fatalf("Run returned before ready: %v", err)
	case <-time.After(lostBound):
		t.Fatal("the gateway was not ready")
	}

	_, port, _ := net.SplitHostPort(srv.ClientURL()[len("nats://"):])
	p, _ := strconv.Atoi(port)
	srv.Shutdown()
	passwordServer(t, p, "second")

	// Within the bound, though the shutdown grace is as long: nothing is waited for once
	// the connection is gone.
	select {
	case err := <-done:
		if !errors.Is(err, nats.ErrAuthorization) {
			t.Fatalf("Run returned %v, want the authorization error that closed the connection", err)
		}
	case <-time.After(lostBound):
		t.Fatal("Run still runs on a connection closed for good")
	}
}

// TestConnectLossOrOwnClose: the gateway's connection (here the embedded server's
// in-process one) has natsconn's reconnect settings; a close that is not closeNATS's is a
// loss, closeNATS's own is not.
func TestConnectLossOrOwnClose(t *testing.T) {
	c, err := config.Parse([]byte("[nats]\nembedded = true\nlisten = \"127.0.0.1:0\"\n"), "gw.toml")
	if err != nil {
		t.Fatal(err)
	}
	newGW := func() *Gateway {
		g := &Gateway{id: "gw-unit", log: slog.New(slog.NewTextHandler(io.Discard, nil)), connLost: make(chan struct{})}
		if _, err := g.connect(c, ""); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(g.closeNATS)
		return g
	}

	g := newGW()
	o := g.nc.Opts
	if o.MaxReconnect != -1 || o.ReconnectWait != natsconn.ReconnectWait || o.ReconnectJitter != natsconn.ReconnectJitter ||
		o.ReconnectJitterTLS != natsconn.ReconnectJitterTLS || o.ReconnectBufSize != natsconn.ReconnectBufSize {
		t.Errorf("in-process connection: max reconnects %d, wait %v, jitter %v/%v, buffer %d; want natsconn.Reconnect's",
			o.MaxReconnect, o.ReconnectWait, o.ReconnectJitter, o.ReconnectJitterTLS, o.ReconnectBufSize)
	}
	g.nc.Close()
	select {
	case <-g.connLost:
		if !errors.Is(g.connLostErr, nats.ErrConnectionClosed) {
			t.Errorf("loss error %v", g.connLostErr)
		}
	case <-time.After(lostBound):
		t.Fatal("a close that was not the gateway's own was not taken for a loss")
	}

	// closeNATS's own close: nats.go calls the handler after it, on its callback goroutine,
	// at a time no test can wait for; called here as that callback would be.
	own := newGW()
	own.closeNATS()
	own.onClosed(own.nc)
	if own.connIsLost() {
		t.Fatal("closeNATS's own close was taken for a loss")
	}
}
