package natsd

import (
	"errors"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestParseArgsDefaultsToLoopback(t *testing.T) {
	opts, err := ParseArgs([]string{"-p", "-1", "-n", "node-a", "-js", "-sd", "/tmp/x", "-m", "8222"})
	if err != nil {
		t.Fatal(err)
	}
	if opts.Host != "127.0.0.1" {
		t.Errorf("Host = %q, want 127.0.0.1", opts.Host)
	}
	if opts.Port != -1 || opts.ServerName != "node-a" || !opts.JetStream || opts.StoreDir != "/tmp/x" || opts.HTTPPort != 8222 {
		t.Errorf("flags not applied: port=%d name=%q js=%v sd=%q m=%d", opts.Port, opts.ServerName, opts.JetStream, opts.StoreDir, opts.HTTPPort)
	}
	if opts.Cluster.Host != "" || opts.Cluster.Port != 0 {
		t.Errorf("cluster set without --cluster: %s:%d", opts.Cluster.Host, opts.Cluster.Port)
	}
}

func TestParseArgsHonoursHost(t *testing.T) {
	for _, host := range []string{"0.0.0.0", "10.1.2.3"} {
		opts, err := ParseArgs([]string{"-a", host})
		if err != nil {
			t.Fatal(err)
		}
		if opts.Host != host {
			t.Errorf("-a %s: Host = %q", host, opts.Host)
		}
	}
	cfg := writeFile(t, "host.conf", "host: 0.0.0.0\nport: 4999\n")
	opts, err := ParseArgs([]string{"-c", cfg})
	if err != nil {
		t.Fatal(err)
	}
	if opts.Host != "0.0.0.0" || opts.Port != 4999 {
		t.Errorf("config host/port = %s:%d, want 0.0.0.0:4999", opts.Host, opts.Port)
	}
	// A flag overrides the config file, as with nats-server.
	opts, err = ParseArgs([]string{"-c", cfg, "-p", "5000"})
	if err != nil {
		t.Fatal(err)
	}
	if opts.Port != 5000 {
		t.Errorf("-p after -c: Port = %d, want 5000", opts.Port)
	}
}

func TestParseArgsCluster(t *testing.T) {
	opts, err := ParseArgs([]string{"--cluster", "nats://:-1", "--cluster_name", "t", "--routes", "nats://127.0.0.1:7001,nats://127.0.0.1:7002"})
	if err != nil {
		t.Fatal(err)
	}
	if opts.Cluster.Host != "127.0.0.1" || opts.Cluster.Port != -1 || opts.Cluster.Name != "t" {
		t.Errorf("cluster = %s:%d name %q, want 127.0.0.1:-1 name t", opts.Cluster.Host, opts.Cluster.Port, opts.Cluster.Name)
	}
	if len(opts.Routes) != 2 || opts.Routes[1].Host != "127.0.0.1:7002" {
		t.Errorf("routes = %v", opts.Routes)
	}
	opts, err = ParseArgs([]string{"--cluster", "nats://0.0.0.0:6222"})
	if err != nil {
		t.Fatal(err)
	}
	if opts.Cluster.Host != "0.0.0.0" || opts.Cluster.Port != 6222 {
		t.Errorf("explicit cluster host not kept: %s:%d", opts.Cluster.Host, opts.Cluster.Port)
	}
}

func TestParseArgsErrors(t *testing.T) {
	badConf := writeFile(t, "bad.conf", "port: [\n")
	cases := []struct {
		args []string
		want string
	}{
		{[]string{"-nope"}, "flag provided but not defined: -nope"},
		{[]string{"-p", "abc"}, "invalid value"},
		{[]string{"-c", filepath.Join(t.TempDir(), "missing.conf")}, "missing.conf"},
		{[]string{"-c", badConf}, "bad.conf"},
		{[]string{"--routes", "nats://127.0.0.1:7001"}, "require cluster"},
		{[]string{"-sl", "stop"}, "-sl is not supported"},
		{[]string{"bogus"}, "bogus"},
	}
	for _, c := range cases {
		_, err := ParseArgs(c.args)
		if err == nil {
			t.Errorf("ParseArgs(%q): no error", c.args)
			continue
		}
		if !strings.Contains(err.Error(), c.want) || !strings.HasPrefix(err.Error(), "natsd: ") {
			t.Errorf("ParseArgs(%q) = %q, want it to mention %q", c.args, err, c.want)
		}
		t.Logf("%q: %v", c.args, err)
	}
}

func TestParseArgsHelpAndVersion(t *testing.T) {
	for _, a := range []string{"-h", "--help", "help"} {
		if _, err := ParseArgs([]string{a}); !errors.Is(err, ErrHelp) {
			t.Errorf("%s: err = %v, want ErrHelp", a, err)
		}
	}
	for _, a := range []string{"-v", "--version", "version"} {
		if _, err := ParseArgs([]string{a}); !errors.Is(err, ErrVersion) {
			t.Errorf("%s: err = %v, want ErrVersion", a, err)
		}
	}
	var sb strings.Builder
	PrintUsage(&sb, func(fs *flag.FlagSet) { fs.Bool("check", false, "validate only") })
	for _, want := range []string{"-cluster_name", "-js", "-check", "validate only"} {
		if !strings.Contains(sb.String(), want) {
			t.Errorf("usage lacks %q", want)
		}
	}
}

func TestParseArgsWithExtraFlags(t *testing.T) {
	var check bool
	opts, err := ParseArgsWith([]string{"-p", "-1", "-check"}, func(fs *flag.FlagSet) {
		fs.BoolVar(&check, "check", false, "")
	})
	if err != nil {
		t.Fatal(err)
	}
	if !check || opts.Port != -1 {
		t.Errorf("check=%v port=%d", check, opts.Port)
	}
}

func TestCheck(t *testing.T) {
	opts, err := ParseArgs([]string{"-p", "-1", "-js", "-sd", t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	if err := Check(opts); err != nil {
		t.Errorf("valid options rejected: %v", err)
	}
	opts.Cluster.Name = "has space" // nats-server refuses spaces in cluster names
	opts.Cluster.Port = -1
	if err := Check(opts); err == nil || !strings.Contains(err.Error(), "cluster name") {
		t.Errorf("invalid cluster name: Check = %v, want an error about the cluster name", err)
	}
}

func writeFile(t *testing.T, name, content string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}
