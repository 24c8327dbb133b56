package test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/ortbus/ortbus/codec"
	"github.com/ortbus/ortbus/config"
	launchpkg "github.com/ortbus/ortbus/internal/launch"
	"github.com/ortbus/ortbus/internal/testkit/testenv"
	"github.com/ortbus/ortbus/models/onnxgen"
)

// Failure bounds of the gateway tests; a passing run never waits them out.
const (
	gwStartBound = 60 * time.Second // the gateway's ready line
	// jobStoreOpenBound ends a wait for the gateway's "job store open" that never comes
	// (the gateway retries its open for as long as it runs): a failure, not a timing.
	jobStoreOpenBound = 10 * time.Minute
	gwReplyBound      = 30 * time.Second // one reply, claim or status change
	gwStopBound       = 20 * time.Second // the gateway's exit after SIGTERM
)

// gwHeavyLayers is the slow tagger's layer count in the gateway tests: ~4.4 ms a layer
// on one core, so one inference takes ~110 ms: long enough that a request is certainly
// still running (held) when a test stops or kills its worker, and that 30 queued batch
// items keep a pool busy for seconds.
const gwHeavyLayers = 25

// Model names in every gateway test config.
const (
	gwTagger = "tagger"      // the plain generated tagger (fast)
	gwSlow   = "tagger_slow" // the same tagger with gwHeavyLayers compute layers
)

// gatewayBinaries are the gateway and ortworker binaries, built once per test process.
func gatewayBinaries(t testing.TB) (gateway, worker string) {
	t.Helper()
	return testBinary(t, "gateway"), testBinary(t, "ortworker")
}

var gwSlowModel struct {
	once sync.Once
	dir  string
	err  error
}

// gwSlowTaggerDir writes (once) a tagger folder whose graph has gwHeavyLayers compute
// layers, with the plain tagger's label files.
func gwSlowTaggerDir(t testing.TB) string {
	t.Helper()
	gwSlowModel.once.Do(func() {
		dir := filepath.Join(pkgEnv.tmp, "gateway-tagger-slow")
		gwSlowModel.err = onnxgen.GenerateTagger(dir, gwHeavyLayers)
		gwSlowModel.dir = dir
	})
	if gwSlowModel.err != nil {
		t.Fatalf("slow tagger: %v", gwSlowModel.err)
	}
	return gwSlowModel.dir
}

// gwPool is one [pools.NAME] table of a gateway test config.
type gwPool struct {
	Name      string
	Version   string // runtime version from .deps; ignored when Runtime is set
	Runtime   string // explicit runtime path
	Workers   int
	Slots     int
	Classes   []string
	Models    []string
	Env       map[string]string
	LazyLoad  bool
	KeepAlive string
	Device    string // "" = the EP's default (cpu)
	MaxBatch  int
}

// gwClass is one [classes.NAME] table.
type gwClass struct {
	Name       string
	Chain      []string
	QueueBound int
	Timeout    string
	Degrade    bool
}

// gwConfig is a whole gateway test config.
type gwConfig struct {
	NATSURL string // external NATS; "" = embedded
	// StoreDir turns on the embedded server's JetStream, kept in this directory.
	StoreDir string
	Jobs     config.Jobs  // the [jobs] table (defaults where zero)
	Cache    config.Cache // the [cache] table (off unless Enabled)
	Devices  map[string]config.Device
	// Models replace gwModels(t) when set (the names gwTagger and gwSlow both).
	Models map[string]*config.Model
	// ModelMemory declares every model's peak (0: measured by the workers).
	ModelMemory config.Bytes
	Root        string         // the one allowed image root
	Gateway     config.Gateway // the [gateway] table; shutdown_grace is 3s unless set
	Pools       []gwPool
	Classes     []gwClass
}

