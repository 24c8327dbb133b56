package natsd

import (
	"errors"
	"fmt"
	"sync"

	"github.com/nats-io/nats-server/v2/server"
)

// guardLogger sits between nats-server and the real logger (nil = quiet). nats-server
// reports unrecoverable errors (a port in use, a JetStream store it cannot open) through
// Logger.Fatalf, whose standard implementation exits the process; here Fatalf logs the
// message as an error and records the first one, which Start returns and Server.Fatal
// announces.
type guardLogger struct {
	inner server.Logger

	once  sync.Once
	fatal chan struct{} // closed by the first Fatalf
	err   error         // set before fatal is closed
}

func newGuardLogger(inner server.Logger) *guardLogger {
	return &guardLogger{inner: inner, fatal: make(chan struct{})}
}

func (g *guardLogger) Fatalf(format string, v ...any) {
	msg := fmt.Sprintf(format, v...)
	if g.inner != nil {
		g.inner.Errorf("fatal: %s", msg)
	}
	g.once.Do(func() {
		g.err = errors.New(msg)
		close(g.fatal)
	})
}

// failure returns the recorded fatal error, or nil if there is none yet.
func (g *guardLogger) failure() error {
	select {
	case <-g.fatal:
		return g.err
	default:
		return nil
	}
}

func (g *guardLogger) Noticef(format string, v ...any) {
	if g.inner != nil {
		g.inner.Noticef(format, v...)
	}
}

func (g *guardLogger) Warnf(format string, v ...any) {
	if g.inner != nil {
		g.inner.Warnf(format, v...)
	}
}

func (g *guardLogger) Errorf(format string, v ...any) {
	if g.inner != nil {
		g.inner.Errorf(format, v...)
	}
}

func (g *guardLogger) Debugf(format string, v ...any) {
	if g.inner != nil {
		g.inner.Debugf(format, v...)
	}
}

func (g *guardLogger) Tracef(format string, v ...any) {
	if g.inner != nil {
		g.inner.Tracef(format, v...)
	}
}
