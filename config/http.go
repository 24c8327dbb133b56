package config

import (
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
)

// Defaults of the HTTP API's guards ([gateway] http_max_body, http_max_concurrent).
const (
	DefaultHTTPMaxBody       = Bytes(8 << 20)
	DefaultHTTPMaxConcurrent = 256
)

// HTTPTokenEnv holds the HTTP API's bearer token when gateway.http_token_file is unset.
const HTTPTokenEnv = "ORTBUS_HTTP_TOKEN"

// validateHTTP checks the HTTP API's guards, lower-cases http_hosts and resolves the
// token file's path (the file itself is read when the gateway starts).
func (c *Config) validateHTTP() error {
	var errs []error
	g := &c.Gateway
	if g.HTTPMaxBody < 1024 {
		errs = append(errs, c.errf("gateway.http_max_body", "must be at least 1KiB, got %d bytes", g.HTTPMaxBody))
	}
	if g.HTTPMaxConcurrent < 1 {
		errs = append(errs, c.errf("gateway.http_max_concurrent", "must be at least 1, got %d", g.HTTPMaxConcurrent))
	}
	for i, h := range g.HTTPHosts {
		if err := checkHTTPHost(h); err != nil {
			errs = append(errs, c.errf("gateway.http_hosts", "%q: %v", h, err))
			continue
		}
		g.HTTPHosts[i] = strings.ToLower(h)
	}
	g.HTTPTokenFile = c.Path(g.HTTPTokenFile)
	for name, file := range g.HTTPAccounts {
		if err := CheckAccountName(name); err != nil {
			errs = append(errs, c.errf("gateway.http_accounts", "%q: %v", name, err))
			continue
		}
		if file == "" {
			errs = append(errs, c.errf("gateway.http_accounts", "%q: want the path of a file holding its token", name))
			continue
		}
		g.HTTPAccounts[name] = c.Path(file)
	}
	return errors.Join(errs...)
}

// MaxAccountNameLen bounds an HTTP account's name (gateway.http_accounts).
const MaxAccountNameLen = 64

// CheckAccountName accepts the name of an HTTP account: 1 to MaxAccountNameLen letters,
// digits, '-' and '_' (a NATS account's name of that form names the same owner).
func CheckAccountName(name string) error {
	if name == "" || len(name) > MaxAccountNameLen {
		return fmt.Errorf("want 1 to %d characters, got %d", MaxAccountNameLen, len(name))
	}
	for _, r := range name {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '_') {
			return fmt.Errorf("holds %q (letters, digits, - and _ only)", r)
		}
	}
	return nil
}

// checkHTTPHost accepts what a Host header may carry: a name or an IP address, with an
// optional port (an IPv6 address in brackets).
func checkHTTPHost(h string) error {
	if h == "" {
		return errors.New("empty")
	}
	if strings.ContainsAny(h, "/@?#*%, \t") {
		return errors.New("want a host name or host:port (no scheme, path, user or wildcard)")
	}
	host, port, err := net.SplitHostPort(h)
	if err == nil && port == "" {
		return errors.New("bad port \"\"")
	}
	if err != nil {
		host, port = h, ""
		if strings.HasPrefix(h, "[") && strings.HasSuffix(h, "]") {
			host = h[1 : len(h)-1]
		} else if strings.Contains(h, ":") {
			return errors.New("want host or host:port (an IPv6 address in brackets)")
		}
	}
	if host == "" {
		return errors.New("no host")
	}
	if strings.Contains(host, ":") && net.ParseIP(host) == nil {
		return errors.New("not an IPv6 address in brackets")
	}
	if port != "" {
		if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
			return fmt.Errorf("bad port %q", port)
		}
	}
	return nil
}
