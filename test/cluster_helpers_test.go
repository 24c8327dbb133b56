package test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"golang.org/x/crypto/bcrypt"

	"github.com/ortbus/ortbus/codec"
	launchpkg "github.com/ortbus/ortbus/internal/launch"
	"github.com/ortbus/ortbus/internal/testkit/testenv"
)

// Helpers of the cluster tests (cluster_perm_test.go, cluster_multihost_test.go): NATS
// nodes run as natsembed processes on configs of the shape of deploy/cluster/nodeN.conf,
// with deploy/cluster/permissions.conf itself beside them, TLS from a throwaway CA, and
// passwords generated per test and handed to the nodes through the environment variables
// that permissions.conf names — as in production.

// Failure bounds of the cluster tests; a passing run never waits them out.
const (
	clusterStartBound = 20 * time.Second // a node's ready line, the mesh, a status change
	clusterEventBound = 10 * time.Second // one reply, error event or message
)

// clusterRole is one user of deploy/cluster/permissions.conf and the environment variable
// its password (or bcrypt hash) comes from.
type clusterRole struct {
	User, Env string
	Bcrypt    bool // the node gets a bcrypt hash of the password, not the password
}

// clusterRoles are the users of deploy/cluster/permissions.conf. Some get their password
// as a bcrypt hash, some as plaintext: the file accepts both.
var clusterRoles = []clusterRole{
	{"client", "ORTBUS_NATS_CLIENT_PASSWORD", false},
	{"gateway", "ORTBUS_NATS_GATEWAY_PASSWORD", true},
	{"worker-cuda", "ORTBUS_NATS_WORKER_CUDA_PASSWORD", false},
	{"worker-openvino", "ORTBUS_NATS_WORKER_OPENVINO_PASSWORD", true},
	{"worker-cpu", "ORTBUS_NATS_WORKER_CPU_PASSWORD", true},
	{"ops", "ORTBUS_NATS_OPS_PASSWORD", false},
}

// clusterInboxPrefixes are the inbox prefixes of the roles that make requests: each may
// subscribe only to its own (deploy/cluster/permissions.conf). Workers make no requests.
var clusterInboxPrefixes = map[string]string{
	"client":  "_INBOX_client",
	"ops":     "_INBOX_ops",
	"gateway": "_INBOX_gateway",
}

// clusterSecrets are one test's passwords, by user.
type clusterSecrets map[string]string

// newClusterSecrets generates a random password for every role (a leading letter keeps the
// value a string for nats-server's parser, see permissions.conf).
func newClusterSecrets(t testing.TB) clusterSecrets {
	t.Helper()
	return newRoleSecrets(t, clusterRoles)
}

// newRoleSecrets generates a random password for every one of roles.
func newRoleSecrets(t testing.TB, roles []clusterRole) clusterSecrets {
	t.Helper()
	s := clusterSecrets{}
	for _, r := range roles {
		b := make([]byte, 18)
		if _, err := rand.Read(b); err != nil {
			t.Fatal(err)
		}
		s[r.User] = "pw" + hex.EncodeToString(b)
	}
	return s
}

// nodeEnv is the environment of a NATS node: the caller's, without any ORTBUS_NATS_
// variable of its own, plus each role's password or bcrypt hash.
func (s clusterSecrets) nodeEnv(t testing.TB) []string {
	t.Helper()
	return s.nodeEnvFor(t, clusterRoles)
}

// nodeEnvFor is nodeEnv for the users of another file (roles).
func (s clusterSecrets) nodeEnvFor(t testing.TB, roles []clusterRole) []string {
	t.Helper()
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "ORTBUS_NATS_") {
			env = append(env, kv)
		}
	}
	for _, r := range roles {
		v := s[r.User]
		if r.Bcrypt {
			h, err := bcrypt.GenerateFromPassword([]byte(v), bcrypt.MinCost)
			if err != nil {
				t.Fatal(err)
			}
			v = string(h)
		}
		env = append(env, r.Env+"="+v)
	}
	return env
}