// gwModels are the models of the gateway tests' configs: the plain tagger and the slow one.
func gwModels(t testing.TB) map[string]*config.Model {
	t.Helper()
	return map[string]*config.Model{
		gwTagger: {Kind: config.KindTaggerPixAI, Dir: filepath.Join(testenv.Models(t), onnxgen.TaggerDir)},
		gwSlow:   {Kind: config.KindTaggerPixAI, Dir: gwSlowTaggerDir(t)},
	}
}

// write writes the config into a fresh temporary directory of t and returns its path.
// Heartbeats are fast (gwHeartbeat) so that a silent worker is dead after gwMissCount of
// them.
func (c gwConfig) write(t testing.TB) string {
	t.Helper()
	return c.writeIn(t, t.TempDir())
}

// writeIn is write into dir (which outlives t: the shared gateway's config).
func (c gwConfig) writeIn(t testing.TB, dir string) string {
	t.Helper()
	cfg := &config.Config{
		NATS:     config.NATS{URL: c.NATSURL},
		Gateway:  c.Gateway,
		Health:   config.Health{HeartbeatInterval: config.Duration(gwHeartbeat), MissCount: gwMissCount},
		Security: config.Security{AllowedRoots: []string{c.Root}},
		Classes:  map[string]*config.Class{},
		Pools:    map[string]*config.Pool{},
		Models:   gwModels(t),
	}
	if c.Models != nil {
		cfg.Models = c.Models
	}
	if c.NATSURL == "" {
		cfg.NATS = config.NATS{Embedded: true, Listen: "127.0.0.1:0", StoreDir: c.StoreDir}
	}
	cfg.Jobs = c.Jobs
	cfg.Cache = c.Cache
	cfg.Devices = c.Devices
	for _, m := range cfg.Models {
		m.Memory = c.ModelMemory
	}
	if cfg.Gateway.ShutdownGrace == 0 {
		cfg.Gateway.ShutdownGrace = config.Duration(3 * time.Second)
	}
	var pools, classes []string
	for _, p := range c.Pools {
		cfg.Pools[p.Name] = &config.Pool{Runtime: runtimeOf(t, p.Runtime, p.Version), Threads: 1, Workers: p.Workers, Slots: p.Slots,
			Classes: p.Classes, Models: p.Models, Env: p.Env, LazyLoad: p.LazyLoad, KeepAlive: p.KeepAlive, Device: p.Device, MaxBatch: p.MaxBatch}
		pools = append(pools, p.Name)
	}
	for _, cl := range c.Classes {
		cfg.Classes[cl.Name] = &config.Class{Chain: cl.Chain, QueueBound: cl.QueueBound, Timeout: duration(t, cl.Timeout), Degrade: cl.Degrade}
		classes = append(classes, cl.Name)
	}
	cfg.SetOrder("pools", pools...)
	cfg.SetOrder("classes", classes...)
	cfg.SetOrder("models", gwTagger, gwSlow)
	return writeConfigFile(t, filepath.Join(dir, "gateway.toml"), cfg)
}

// gatewayProc is a running gateway process and a NATS connection to its bus.
type gatewayProc struct {
	Ready   codec.Event // the ready line
	NC      *nats.Conn
	lp      *launchpkg.Proc
	logPath string
}

// startGateway runs `gateway -config cfgPath` on any free ports, waits for its ready
// line and connects to the NATS URL it names. The gateway (and with it its workers) is
// stopped when t ends; its log (its own and its workers' stderr) is shown if t failed.
func startGateway(t testing.TB, cfgPath string) *gatewayProc {
	t.Helper()
	return launchGateway(t, cfgPath, true)
}

// launchGateway is startGateway with extra environment (KEY=value), and without the
// connection to its NATS when connect is false (a TLS cluster the test reaches otherwise).
func launchGateway(t testing.TB, cfgPath string, connect bool, env ...string) *gatewayProc {
	t.Helper()
	g := spawnGateway(t, cfgPath, env...)
	t.Cleanup(func() {
		g.stop(t)
		if t.Failed() {
			t.Logf("gateway log (%s):\n%s", g.logPath, g.log())
		}
	})
	g.awaitReady(t)
	if connect {
		g.connect(t, t.Name())
		t.Cleanup(g.NC.Close)
	}
	return g
}

