// Package natsconn turns the [nats] section of the config into connection options, so
// every binary authenticates the same way: a credentials file (nkey/JWT), or a user with
// a password read from a file or from the environment variable ORTBUS_NATS_PASSWORD —
// never a secret written in the config itself — and TLS (a CA file, and a client
// certificate for mutual TLS) for servers on other hosts.
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
	return opts, nil
}