// clusterTLS is a throwaway CA and one node certificate (serverAuth and clientAuth, for
// 127.0.0.1-3 and localhost), written as deploy/cluster's files are named.
type clusterTLS struct {
	Dir           string // holds ca.pem, node.pem, node-key.pem
	CA, Cert, Key string
	OtherCA       string // a second CA's certificate, which signed nothing used here
}

// clusterWriteTLS writes a CA and a node certificate into a new directory of t.
func clusterWriteTLS(t testing.TB) *clusterTLS {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "tls")
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	c := &clusterTLS{Dir: dir, CA: filepath.Join(dir, "ca.pem"), Cert: filepath.Join(dir, "node.pem"), Key: filepath.Join(dir, "node-key.pem"), OtherCA: filepath.Join(dir, "other-ca.pem")}
	now := time.Now()
	newKey := func() *ecdsa.PrivateKey {
		k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			t.Fatal(err)
		}
		return k
	}
	writePEM := func(path, typ string, der []byte) {
		if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	newCA := func(name string, serial int64) (*x509.Certificate, *ecdsa.PrivateKey, []byte) {
		key := newKey()
		tmpl := &x509.Certificate{
			SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: name},
			NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour),
			IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
		if err != nil {
			t.Fatal(err)
		}
		cert, err := x509.ParseCertificate(der)
		if err != nil {
			t.Fatal(err)
		}
		return cert, key, der
	}
	ca, caKey, caDER := newCA("ortbus test CA", 1)
	writePEM(c.CA, "CERTIFICATE", caDER)
	_, _, otherDER := newCA("another CA", 2)
	writePEM(c.OtherCA, "CERTIFICATE", otherDER)

	key := newKey()
	leaf := &x509.Certificate{
		SerialNumber: big.NewInt(3), Subject: pkix.Name{CommonName: "ortbus test node"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour),
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1), net.IPv4(127, 0, 0, 2), net.IPv4(127, 0, 0, 3)},
		DNSNames:    []string{"localhost"},
	}
	der, err := x509.CreateCertificate(rand.Reader, leaf, ca, &key.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	writePEM(c.Cert, "CERTIFICATE", der)
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	writePEM(c.Key, "EC PRIVATE KEY", kder)
	return c
}

// clusterDeployDir is deploy/cluster of the repository.
func clusterDeployDir(t testing.TB) string {
	return filepath.Join(testenv.RepoRoot(t), "deploy", "cluster")
}

// clusterNodeSpec is one test node: the shape of deploy/cluster/nodeN.conf (client TLS,
// JetStream, a cluster with mutual-TLS routes, permissions.conf included) on a loopback
// address with ports picked by the server.
type clusterNodeSpec struct {
	Name   string   // server_name
	Host   string   // 127.0.0.x, for clients and routes
	Routes []string // host:port of other nodes' route listeners
	// Standalone leaves the cluster block out.
	Standalone bool
	// JetStream enables it, as deploy's nodes do. A clustered JetStream node does not start
	// without routes of its own: a node that only others route to (node 1 of the
	// multi-host test, whose peers' ports are not known before it starts) gets a
	// ClusterPort chosen beforehand and a route to itself, which the server ignores.
	JetStream bool
	// ClusterPort is the route listener's port (0: any, picked by the server).
	ClusterPort int
	// Include is the deploy file of users and permissions copied beside the config and
	// included (default: deploy/cluster/permissions.conf).
	Include string
}