// spawnGateway starts `gateway -config cfgPath` on any free ports (its log next to the
// config) without waiting for it; the caller stops it (stop or shutdown).
func spawnGateway(t testing.TB, cfgPath string, env ...string) *gatewayProc {
	t.Helper()
	return spawnGatewayOn(t, cfgPath, "127.0.0.1:0", env...)
}

// spawnGatewayOn is spawnGateway with its embedded NATS server listening on natsListen:
// a fixed address (freeAddr) keeps the NATS URL across restarts of the gateway.
func spawnGatewayOn(t testing.TB, cfgPath, natsListen string, env ...string) *gatewayProc {
	t.Helper()
	return spawnGatewayAt(t, cfgPath, natsListen, "127.0.0.1:0", env...)
}

// spawnGatewayAt is spawnGatewayOn with its HTTP API listening on httpListen: a fixed
// address (freeAddr) keeps the page's address across restarts of the gateway.
func spawnGatewayAt(t testing.TB, cfgPath, natsListen, httpListen string, env ...string) *gatewayProc {
	t.Helper()
	gwBin, workerBin := gatewayBinaries(t)
	g := &gatewayProc{logPath: filepath.Join(filepath.Dir(cfgPath), "gateway.log")}
	var err error
	g.lp, err = launchpkg.Start(gwBin, []string{"-config", cfgPath, "-nats-listen", natsListen, "-http-listen", httpListen, "-worker", workerBin},
		launchpkg.Options{Name: "gateway", Env: env, LogFile: g.logPath})
	if err != nil {
		t.Fatal(err)
	}
	return g
}

// freeAddr is a loopback address (127.0.0.1:PORT) with a port free now, for a server that
// must keep its address across restarts.
func freeAddr(t testing.TB) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// awaitReady waits for the gateway's ready line, failing t after gwStartBound or if the
// gateway exits first.
func (g *gatewayProc) awaitReady(t testing.TB) {
	t.Helper()
	var err error
	if g.Ready, err = g.lp.Ready(context.Background(), gwStartBound); err != nil {
		t.Fatalf("%v; log:\n%s", err, g.log())
	}
	if g.Ready.NATSURL == "" || g.Ready.HTTP == "" {
		t.Fatalf("ready line without nats_url or http: %+v", g.Ready)
	}
}

// awaitJobStore waits for the gateway to log that its job store is open (it retries
// the open in the background until JetStream is ready), failing t if it never does.
func (g *gatewayProc) awaitJobStore(t testing.TB) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), jobStoreOpenBound)
	defer cancel()
	if err := g.lp.WaitLog(ctx, "job store open"); err != nil {
		t.Fatalf("%v; gateway log:\n%s", err, g.log())
	}
}

// connect connects g.NC, named name, to the NATS URL of the ready line; the caller closes it.
func (g *gatewayProc) connect(t testing.TB, name string) {
	t.Helper()
	var err error
	g.NC, err = nats.Connect(g.Ready.NATSURL, nats.Name(name), nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))
	if err != nil {
		t.Fatalf("connect to the gateway's NATS %s: %v", g.Ready.NATSURL, err)
	}
}

// log is the gateway's log: its own stderr and its workers'.
func (g *gatewayProc) log() string { return g.lp.Log() }

// stop sends SIGTERM (the gateway drains its workers and exits 0), and SIGKILL if it has
// not exited within gwStopBound. Its workers die with it (they are started with a parent
// death signal), so nothing outlives the test.
func (g *gatewayProc) stop(t testing.TB) {
	if err := g.shutdown(); err != nil {
		t.Error(err)
	}
}

// shutdown is stop without a test: the error says what went wrong.
func (g *gatewayProc) shutdown() error {
	if err := g.lp.Stop(gwStopBound); err != nil {
		return fmt.Errorf("%v; log:\n%s", err, g.log())
	}
	return nil
}

