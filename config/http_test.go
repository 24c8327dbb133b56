package config

import (
	"fmt"
	"path/filepath"
	"strings"
	"testing"
)

func TestHTTPGuardsDefaults(t *testing.T) {
	c, err := Load(write(t, good))
	if err != nil {
		t.Fatal(err)
	}
	g := c.Gateway
	if g.HTTPMaxBody != 8<<20 || g.HTTPMaxConcurrent != 256 || g.HTTPTokenFile != "" || len(g.HTTPHosts) != 0 {
		t.Fatalf("HTTP defaults: body %d, concurrent %d, token file %q, hosts %v", g.HTTPMaxBody, g.HTTPMaxConcurrent, g.HTTPTokenFile, g.HTTPHosts)
	}
}

func TestHTTPGuardsSet(t *testing.T) {
	p := write(t, good+`
[gateway]
http_hosts = ["Ortbus.Internal", "gw.example:8080", "[::1]:9000", "10.0.0.7"]
http_token_file = "secrets/http-token"
http_max_body = "1MiB"
http_max_concurrent = 4
http_accounts = { alice = "secrets/alice-token" }
`)
	c, err := Load(p)
	if err != nil {
		t.Fatal(err)
	}
	g := c.Gateway
	if got := strings.Join(g.HTTPHosts, ","); got != "ortbus.internal,gw.example:8080,[::1]:9000,10.0.0.7" {
		t.Errorf("http_hosts = %s, want them lower-cased as written", got)
	}
	if want := filepath.Join(filepath.Dir(p), "secrets", "http-token"); g.HTTPTokenFile != want {
		t.Errorf("http_token_file = %s, want %s (relative to the file)", g.HTTPTokenFile, want)
	}
	if want := filepath.Join(filepath.Dir(p), "secrets", "alice-token"); g.HTTPAccounts["alice"] != want {
		t.Errorf("http_accounts = %v, want alice's file %s (relative to the file)", g.HTTPAccounts, want)
	}
	if g.HTTPMaxBody != 1<<20 || g.HTTPMaxConcurrent != 4 {
		t.Errorf("http_max_body %d, http_max_concurrent %d", g.HTTPMaxBody, g.HTTPMaxConcurrent)
	}
}

func TestHTTPGuardsBad(t *testing.T) {
	cases := []struct{ line, want string }{
		{`http_max_body = "100B"`, "at least 1KiB"},
		{`http_max_body = "lots"`, "not a size"},
		{`http_max_concurrent = -1`, "at least 1"},
		{`http_hosts = ["http://evil.example"]`, "no scheme"},
		{`http_hosts = ["*.example"]`, "wildcard"},
		{`http_hosts = [""]`, "empty"},
		{`http_hosts = ["::1"]`, "brackets"},
		{`http_hosts = ["gw.example:99999"]`, "bad port"},
		{`http_hosts = ["gw.example:"]`, "bad port"},
		{`http_token = "s3cret"`, "unknown key"},
		{`http_accounts = { "al ice" = "t" }`, "letters, digits"},
		{`http_accounts = { alice = "" }`, "file holding its token"},
	}
	for i, tc := range cases {
		text := good + "\n[gateway]\n" + tc.line + "\n"
		_, err := Load(write(t, text))
		if err == nil {
			t.Errorf("case %d (%s): accepted", i, tc.line)
			continue
		}
		if !strings.Contains(err.Error(), tc.want) {
			t.Errorf("case %d (%s): error %q does not say %q", i, tc.line, err, tc.want)
		}
		line := strings.Count(text[:strings.Index(text, tc.line)], "\n") + 1
		if !strings.Contains(err.Error(), fmt.Sprintf(".toml:%d:", line)) {
			t.Errorf("case %d (%s): error %q does not name line %d", i, tc.line, err, line)
		}
	}
}