// freePort returns a TCP port on host that was free a moment ago (for a listener whose
// port must be known before its process starts).
func freePort(t testing.TB, host string) int {
	t.Helper()
	ln, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// clusterWriteNode writes the node's config, and deploy/cluster/permissions.conf (or
// n.Include) unchanged beside it, into a new directory, and returns the config's path.
func clusterWriteNode(t testing.TB, tc *clusterTLS, n clusterNodeSpec) string {
	t.Helper()
	dir := t.TempDir()
	include := n.Include
	if include == "" {
		include = filepath.Join(clusterDeployDir(t), "permissions.conf")
	}
	perms, err := os.ReadFile(include)
	if err != nil {
		t.Fatal(err)
	}
	incName := filepath.Base(include)
	if incName == n.Name+".conf" {
		t.Fatalf("node %s: its config would overwrite %s", n.Name, incName)
	}
	if err := os.WriteFile(filepath.Join(dir, incName), perms, 0o600); err != nil {
		t.Fatal(err)
	}
	q := strconv.Quote
	var b strings.Builder
	fmt.Fprintf(&b, "server_name: %s\nhost: %s\nport: -1\n", n.Name, n.Host)
	fmt.Fprintf(&b, "tls {\n  cert_file: %s\n  key_file: %s\n  ca_file: %s\n  timeout: 2\n}\n", q(tc.Cert), q(tc.Key), q(tc.CA))
	fmt.Fprintf(&b, "max_payload: 8MB\n")
	if n.JetStream {
		fmt.Fprintf(&b, "jetstream {\n  store_dir: %s\n  max_memory_store: 64MB\n  max_file_store: 256MB\n}\n", q(filepath.Join(dir, "js")))
	}
	if n.Standalone {
		b.WriteString("include ./" + incName + "\n")
		return clusterWriteFile(t, filepath.Join(dir, n.Name+".conf"), b.String())
	}
	// advertise: every node here connects to the others from 127.0.0.1 (the kernel's
	// source address on lo), so without it node 1 would tell nodes 2 and 3 that the other
	// is at 127.0.0.1. On real hosts the connection's address is the node's own.
	port := n.ClusterPort
	if port == 0 {
		port = -1
	}
	fmt.Fprintf(&b, "cluster {\n  name: ortbus\n  host: %s\n  port: %d\n  advertise: %s\n", n.Host, port, n.Host)
	fmt.Fprintf(&b, "  tls {\n    cert_file: %s\n    key_file: %s\n    ca_file: %s\n    verify: true\n    timeout: 2\n  }\n", q(tc.Cert), q(tc.Key), q(tc.CA))
	if len(n.Routes) > 0 {
		b.WriteString("  routes: [\n")
		for _, r := range n.Routes {
			fmt.Fprintf(&b, "    nats-route://%s\n", r)
		}
		b.WriteString("  ]\n")
	}
	b.WriteString("}\ninclude ./" + incName + "\n")
	return clusterWriteFile(t, filepath.Join(dir, n.Name+".conf"), b.String())
}

// clusterWriteFile writes content to path (mode 0600) and returns path.
func clusterWriteFile(t testing.TB, path, content string) string {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// clusterNatsembed is the natsembed binary, built once per test process.
func clusterNatsembed(t testing.TB) string {
	t.Helper()
	return testBinary(t, "natsembed")
}

// clusterNode is a running natsembed process.
type clusterNode struct {
	Name    string
	URL     string // the client URL of its ready line (tls://HOST:PORT)
	Cluster string // its route listener, host:port
	lp      *launchpkg.Proc
}

// clusterStartNode runs `natsembed -c conf` with env and waits for its ready line. The
// process is stopped (SIGTERM, then SIGKILL) when t ends, and its log shown if t failed.
func clusterStartNode(t testing.TB, name, conf string, env []string) *clusterNode {
	t.Helper()
	lp, err := launchpkg.Start(clusterNatsembed(t), []string{"-c", conf}, launchpkg.Options{Name: "NATS node " + name, Environ: env})
	if err != nil {
		t.Fatal(err)
	}
	n := &clusterNode{Name: name, lp: lp}
	t.Cleanup(func() {
		n.stop()
		if t.Failed() {
			t.Logf("log of NATS node %s:\n%s", name, lp.Log())
		}
	})
	r, err := lp.Ready(context.Background(), clusterStartBound)
	if err != nil {
		t.Fatalf("%v:\n%s", err, lp.Log())
	}
	n.URL, n.Cluster = r.NATSURL, r.Cluster
	return n
}

// stop ends the node: SIGTERM, SIGKILL after a bound.
func (n *clusterNode) stop() { n.lp.Stop(10 * time.Second) }

// clusterConn is a client connection of one role, with its asynchronous errors (the
// server's permission violations) on a channel.
type clusterConn struct {
	*nats.Conn
	User string
	errs chan error
}

// clusterDial connects to url as user with password pw, trusting the CA file ca, with the
// user's inbox prefix (clusterInboxPrefixes) unless extra sets another.
func clusterDial(url, user, pw, ca string, extra ...nats.Option) (*clusterConn, error) {
	c := &clusterConn{User: user, errs: make(chan error, 64)}
	opts := []nats.Option{
		nats.Name("cluster test " + user),
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
			select {
			case c.errs <- err:
			default:
			}
		}),
		nats.Timeout(5 * time.Second),
	}
	if user != "" {
		opts = append(opts, nats.UserInfo(user, pw))
	}
	if ca != "" {
		opts = append(opts, nats.RootCAs(ca))
	}
	if p := clusterInboxPrefixes[user]; p != "" {
		opts = append(opts, nats.CustomInboxPrefix(p))
	}
	nc, err := nats.Connect(url, append(opts, extra...)...)
	if err != nil {
		return nil, err
	}
	c.Conn = nc
	return c, nil
}