// alive reports whether the gateway process still runs.
func (g *gatewayProc) alive() bool { return g.lp.Alive() }

// gwReply is one answer of the gateway: a result body or an error.
type gwReply struct {
	Msg *nats.Msg
	Err *codec.Error // nil for a result
	At  time.Time    // when it was read
}

// gwDecode reads a gateway answer: an error (micro headers and a {code, message,
// details} body, whose code must match the header) or a result.
func gwDecode(t testing.TB, m *nats.Msg) gwReply {
	t.Helper()
	r := gwReply{Msg: m, At: time.Now()}
	if m.Header.Get(codec.HeaderErrorCode) != "" {
		r.Err = replyError(t, m, m.Header.Get(codec.HeaderContentType) == codec.ContentTypeJSON)
	}
	return r
}

// tag decodes a tag result, failing t on an error.
func (r gwReply) tag(t testing.TB) *codec.TagReply {
	t.Helper()
	if r.Err != nil {
		t.Fatalf("want a tag result, got %s: %s (details %v)", r.Err.Code, r.Err.Message, r.Err.Details)
	}
	var tr codec.TagReply
	if err := codec.Unmarshal(r.Msg.Data, &tr); err != nil {
		t.Fatalf("decode tag reply: %v", err)
	}
	return &tr
}

// code is the reply's error code, or "ok".
func (r gwReply) code() string {
	if r.Err == nil {
		return "ok"
	}
	return string(r.Err.Code)
}

// call sends one client request to ortbus.v1.<op> (msgpack) and waits for its answer.
func (g *gatewayProc) call(t testing.TB, op string, req *codec.Request, timeout time.Duration) gwReply {
	t.Helper()
	b, err := codec.Marshal(req)
	if err != nil {
		t.Fatal(err)
	}
	m, err := g.NC.Request("ortbus.v1."+op, b, timeout)
	if err != nil {
		t.Fatalf("%s request %+v: %v", op, req, err)
	}
	return gwDecode(t, m)
}

// cancel cancels request id as its sender, the inbox it was posted to, and returns the
// gateway's answer.
func (g *gatewayProc) cancel(t testing.TB, in *inbox, id string) codec.CancelReply {
	t.Helper()
	b, err := codec.Marshal(&codec.Cancel{ID: id})
	if err != nil {
		t.Fatal(err)
	}
	if err := g.NC.PublishRequest("ortbus.v1.cancel", in.subject(cancelKey(id)), b); err != nil {
		t.Fatal(err)
	}
	var cr codec.CancelReply
	if err := codec.Unmarshal(in.cancelReply(t, id).Data, &cr); err != nil {
		t.Fatalf("cancel reply: %v", err)
	}
	return cr
}

// post publishes a client request to ortbus.v1.<op> whose answer goes to the inbox
// subject key; it returns when the server has it.
func (g *gatewayProc) post(t testing.TB, in *inbox, op, key string, req *codec.Request) time.Time {
	t.Helper()
	b, err := codec.Marshal(req)
	if err != nil {
		t.Fatal(err)
	}
	if err := g.NC.PublishRequest("ortbus.v1."+op, in.subject(key), b); err != nil {
		t.Fatal(err)
	}
	return time.Now()
}

// gwCollect reads n answers from the inbox, in arrival order, keyed by inbox key.
func gwCollect(t testing.TB, in *inbox, n int) (order []string, got map[string]gwReply) {
	t.Helper()
	got = map[string]gwReply{}
	for len(order) < n {
		m := in.next(t, fmt.Sprintf("answer %d of %d", len(order)+1, n))
		k := in.key(m)
		if _, dup := got[k]; dup {
			t.Errorf("a second answer for %s", k)
			continue
		}
		order = append(order, k)
		got[k] = gwDecode(t, m)
	}
	return order, got
}

