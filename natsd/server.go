package natsd

import (
	"fmt"
	"net"
	"strconv"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
)

// DefaultReadyTimeout bounds how long Start waits for the listeners to be up.
const DefaultReadyTimeout = 10 * time.Second

// Option changes how Start runs the server.
type Option func(*config)

type config struct {
	serverLogging bool
	readyTimeout  time.Duration
}

// WithServerLogging logs the way nats-server does, as configured by the options: to
// stderr, or to the -l file, or to syslog, with -D/-V/-T honoured. Without it the server
// is quiet.
func WithServerLogging() Option {
	return func(c *config) { c.serverLogging = true }
}

// WithReadyTimeout bounds the wait for the listeners (DefaultReadyTimeout otherwise).
func WithReadyTimeout(d time.Duration) Option {
	return func(c *config) { c.readyTimeout = d }
}

// Server is a running embedded NATS server.
type Server struct {
	ns   *server.Server
	opts *server.Options
	log  *guardLogger
}

// Start creates and starts a NATS server with opts and waits until it accepts connections.
// Hosts left empty bind loopback (see the package doc); opts.NoSigs is forced on, because
// signals belong to the embedding program; port -1 (server.RANDOM_PORT) picks a free port,
// read it back with ClientURL / ClusterAddr / MonitorAddr. With opts.DontListen the server
// has no client listener and is reached with ConnectInProcess. Start takes ownership of opts
// and fills in nats-server's defaults. On any failure the server is shut down and the error
// says why (the listener error, the JetStream error, or the timeout).
func Start(opts *server.Options, options ...Option) (*Server, error) {
	cfg := config{readyTimeout: DefaultReadyTimeout}
	for _, o := range options {
		o(&cfg)
	}
	if opts == nil {
		opts = &server.Options{}
	}
	applyLoopbackDefaults(opts)
	opts.NoSigs = true

	ns, err := server.NewServer(opts)
	if err != nil {
		return nil, fmt.Errorf("natsd: configuring server: %w", err)
	}
	var inner server.Logger // nil: quiet
	if cfg.serverLogging {
		ns.ConfigureLogger()
		inner = ns.Logger()
	}
	guard := newGuardLogger(inner)
	verbose := inner != nil
	ns.SetLoggerV2(guard, verbose && opts.Debug, verbose && opts.Trace, verbose && opts.TraceVerbose)

	s := &Server{ns: ns, opts: opts, log: guard}
	ns.Start()
	if err := s.waitReady(cfg.readyTimeout); err != nil {
		s.Shutdown()
		return nil, err
	}
	return s, nil
}

// waitReady waits for the listeners in short steps so that a fatal error reported while
// starting (a route port in use, say) ends the wait at once instead of at the timeout.
func (s *Server) waitReady(timeout time.Duration) error {
	const step = 50 * time.Millisecond // nats-server polls every 25ms within a step
	deadline := time.Now().Add(timeout)
	for {
		if err := s.log.failure(); err != nil {
			return fmt.Errorf("natsd: server failed to start: %w", err)
		}
		if s.ns.ReadyForConnections(step) {
			if err := s.log.failure(); err != nil {
				return fmt.Errorf("natsd: server failed to start: %w", err)
			}
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("natsd: server not ready for connections within %s", timeout)
		}
	}
}

// NATS returns the underlying nats-server, for what this package does not wrap
// (monitoring structs, JetStream state, account setup).
func (s *Server) NATS() *server.Server { return s.ns }

// ClientURL is the URL a client on this machine connects to, e.g. nats://127.0.0.1:4222,
// with the port actually bound. A wildcard listen address (-a 0.0.0.0, -a ::) is reported
// as the loopback address of the same family. It is "" for a DontListen server.
func (s *Server) ClientURL() string {
	addr, ok := s.ns.Addr().(*net.TCPAddr)
	if !ok || addr == nil {
		return ""
	}
	ip := addr.IP
	if ip.IsUnspecified() {
		// Go may report a 0.0.0.0 listener as [::]; the configured host tells the family.
		ip = net.IPv4(127, 0, 0, 1)
		if h := net.ParseIP(s.opts.Host); h != nil && h.To4() == nil {
			ip = net.IPv6loopback
		}
	}
	scheme := "nats"
	if s.opts.TLSConfig != nil {
		scheme = "tls"
	}
	return scheme + "://" + net.JoinHostPort(ip.String(), strconv.Itoa(addr.Port))
}

// ClusterAddr is the route listener's actual address (host:port) as bound, or "" when the
// server is not clustering. Other nodes name it in --routes nats://HOST:PORT.
func (s *Server) ClusterAddr() string { return tcpAddrString(s.ns.ClusterAddr()) }

// MonitorAddr is the HTTP monitoring listener's actual address (host:port), or "" when
// monitoring is off (no -m).
func (s *Server) MonitorAddr() string { return tcpAddrString(s.ns.MonitorAddr()) }

func tcpAddrString(a *net.TCPAddr) string {
	if a == nil {
		return ""
	}
	return a.String()
}

// ConnectInProcess opens a client connection that talks to the server through memory, not
// a socket (about 13 µs per request/reply against 80 µs over loopback TCP). It works for a
// DontListen server too. Such a connection belongs to this server instance: after a restart
// it never reconnects, so make a new one from the new Server.
func (s *Server) ConnectInProcess(opts ...nats.Option) (*nats.Conn, error) {
	nc, err := nats.Connect("", append([]nats.Option{nats.InProcessServer(s.ns)}, opts...)...)
	if err != nil {
		return nil, fmt.Errorf("natsd: in-process connection: %w", err)
	}
	return nc, nil
}

// Fatal is closed when the server reports an unrecoverable error after Start (one that
// nats-server would exit the process for); Err then returns it. The server may no longer
// be serving: the embedding program should shut it down and exit or restart it.
func (s *Server) Fatal() <-chan struct{} { return s.log.fatal }

// Err returns the fatal error that closed Fatal, or nil.
func (s *Server) Err() error { return s.log.failure() }

// Shutdown stops the server and returns when it has finished (clients closed, JetStream
// state flushed to the store dir), so a new server may then use the same ports and store
// dir. It is safe to call more than once.
func (s *Server) Shutdown() {
	s.ns.Shutdown()
	s.ns.WaitForShutdown()
}