// clusterConnect is clusterDial as a role of s, failing t; closed when t ends.
func clusterConnect(t testing.TB, url string, s clusterSecrets, user, ca string) *clusterConn {
	t.Helper()
	c, err := clusterDial(url, user, s[user], ca, nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))
	if err != nil {
		t.Fatalf("connect to %s as %s: %v", url, user, err)
	}
	t.Cleanup(c.Close)
	return c
}

// clusterNewInbox is newInbox under the connection's own inbox prefix (nc.NewInbox), the
// only inboxes a role of deploy/cluster may subscribe to.
func clusterNewInbox(t testing.TB, nc *nats.Conn) *inbox {
	t.Helper()
	return newInboxAt(t, nc, nc.NewInbox())
}

// violation waits for the server's permissions violation for subject (the error event
// nats.go raises on -ERR 'Permissions Violation for Publish to "SUBJECT"' or '...
// Subscription to "SUBJECT"'), skipping other errors; it fails t without one.
func (c *clusterConn) violation(t testing.TB, kind, subject string) error {
	t.Helper()
	timeout := time.After(clusterEventBound)
	for {
		select {
		case err := <-c.errs:
			if errors.Is(err, nats.ErrPermissionViolation) && strings.Contains(err.Error(), kind) && strings.Contains(err.Error(), `"`+subject+`"`) {
				return err
			}
			t.Logf("%s: other error while waiting for a violation on %s: %v", c.User, subject, err)
		case <-timeout:
			t.Fatalf("%s: no permissions violation for %s %q within %v", c.User, kind, subject, clusterEventBound)
			return nil
		}
	}
}

// noErrors fails t if the connection has reported any error so far (after a round trip,
// so that the server's answer to everything sent before has arrived).
func (c *clusterConn) noErrors(t testing.TB) {
	t.Helper()
	if err := c.Flush(); err != nil {
		t.Fatalf("%s: flush: %v", c.User, err)
	}
	for {
		select {
		case err := <-c.errs:
			t.Errorf("%s: unexpected error: %v", c.User, err)
		default:
			return
		}
	}
}

// clusterStatus asks the gateway's API for status over nc.
func clusterStatus(t testing.TB, nc *nats.Conn) *codec.StatusReply {
	t.Helper()
	m, err := nc.Request("ortbus.v1.status", []byte{0x80}, clusterEventBound) // an empty msgpack map
	if err != nil {
		t.Fatalf("status: %v", err)
	}
	var st codec.StatusReply
	if err := codec.Unmarshal(m.Data, &st); err != nil {
		t.Fatalf("status: %v (%q)", err, m.Data)
	}
	return &st
}

// clusterWaitStatus polls status every pollEvery (there is no push event for a change of
// state) until ok accepts it, failing t after clusterStartBound.
func clusterWaitStatus(t testing.TB, nc *nats.Conn, what string, ok func(*codec.StatusReply) bool) *codec.StatusReply {
	t.Helper()
	var st *codec.StatusReply
	checkFor(t, "status to show "+what, clusterStartBound, pollEvery, func() error {
		if st = clusterStatus(t, nc); ok(st) {
			return nil
		}
		return lastStatus{st}
	})
	return st
}