// status asks the gateway for its status.
func (g *gatewayProc) status(t testing.TB) *codec.StatusReply {
	t.Helper()
	m, err := g.NC.Request("ortbus.v1.status", []byte{0x80}, 5*time.Second) // an empty msgpack map
	if err != nil {
		t.Fatalf("status: %v", err)
	}
	var st codec.StatusReply
	if err := codec.Unmarshal(m.Data, &st); err != nil {
		t.Fatalf("status: %v", err)
	}
	return &st
}

// waitStatus polls status (a request each pollEvery: there is no push event for a change
// of state) until ok accepts it, failing t after gwReplyBound.
func (g *gatewayProc) waitStatus(t testing.TB, what string, ok func(*codec.StatusReply) bool) *codec.StatusReply {
	t.Helper()
	var st *codec.StatusReply
	checkFor(t, "status to show "+what, gwReplyBound, pollEvery, func() error {
		if st = g.status(t); ok(st) {
			return nil
		}
		return lastStatus{st}
	})
	return st
}

// gwLive returns the ready workers of pool in a status, by id.
func gwLive(st *codec.StatusReply, pool string) map[string]codec.WorkerStatus {
	out := map[string]codec.WorkerStatus{}
	for _, w := range st.Workers {
		if w.Pool == pool && w.State == codec.StateReady {
			out[w.Worker] = w
		}
	}
	return out
}

// waitLive waits until pool has n live workers, and returns them.
func (g *gatewayProc) waitLive(t testing.TB, pool string, n int) map[string]codec.WorkerStatus {
	t.Helper()
	st := g.waitStatus(t, fmt.Sprintf("%d live workers in pool %s", n, pool), func(st *codec.StatusReply) bool {
		return len(gwLive(st, pool)) == n
	})
	return gwLive(st, pool)
}

// gwSpy is a plain subscription that records every message on a subject (not in any queue
// group, so it takes nothing from the real subscribers).
type gwSpy struct {
	ch   chan *nats.Msg
	seen []*nats.Msg
}

func newGWSpy(t testing.TB, nc *nats.Conn, subject string) *gwSpy {
	t.Helper()
	s := &gwSpy{ch: make(chan *nats.Msg, 8192)}
	sub, err := nc.ChanSubscribe(subject, s.ch)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sub.Unsubscribe() })
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	return s
}

// until reads messages until ok accepts one and returns it (earlier ones stay in seen).
func (s *gwSpy) until(t testing.TB, what string, ok func(*nats.Msg) bool) *nats.Msg {
	t.Helper()
	for _, m := range s.seen {
		if ok(m) {
			return m
		}
	}
	timeout := time.After(gwReplyBound)
	for {
		select {
		case m := <-s.ch:
			s.seen = append(s.seen, m)
			if ok(m) {
				return m
			}
		case <-timeout:
			t.Fatalf("never saw %s within %v", what, gwReplyBound)
			return nil
		}
	}
}

// drain takes what has arrived so far, after a flush round trip on nc, so that every
// message the server sent before the flush is in seen.
func (s *gwSpy) drain(t testing.TB, nc *nats.Conn) []*nats.Msg {
	t.Helper()
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	for {
		select {
		case m := <-s.ch:
			s.seen = append(s.seen, m)
		default:
			return s.seen
		}
	}
}

// gwClaimOf waits for the claim of request id (on ortbus.claim.>) and returns it.
func gwClaimOf(t testing.TB, s *gwSpy, id string) codec.Claim {
	t.Helper()
	var c codec.Claim
	s.until(t, "the claim of "+id, func(m *nats.Msg) bool {
		var x codec.Claim
		if codec.Unmarshal(m.Data, &x) == nil && x.ID == id && x.State == codec.ClaimTaken {
			c = x
			return true
		}
		return false
	})
	return c
}

// gwDispatchedIDs decodes the work items a spy on infer.> saw, in order.
func gwDispatchedIDs(t testing.TB, msgs []*nats.Msg) []string {
	t.Helper()
	var ids []string
	for _, m := range msgs {
		var it codec.WorkItem
		if err := codec.Unmarshal(m.Data, &it); err != nil {
			t.Fatalf("work item on %s: %v", m.Subject, err)
		}
		ids = append(ids, it.ID)
	}
	return ids
}

