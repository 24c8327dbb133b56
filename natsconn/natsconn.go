// Package natsconn turns the [nats] section of the config into connection options, so
// every binary authenticates the same way: a credentials file (nkey/JWT), or a user with
// a password read from a file or from the environment variable ORTBUS_NATS_PASSWORD —
// never a secret written in the config itself — and TLS (a CA file, and a client
// certificate for mutual TLS) for servers on other hosts. A worker connects with its
// pool's own identity (config.Config.WorkerNATS), never with the gateway's.
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

// Options returns the connection options for the config's NATS section, named name.
func Options(c config.NATS, name string) ([]nats.Option, error) {
	opts := []nats.Option{
		nats.Name(name),
		nats.MaxReconnects(-1),
		nats.ReconnectWait(100 * time.Millisecond),
		nats.Timeout(2 * time.Second),
	}
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
