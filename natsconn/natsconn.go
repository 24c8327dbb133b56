// Package natsconn turns the [nats] section of the config into connection options, so
// every binary authenticates the same way: a credentials file (nkey/JWT), or a user with
// a password read from a file or from the environment variable ORTBUS_NATS_PASSWORD —
// never a secret written in the config itself — and TLS (a CA file, and a client
// certificate for mutual TLS) for servers on other hosts. A worker connects with its
// pool's own identity (config.Config.WorkerNATS), never with the gateway's. It is also
// the one home of the reconnect settings (Reconnect), which the gateway's in-process
// connection to its embedded server shares.
package natsconn

import (
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/ortbus/ortbus/config"
)

// PasswordEnv is read when the config names a user but no password file.
const PasswordEnv = "ORTBUS_NATS_PASSWORD"

// Reconnect settings of every long-lived ortbus connection (gateway, worker; the
// gateway's in-process one too): the one place they are decided.
const (
	// ReconnectWait is the pause after each round over the server list: a NATS restart
	// costs a gateway or worker about this much, not a restart of its own.
	ReconnectWait = 100 * time.Millisecond
	// ReconnectJitter (plain) and ReconnectJitterTLS are the upper bounds of a random
	// delay added to ReconnectWait, so that the gateways and workers a restarted server
	// lost do not all reconnect in the same instant; a TLS handshake costs the server more,
	// so those spread wider. (nats.go's defaults, stated here.)
	ReconnectJitter    = 100 * time.Millisecond
	ReconnectJitterTLS = time.Second
	// ReconnectBufSize bounds what is published while reconnecting (replies, claims,
	// heartbeats, work items): held and sent once reconnected, so an answer computed
	// during a server restart still reaches its client; past the bound a publish fails at
	// once (nats.ErrReconnectBufExceeded) rather than memory growing for as long as the
	// server is away. 8 MiB (nats.go's default) holds 8 replies of the default 1 MiB
	// max_payload.
	ReconnectBufSize = 8 << 20
)

// Reconnect returns the reconnect options: reconnect for ever, every ReconnectWait plus
// jitter, with ReconnectBufSize of buffer. For ever means while the server is away, not
// when it refuses this connection: nats.go closes a connection for good on a fatal server
// error ("maximum control line exceeded") or on the same authorization error twice in a
// row when reconnecting (a rotated password, a removed user), and ortbus keeps that
// (no IgnoreAuthErrorAbort): the gateway and the workers then stop with an error, and
// their supervisor restarts them, which reads the credentials afresh.
func Reconnect() []nats.Option {
	return []nats.Option{
		nats.MaxReconnects(-1),
		nats.ReconnectWait(ReconnectWait),
		nats.ReconnectJitter(ReconnectJitter, ReconnectJitterTLS),
		nats.ReconnectBufSize(ReconnectBufSize),
	}
}

// Options returns the connection options for the config's NATS section, named name: the
// Reconnect settings, credentials, TLS and the inbox prefix.
func Options(c config.NATS, name string) ([]nats.Option, error) {
	opts := append([]nats.Option{nats.Name(name), nats.Timeout(2 * time.Second)}, Reconnect()...)
	switch {
	case c.CredsFile != "":
		opts = append(opts, nats.UserCredentials(c.CredsFile))
	case c.User != "":
		pass := os.Getenv(PasswordEnv)
		if c.PasswordFile != "" {
			b, err := os.ReadFile(c.PasswordFile)
			if err != nil {
				return nil, fmt.Errorf("nats password file: %w", err)
			}
			pass = strings.TrimSpace(string(b))
		}
		if pass == "" {
			return nil, fmt.Errorf("nats user %q has no password: set password_file or %s", c.User, PasswordEnv)
		}
		opts = append(opts, nats.UserInfo(c.User, pass))
	}
	if c.TLSCA != "" {
		opts = append(opts, nats.RootCAs(c.TLSCA))
	}
	if c.TLSCert != "" || c.TLSKey != "" {
		opts = append(opts, nats.ClientCert(c.TLSCert, c.TLSKey))
	}
	if c.InboxPrefix != "" {
		// Replies to this connection's requests come to PREFIX.>: the only inboxes a server
		// with per-user prefixes lets this user subscribe to.
		opts = append(opts, nats.CustomInboxPrefix(c.InboxPrefix))
	}
	return opts, nil
}

// StripUserInfo removes the user information (user:password@) from each URL of a
// comma-separated list. nats.go prefers a URL's user information to every other
// credential, so a URL written with the gateway's password would otherwise log in a
// worker that has credentials of its own as the gateway.
func StripUserInfo(urls string) string {
	parts := strings.Split(urls, ",")
	for i, p := range parts {
		s := strings.TrimSpace(p)
		scheme, rest := "", s
		if j := strings.Index(s, "://"); j >= 0 {
			scheme, rest = s[:j+3], s[j+3:]
		}
		// The authority ends at the first '/', '?' or '#'; the user information is what
		// precedes its last '@'.
		authority, tail := rest, ""
		if k := strings.IndexAny(rest, "/?#"); k >= 0 {
			authority, tail = rest[:k], rest[k:]
		}
		if at := strings.LastIndexByte(authority, '@'); at >= 0 {
			authority = authority[at+1:]
		}
		parts[i] = scheme + authority + tail
	}
	return strings.Join(parts, ",")
}