// gwMetricLine matches one sample of ortbus_requests_total.
var gwMetricLine = regexp.MustCompile(`^ortbus_requests_total\{([^}]*)\} (\S+)$`)

// gwRequestCounts scrapes GET /metrics and returns ortbus_requests_total by its label set,
// written as "op=...,class=...,pool=...,model=...,code=...".
func gwRequestCounts(t testing.TB, httpAddr string) map[string]float64 {
	t.Helper()
	body := gwScrape(t, httpAddr)
	if !strings.Contains(body, "# TYPE ortbus_requests_total counter") {
		t.Errorf("/metrics has no ortbus_requests_total counter:\n%s", body)
	}
	return gwParseRequestCounts(t, body)
}

// gwParseRequestCounts reads ortbus_requests_total out of a /metrics body, keyed as
// gwRequestCounts says.
func gwParseRequestCounts(t testing.TB, body string) map[string]float64 {
	t.Helper()
	out := map[string]float64{}
	for _, line := range strings.Split(body, "\n") {
		m := gwMetricLine.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		labels := map[string]string{}
		for _, kv := range strings.Split(m[1], ",") {
			k, v, _ := strings.Cut(kv, "=")
			labels[k], _ = strconv.Unquote(v)
		}
		v, err := strconv.ParseFloat(m[2], 64)
		if err != nil {
			t.Fatalf("metrics line %q: %v", line, err)
		}
		out[gwMetricKey(labels["op"], labels["class"], labels["pool"], labels["model"], labels["code"])] = v
	}
	return out
}

// gwHeartbeatAge reads ortbus_worker_heartbeat_age_seconds of a worker from /metrics; ok is
// false when the worker is not listed (not live).
func gwHeartbeatAge(t testing.TB, httpAddr, worker string) (age time.Duration, ok bool) {
	t.Helper()
	for _, line := range strings.Split(gwScrape(t, httpAddr), "\n") {
		if strings.HasPrefix(line, "ortbus_worker_heartbeat_age_seconds{") && strings.Contains(line, `worker="`+worker+`"`) {
			f := strings.Fields(line)
			s, err := strconv.ParseFloat(f[len(f)-1], 64)
			if err != nil {
				t.Fatalf("metrics line %q: %v", line, err)
			}
			return time.Duration(s * float64(time.Second)), true
		}
	}
	return 0, false
}

// gwScrape returns the text of GET /metrics.
func gwScrape(t testing.TB, httpAddr string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+httpAddr+"/metrics", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("GET /metrics: %v", err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /metrics: %d %v", resp.StatusCode, err)
	}
	return string(body)
}

func gwMetricKey(op, class, pool, model, code string) string {
	return "op=" + op + ",class=" + class + ",pool=" + pool + ",model=" + model + ",code=" + code
}

// gwChildPIDs lists the processes whose parent is pid (from /proc).
func gwChildPIDs(t testing.TB, pid int) []int {
	t.Helper()
	ents, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	var out []int
	for _, e := range ents {
		n, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue // gone meanwhile
		}
		// pid (comm) state ppid ...: comm may hold spaces, so split after the last ')'.
		s := string(b)
		i := strings.LastIndexByte(s, ')')
		if i < 0 {
			continue
		}
		f := strings.Fields(s[i+1:])
		if len(f) > 1 {
			if ppid, _ := strconv.Atoi(f[1]); ppid == pid {
				out = append(out, n)
			}
		}
	}
	return out
}

// gwProcessGone reports whether pid no longer exists (or is a zombie).
func gwProcessGone(pid int) bool {
	b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
	if errors.Is(err, os.ErrNotExist) {
		return true
	}
	if err != nil {
		return false
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	f := strings.Fields(s[i+1:])
	return len(f) > 0 && f[0] == "Z"
}
