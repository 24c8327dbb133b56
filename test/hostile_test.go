package test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"iter"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/ortbus/ortbus/codec"
	"github.com/ortbus/ortbus/config"
	"github.com/ortbus/ortbus/internal/testkit/hostile"
	"github.com/ortbus/ortbus/internal/testkit/testenv"
	"github.com/ortbus/ortbus/models/onnxgen"
	"github.com/ortbus/ortbus/subjects"
)

// runHostile is the test of issue 10 item 9: a real stack — one gateway with its embedded
// NATS and HTTP API, supervising a pool on ONNX Runtime 1.30.0 (fast) and one on 1.24.3
// (bulk) — takes well over 10,000 generated hostile messages (internal/testkit/hostile) on every
// subject an ortbus process subscribes to and on every HTTP route, with good requests
// interleaved, and must come out of it unchanged: the same gateway and worker processes,
// every good request answered correctly, every hostile request answered exactly once with
// a contract error code (or a result, when a mutation happens to stay valid), bounded
// gateway memory, /metrics scrapable throughout, and no file written outside the spool.
//
// A crash does not end the run: the stack is restarted (up to hostileMaxRestarts times)
// so that one run reports every attack that breaks something; the test fails all the same.
func runHostile(t *testing.T) {
	h := newHostileRun(t)
	h.stack = h.start(t)
	defer h.finished.Store(true) // what the cleanups do to the stack is no crash
	first := h.stack
	t.Logf("stack: gateway %s pid %d, workers %v, http %s", first.gwID, first.pid, first.workers, first.http)
	h.before = h.snapshot(t)

	// The three regressions named in the issue, first, each on a live stack. (Not
	// subtests: a restart of a crashed stack must belong to this test, not to a subtest.)
	h.regressionClassFF(t)
	h.regressionCandidates(t)
	h.regressionHeartbeatUTF8(t)

	h.flood(t)
	h.report(t)
}

const (
	hostileInFlight     = 32               // concurrent hostile requests
	hostileReplyWait    = 15 * time.Second // a request with no reply within this is UNANSWERED
	hostileDupWait      = 2 * time.Second  // replies are still counted this long after the last one
	hostileGoodEvery    = 200              // one good request after this many hostile ones
	hostileMaxRestarts  = 40               // restarts of a crashed stack before the run gives up (a restart takes ~1 s)
	hostileRSSBound     = 256 << 20        // bound on the gateway's RSS growth
	hostileScrapeEvery  = 500 * time.Millisecond
	hostileAbortUnanswd = 400 // stop sending after this many unanswered requests (a wedged stack)
	hostileFakeWorker   = "x"
	hostileFakeGateway  = "hostile-gw"
)

// hostileRun is the state of one TestHostile run.
type hostileRun struct {
	t        *testing.T
	base     string // the test's directory (symlinks resolved)
	root     string // the allowed root
	spool    string // the spool (inside root)
	store    string // the embedded server's JetStream directory
	outside  string // a directory outside the allowed roots
	cfgDir   string
	cfg      string
	images   map[string]string // colour -> path
	outPaths []string          // out_path attack targets that must not be created
	feature  codec.FloatVec    // a real CCIP feature, for compare samples

	stack    *hstack
	stackMu  sync.Mutex
	restarts int

	seq      atomic.Int64
	pending  sync.Map // key -> *hreq
	others   sync.Map // HTTP requests in flight and recent publications, for crash suspects
	finished atomic.Bool

	mu       sync.Mutex
	stats    map[string]*hStats // by surface name
	order    []string           // surface names in first-use order
	crashes  []hCrash
	failures []string // good request failures, bad replies, ... (capped in the report)
	nfail    map[string]int
	scrapes  struct{ ok, failed int }
	scrapeEr []string
	// statusNotes counts HTTP error answers whose status is not their code's Status().
	statusNotes map[string]int
	// codes counts the error codes of the answers (NATS and HTTP); internalEx keeps a few
	// internal answers (an internal answer to bad input is an unhandled case).
	codes      map[codec.Code]int
	internalEx []string
	before     map[string]hFileState
	goodSent   int
	goodOK     int
}

type hStats struct {
	sent, ok, errCode, unanswered, dup, bad, noResp, sendErr, published, lost int
	rss                                                                       int64 // the gateway's RSS when the surface's last message was sent
}

type hCrash struct {
	what     string // "gateway pid N exited: ..." or "worker W pid N gone"
	suspects []string
	log      string
	sig      string // the panic's first line and first ortbus frame
}

type hFileState struct {
	size  int64
	mtime time.Time
	mode  fs.FileMode
}

// hstack is one running gateway with its workers.
type hstack struct {
	g       *gatewayProc
	gwID    string
	http    string
	pid     int
	workers map[string]int    // worker id -> pid
	byPool  map[string]string // pool -> its worker's id
	prefix  string            // the reply inbox prefix
	sub     *nats.Subscription
	down    chan struct{} // closed when a crash of this stack is recorded
	once    sync.Once
	rss0    int64
}

// hreq is one request waiting for its reply.
type hreq struct {
	key     string
	surface string
	name    string
	sent    time.Time
	replies atomic.Int32
	first   chan *nats.Msg
}

func newHostileRun(t *testing.T) *hostileRun {
	base, err := filepath.EvalSymlinks(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	h := &hostileRun{t: t, base: base, stats: map[string]*hStats{}, nfail: map[string]int{}, images: map[string]string{}, statusNotes: map[string]int{}, codes: map[codec.Code]int{}}
	h.root = filepath.Join(base, "root")
	h.spool = filepath.Join(h.root, "spool")
	h.outside = filepath.Join(base, "outside")
	h.cfgDir = filepath.Join(base, "cfg")
	h.store = t.TempDir() // JetStream's files: outside the tree watched for writes
	for _, d := range []string{h.root, h.spool, h.outside, h.cfgDir, filepath.Join(h.root, "dir.png")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for _, c := range []string{"red", "blue", "green"} {
		h.images[c] = colourPNG(t, h.root, c)
	}
	red, _ := os.ReadFile(h.images["red"])
	hMust(t, os.WriteFile(filepath.Join(h.root, "decoy.png"), red, 0o644))
	hMust(t, os.WriteFile(filepath.Join(h.outside, "secret.png"), red, 0o644))
	hMust(t, os.Symlink(h.outside, filepath.Join(h.root, "link-out")))
	hMust(t, os.Symlink(filepath.Join(h.outside, "secret.png"), filepath.Join(h.root, "link-secret.png")))
	hMust(t, syscall.Mkfifo(filepath.Join(h.root, "fifo.png"), 0o600))
	h.outPaths = []string{
		filepath.Join(h.outside, "written.png"),
		filepath.Join(h.root, "written-outside-spool.png"),
		filepath.Join(h.root, "link-out", "via-link.png"),
		filepath.Join(h.spool, "..", "..", "outside", "dotdot.png"),
		filepath.Join(h.outside, "nul.png"),
	}
	h.cfg = h.writeConfig(t)
	return h
}

func hMust(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// writeConfig writes the stack's config: embedded NATS with JetStream (the job API and
// failover's answers bucket), pools fast (1.30.0: urgent, interactive; tagger, CCIP,
// detector, segmenter, tiny) and bulk (1.24.3: interactive, batch; tagger, CCIP; dynamic
// batching), as deploy/local.toml has them.
func (h *hostileRun) writeConfig(t *testing.T) string {
	md := testenv.Models(t)
	dur := func(d time.Duration) config.Duration { return config.Duration(d) }
	c := &config.Config{
		NATS:     config.NATS{Embedded: true, Listen: "127.0.0.1:0", StoreDir: h.store},
		Gateway:  config.Gateway{ShutdownGrace: dur(3 * time.Second), Failover: true},
		Health:   config.Health{HeartbeatInterval: dur(gwHeartbeat), MissCount: gwMissCount},
		Security: config.Security{AllowedRoots: []string{h.root}, SpoolDir: h.spool},
		Classes: map[string]*config.Class{
			"urgent":      {Chain: []string{"fast"}, Timeout: dur(2 * time.Second), MaxTimeout: dur(4 * time.Second)},
			"interactive": {Chain: []string{"fast", "bulk"}, Timeout: dur(8 * time.Second), MaxTimeout: dur(10 * time.Second), QueueBound: 512},
			"batch":       {Chain: []string{"bulk"}, Timeout: dur(8 * time.Second), MaxTimeout: dur(10 * time.Second)},
		},
		Pools: map[string]*config.Pool{
			"fast": {Runtime: testenv.RuntimeLib(t, "1.30.0"), Threads: 1, Classes: []string{"urgent", "interactive"},
				Models: []string{"tagger", "ccip", "detector", "segmenter", "tiny"}},
			"bulk": {Runtime: testenv.RuntimeLib(t, "1.24.3"), Threads: 1, Classes: []string{"interactive", "batch"},
				Models: []string{"tagger", "ccip"}, MaxBatch: 4, MaxDelay: dur(5 * time.Millisecond)},
		},
		Models: map[string]*config.Model{
			"tagger":    {Kind: config.KindTaggerPixAI, Dir: filepath.Join(md, onnxgen.TaggerDir)},
			"ccip":      {Kind: config.KindCCIP, Dir: filepath.Join(md, onnxgen.CCIPDir)},
			"detector":  {Kind: config.KindDetect, Dir: filepath.Join(md, onnxgen.DetectorDir)},
			"segmenter": {Kind: config.KindSegment, Dir: filepath.Join(md, onnxgen.SegmenterDir)},
			"tiny":      {Kind: config.KindRaw, Dir: filepath.Join(md, onnxgen.TinyDir)},
		},
	}
	c.SetOrder("classes", "urgent", "interactive", "batch")
	c.SetOrder("pools", "fast", "bulk")
	c.SetOrder("models", "tagger", "ccip", "detector", "segmenter", "tiny")
	return writeConfigFile(t, filepath.Join(h.cfgDir, "gateway.toml"), c)
}

// start starts a stack and waits until both pools have a live worker.
func (h *hostileRun) start(t *testing.T) *hstack {
	t0 := time.Now()
	// Each stack in a directory of its own, so that each keeps its own gateway.log.
	dir := filepath.Join(h.cfgDir, strconv.Itoa(h.restarts))
	hMust(t, os.MkdirAll(dir, 0o755))
	cfg := filepath.Join(dir, "gateway.toml")
	data, err := os.ReadFile(h.cfg)
	hMust(t, err)
	hMust(t, os.WriteFile(cfg, data, 0o644))
	g := startGateway(t, cfg)
	t.Cleanup(func() { // runs before startGateway's own, which prints the log on failure
		if t.Failed() {
			g.stop(t)
			hTrimLog(filepath.Join(dir, "gateway.log"))
		}
	})
	g.waitLive(t, "fast", 1)
	g.waitLive(t, "bulk", 1)
	st := g.status(t)
	s := &hstack{g: g, gwID: st.Gateway, http: g.Ready.HTTP, pid: g.lp.PID(), workers: map[string]int{}, byPool: map[string]string{}, down: make(chan struct{})}
	for _, w := range st.Workers {
		if w.State == codec.StateReady {
			s.workers[w.Worker] = w.PID
			s.byPool[w.Pool] = w.Worker
		}
	}
	// The status's pids are the gateway's children.
	kids := gwChildPIDs(t, s.pid)
	for id, pid := range s.workers {
		if !slices.Contains(kids, pid) {
			t.Errorf("worker %s: status pid %d is not a child of the gateway (children %v)", id, pid, kids)
		}
	}
	s.prefix = nats.NewInbox()
	sub, err := g.NC.Subscribe(s.prefix+".>", h.onReply(s.prefix))
	hMust(t, err)
	hMust(t, sub.SetPendingLimits(-1, -1))
	hMust(t, g.NC.Flush())
	s.sub = sub
	// The spy: an answer (a message without a reply subject of its own) on any of the
	// envelope attack's reply subjects is a failure.
	for _, b := range hostileBadReplies {
		if len(b) > subjects.MaxReplyLen || strings.Contains(b, ">") {
			continue // checked by the gateway's count; not a subject to subscribe to
		}
		spy, err := g.NC.Subscribe(b, func(m *nats.Msg) {
			if m.Reply == "" {
				h.fail("bad reply published", fmt.Sprintf("a message of %d bytes was published on the attacker's reply subject %s", len(m.Data), m.Subject))
			}
		})
		hMust(t, err)
		hMust(t, spy.SetPendingLimits(-1, -1))
	}
	hMust(t, g.NC.Flush())
	if h.feature == nil {
		h.feature = h.realFeature(t, g)
	}
	s.rss0 = hVMRSS(s.pid)
	go h.watch(s)
	t.Logf("stack up in %v: gateway %s pid %d rss %d MiB", time.Since(t0).Round(time.Millisecond), s.gwID, s.pid, s.rss0>>20)
	return s
}

// realFeature embeds the red image once, for valid compare samples.
func (h *hostileRun) realFeature(t *testing.T, g *gatewayProc) codec.FloatVec {
	r := g.call(t, "embed", &codec.Request{Path: h.images["red"]}, gwReplyBound)
	if r.Err != nil {
		t.Fatalf("embed: %s: %s", r.Err.Code, r.Err.Message)
	}
	var er codec.EmbedReply
	hMust(t, codec.Unmarshal(r.Msg.Data, &er))
	if len(er.Embedding) == 0 {
		t.Fatal("embed: empty embedding")
	}
	return er.Embedding
}

// onReply counts every reply on a stack's inbox, by request key.
func (h *hostileRun) onReply(prefix string) nats.MsgHandler {
	return func(m *nats.Msg) {
		key := strings.TrimPrefix(m.Subject, prefix+".")
		v, ok := h.pending.Load(key)
		if !ok {
			h.fail("stray", fmt.Sprintf("a reply on %s for no request", m.Subject))
			return
		}
		r := v.(*hreq)
		if r.replies.Add(1) == 1 {
			r.first <- m
		}
	}
}

// watch records the death of the stack's gateway or of one of its workers.
func (h *hostileRun) watch(s *hstack) {
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-s.g.lp.Exited():
			h.crash(s, fmt.Sprintf("gateway %s pid %d exited (%v)", s.gwID, s.pid, s.g.lp.State()))
			return
		case <-s.down:
			return
		case <-tick.C:
			for id, pid := range s.workers {
				if gwProcessGone(pid) {
					// Workers die with their gateway: a gateway crash is the gateway's.
					select {
					case <-s.g.lp.Exited():
						h.crash(s, fmt.Sprintf("gateway %s pid %d exited (%v)", s.gwID, s.pid, s.g.lp.State()))
					case <-time.After(time.Second):
						h.crash(s, fmt.Sprintf("worker %s pid %d gone", id, pid))
					}
					return
				}
			}
		}
	}
}

// crash records a crash of stack s (once) with the requests in flight as suspects.
func (h *hostileRun) crash(s *hstack, what string) {
	if h.finished.Load() {
		return
	}
	s.once.Do(func() {
		var suspects []string
		now := time.Now()
		h.pending.Range(func(_, v any) bool {
			r := v.(*hreq)
			if r.replies.Load() == 0 && now.Sub(r.sent) < 3*time.Second {
				suspects = append(suspects, r.surface+" "+r.name)
			}
			return true
		})
		h.others.Range(func(_, v any) bool {
			r := v.(*hreq)
			if now.Sub(r.sent) < time.Second || strings.HasPrefix(r.surface, "http") {
				suspects = append(suspects, r.surface+" "+r.name)
			}
			return true
		})
		sort.Strings(suspects)
		time.Sleep(300 * time.Millisecond) // let the log catch up
		h.mu.Lock()
		log := hPanicOf(s.g.log())
		h.crashes = append(h.crashes, hCrash{what: what, suspects: suspects, log: log, sig: hCrashSig(what, log)})
		h.mu.Unlock()
		close(s.down)
	})
}

// hCrashSig names a crash by its process kind, the panic's first line (without its
// addresses) and the first frame of ortbus code.
func hCrashSig(what, log string) string {
	proc := "gateway"
	if strings.HasPrefix(what, "worker") {
		proc = "worker"
	}
	lines := strings.Split(log, "\n")
	first := strings.TrimSpace(lines[0])
	if !strings.HasPrefix(first, "panic:") && !strings.HasPrefix(first, "fatal error:") {
		// No panic: the last warning about a connection or a kill says what happened.
		for i := len(lines) - 1; i >= 0; i-- {
			l := lines[i]
			if j := strings.Index(l, "msg="); j >= 0 && (strings.Contains(l, "nats error") || strings.Contains(l, "killing") || strings.Contains(l, "exited")) {
				return proc + ": " + l[j:]
			}
		}
		return proc + ": no panic in the log"
	}
	frame := ""
	for _, l := range lines {
		if strings.HasPrefix(l, "github.com/ortbus/ortbus/") && strings.Contains(l, "(") {
			frame = l[:strings.LastIndex(l, "(")]
			break
		}
	}
	if frame == "" {
		for _, l := range lines {
			if strings.Contains(l, "/ortbus") && strings.Contains(l, ".go:") {
				frame = strings.TrimSpace(l)
				break
			}
		}
	}
	return proc + ": " + first + " at " + frame
}

// hPanicOf returns the panic and the first frames of its goroutine from a log, or the
// log's last warnings and errors (long lines cut).
func hPanicOf(log string) string {
	i := strings.Index(log, "panic:")
	if i < 0 {
		i = strings.Index(log, "fatal error:")
	}
	if i < 0 {
		var keep []string
		for _, l := range strings.Split(strings.TrimSpace(log), "\n") {
			if strings.Contains(l, "level=WARN") || strings.Contains(l, "level=ERROR") {
				keep = append(keep, hCut(l, 300))
			}
		}
		return strings.Join(keep[max(0, len(keep)-10):], "\n")
	}
	lines := strings.Split(log[i:], "\n")
	for k := range lines {
		lines[k] = hCut(lines[k], 300)
	}
	return strings.Join(lines[:min(len(lines), 24)], "\n")
}

func hCut(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + fmt.Sprintf("…(%d bytes)", len(s))
}

// hTrimLog shortens a gateway log for the helper that prints it when the test fails:
// long lines cut, at most its first and last 100 lines.
func hTrimLog(path string) {
	b, err := os.ReadFile(path)
	if err != nil {
		return
	}
	lines := strings.Split(string(b), "\n")
	for i := range lines {
		lines[i] = hCut(lines[i], 600)
	}
	if len(lines) > 200 {
		lines = append(append(lines[:100:100], fmt.Sprintf("…(%d lines)", len(lines)-200)), lines[len(lines)-100:]...)
	}
	os.WriteFile(path, []byte(strings.Join(lines, "\n")), 0o644)
}

// live returns the current stack, restarting a crashed one while restarts are left; nil
// when the run must give up.
func (h *hostileRun) live(t *testing.T) *hstack {
	h.stackMu.Lock()
	defer h.stackMu.Unlock()
	s := h.stack
	select {
	case <-s.down:
	default:
		return s
	}
	if h.restarts >= hostileMaxRestarts {
		return nil
	}
	h.restarts++
	t.Logf("restarting the stack after a crash (%d of %d)", h.restarts, hostileMaxRestarts)
	s.g.lp.Kill() // a worker died: start clean
	h.stack = h.start(t)
	return h.stack
}

func (h *hostileRun) fail(kind, msg string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.nfail[kind]++
	if h.nfail[kind] <= 12 {
		h.failures = append(h.failures, kind+": "+msg)
	}
}

func (h *hostileRun) surface(name string) *hStats {
	s := h.stats[name]
	if s == nil {
		s = &hStats{}
		h.stats[name] = s
		h.order = append(h.order, name)
	}
	return s
}

func (h *hostileRun) count(name string, f func(*hStats)) {
	h.mu.Lock()
	f(h.surface(name))
	h.mu.Unlock()
}

// ---- the surfaces ----

type hSurfaceKind int

const (
	hNATSRequest hSurfaceKind = iota // request with a reply inbox: must be answered exactly once
	hNATSPublish                     // fire and forget (heartbeats, claims, cancels, gateway beats and journals)
	hHTTPRoute
	// hNATSBadReply: a request whose reply subject is no requester's inbox
	// (hostileBadReplies): dropped unanswered, nothing published on it (the spy).
	hNATSBadReply
)

// hostileBadReplies are the reply subjects of the envelope attack: each must be dropped
// (subjects.CheckReply), never published to. The spy subscribes to each but the long one.
var hostileBadReplies = []string{
	"$JS.API.STREAM.PURGE.ORTBUS_JOB_ITEMS",
	"$JS.API.STREAM.DELETE.ORTBUS_JOB_RESULTS",
	"$KV.ortbus_jobs.h-job",
	"ortbus.gw.hostile-spy.log",
	"infer.fast.urgent.hostile-spy",
	"app.events",
	"_INBOX_evil.x",                                // a prefix no deployment configures
	"_INBOX." + strings.Repeat("long.", 780) + "x", // ~3.9 KB: the control line
}

// hostileEnvelopeHeaders are headers a request may carry that it chose itself: a forged
// requester identity, a resend mark, a header of 4 KiB. The request is still answered
// exactly once, on its own reply subject.
var hostileEnvelopeHeaders = []nats.Header{
	{"Nats-Request-Info": {`{"acc":"EVIL","user":"root"}`}},
	{codec.HeaderResend: {"1"}},
	{"X-Hostile": {strings.Repeat("h", 4<<10)}},
	{"Nats-Request-Info": {strings.Repeat("{", 1<<10)}, codec.HeaderResend: {"\x00"}},
}

// hSurface is one attack surface and the mutations it gets.
type hSurface struct {
	name    string
	kind    hSurfaceKind
	subject func(s *hstack) string // NATS
	method  string                 // HTTP
	path    string                 // HTTP
	op      string                 // the op whose reply a success must decode as ("" = any map)
	stats   bool                   // a success must decode as a heartbeat (worker stats)
	noResp  bool                   // no responders is the expected answer
	muts    iter.Seq[hostile.Mutation]
}

// hJob is one message to send.
type hJob struct {
	sd   *hSurface
	m    hostile.Mutation
	good string // colour of a good tag request ("" for a hostile one)
	// resend: the request carries Ortbus-Resend, so a notice (Ortbus-Held) or the answer
	// the gateway kept for an earlier request of its id and sender is a right answer too.
	resend bool
}

// hThin yields every nth mutation of sample's stream, and the first of each category;
// the bodies of the others are never built (hostile's Select).
func hThin(t *testing.T, sample any, o hostile.Options, n int) iter.Seq[hostile.Mutation] {
	g, err := hostile.New(sample, o)
	if err != nil {
		t.Fatalf("hostile sample %T: %v", sample, err)
	}
	return func(yield func(hostile.Mutation) bool) {
		seen := map[hostile.Category]bool{}
		keep := func(i int, _ string, cat hostile.Category) bool {
			k := n <= 1 || i%n == 0 || !seen[cat]
			seen[cat] = true
			return k
		}
		for m := range g.Select(keep) {
			if !yield(m) {
				return
			}
		}
	}
}

func hF64(v float64) *float64 { return &v }

// surfaces lists every subject an ortbus process subscribes to, and every HTTP route.
func (h *hostileRun) surfaces(t *testing.T, s *hstack) []*hSurface {
	maxBody := int(s.g.NC.MaxPayload()) - 4096
	red := h.images["red"]
	pathAttacks := append(slices.Clone(h.outPaths),
		filepath.Join(h.root, "decoy.png"),               // an existing file
		filepath.Join(h.root, "link-secret.png"),         // a symlink out of the roots
		filepath.Join(h.root, "fifo.png"),                // a FIFO
		filepath.Join(h.root, "dir.png"),                 // a directory
		filepath.Join(h.root, "..", "outside", "x.png"),  // .. out of the root
		filepath.Join(h.outside, "secret.png"),           // outside the roots
		h.root+"/../outside/secret.png",                  // not clean
		filepath.Join(h.spool, "nul\x00.png"),            // NUL
		"spool/relative.png",                             // relative
		filepath.Join(h.root, "link-out", "secret.png"),  // through a symlinked directory
		filepath.Join(h.spool, strings.Repeat("n", 300)), // a name over NAME_MAX
	)
	forge := map[string][]string{"worker": {s.byPool["fast"], s.byPool["bulk"]}, "pool": {"bulk", "fast", "nopool"}, "gateway": {s.gwID}, "id": {"h-someone-else"}, "job": {"h-job", "h-none"}}
	o := hostile.Options{Seed: 10, MaxBody: maxBody, Forge: forge, Paths: pathAttacks}
	oShallow := o
	oShallow.FieldDepth = 1
	oHTTP := o
	oHTTP.MaxBody = 4 << 20
	fastW, bulkW := s.byPool["fast"], s.byPool["bulk"]

	samples := map[string]any{
		subjects.OpTag: &codec.Request{ID: "h-tag", Path: red, Class: "interactive", Model: "tagger", TimeoutMS: 5000,
			Thresholds: &codec.Thresholds{General: hF64(0.5), Character: hF64(0.9)}},
		subjects.OpEmbed:   &codec.Request{ID: "h-embed", Path: red, Model: "ccip", Class: "batch"},
		subjects.OpCompare: &codec.Request{Class: "interactive", Feature: h.feature, Candidates: []codec.FloatVec{h.feature, h.feature}},
		subjects.OpDetect:  &codec.Request{Path: red, Conf: hF64(0.25), IoU: hF64(0.7), Pool: "fast"},
		subjects.OpSegment: &codec.Request{Path: red, OutPath: filepath.Join(h.spool, "hostile-out.png"), Class: "urgent"},
		subjects.OpInfer: &codec.Request{Model: "tiny", Inputs: map[string]*codec.Tensor{"x": {Type: "float32", Shape: []int64{1, onnxgen.TinyDim},
			Data: make([]byte, 4*onnxgen.TinyDim)}}, Outputs: []string{"y"}},
		subjects.OpCancel: &codec.Cancel{ID: "h-cancel"},
		subjects.OpStatus: &codec.Request{ID: "h-status", Class: "interactive"},
		subjects.OpHealth: &codec.Request{ID: "h-health", Pool: "fast"},
		subjects.OpLease:  &codec.LeaseRequest{Action: codec.LeaseAcquire, Device: "cpu", Bytes: 1 << 20, Class: "interactive", TTLMS: 500, Holder: "h"},
		// A resume (without for_ms no mutation can pause a class for long: a pause must
		// say how long, and a paused class would hold the rest of the attack back).
		subjects.OpPause: &codec.PauseRequest{Action: codec.PauseResume, Class: "batch"},
	}
	apiThin := map[string]int{subjects.OpTag: 1, subjects.OpCompare: 1, subjects.OpSegment: 1, subjects.OpInfer: 2, subjects.OpEmbed: 3,
		subjects.OpDetect: 3, subjects.OpCancel: 2, subjects.OpStatus: 6, subjects.OpHealth: 6, subjects.OpLease: 3, subjects.OpPause: 2}

	var out []*hSurface
	for _, op := range subjects.Ops {
		subj := "ortbus.v1." + op
		out = append(out, &hSurface{name: "nats " + subj, kind: hNATSRequest, subject: func(*hstack) string { return subj }, op: op,
			muts: hThin(t, samples[op], o, apiThin[op])})
	}
	item := func(op string, class string) *codec.WorkItem {
		return &codec.WorkItem{Request: codec.Request{ID: "h-item", Path: red, Model: "tagger", Class: class, TimeoutMS: 5000}, Op: op,
			DeadlineUnixMS: time.Now().Add(time.Hour).UnixMilli(), Attempt: 1, ClaimTo: "ortbus.claim." + hostileFakeGateway,
			EnqueuedUnixUS: time.Now().UnixMicro()}
	}
	for _, pc := range []struct {
		pool, class string
		n           int
	}{{"fast", "interactive", 1}, {"fast", "urgent", 4}, {"bulk", "interactive", 3}, {"bulk", "batch", 3}} {
		subj := "infer." + pc.pool + "." + pc.class
		out = append(out, &hSurface{name: "nats " + subj, kind: hNATSRequest, subject: func(*hstack) string { return subj },
			muts: hThin(t, item("tag", pc.class), o, pc.n)})
	}
	hb := &codec.Heartbeat{V: 1, Worker: hostileFakeWorker, Pool: "fast", Host: "hostile", PID: 1, Seq: 1, SentMS: time.Now().UnixMilli(),
		State: codec.StateReady, Runtime: "1.30.0", EP: "cpu", Device: "cpu", IntervalMS: gwHeartbeat.Milliseconds(),
		Classes: []string{"interactive"}, Models: []codec.ModelStatus{{Name: "tagger", Kind: "tagger-pixai", Loaded: true, PeakBytes: 1 << 20}},
		Slots: 1, Queued: map[string]int{"interactive": 0}, Running: map[string]int{}, Held: []string{}}
	hbSubj := func(pool, worker string) func(*hstack) string {
		return func(*hstack) string { return "ortbus.hb." + pool + "." + worker }
	}
	out = append(out,
		&hSurface{name: "nats ortbus.hb.fast.x", kind: hNATSPublish, subject: hbSubj("fast", hostileFakeWorker), muts: hThin(t, hb, oShallow, 2)},
		&hSurface{name: "nats ortbus.hb.bulk.x (forged pool)", kind: hNATSPublish, subject: hbSubj("bulk", hostileFakeWorker), muts: hThin(t, hb, oShallow, 12)},
		&hSurface{name: "nats ortbus.hb.fast.<worker> (forged body)", kind: hNATSPublish, subject: hbSubj("fast", fastW), muts: hThin(t, hb, oShallow, 12)},
	)
	claim := &codec.Claim{ID: "h-claim", Worker: fastW, Pool: "fast", Attempt: 1, State: codec.ClaimTaken}
	out = append(out, &hSurface{name: "nats ortbus.claim.<gateway>", kind: hNATSPublish, subject: func(s *hstack) string { return "ortbus.claim." + s.gwID },
		muts: hThin(t, claim, o, 2)})
	out = append(out, &hSurface{name: "nats ortbus.cancel", kind: hNATSPublish, subject: func(*hstack) string { return subjects.Cancel },
		muts: hThin(t, &codec.Cancel{ID: "h-cancel"}, o, 1)})
	verdictSubj := "ortbus.worker." + fastW + ".verdict"
	out = append(out, &hSurface{name: "nats " + verdictSubj, kind: hNATSPublish, subject: func(*hstack) string { return verdictSubj },
		muts: hThin(t, &codec.ClaimVerdict{ID: "h-verdict", Attempt: 1, Own: true}, o, 2)})
	for _, w := range []string{fastW, bulkW} {
		subj := "ortbus.worker." + w + ".stats"
		out = append(out, &hSurface{name: "nats " + subj, kind: hNATSRequest, subject: func(*hstack) string { return subj }, stats: true,
			muts: hThin(t, &codec.Request{ID: "h-stats"}, o, 6)})
	}
	out = append(out, &hSurface{name: "nats ortbus.worker.hostile-none.drain", kind: hNATSRequest, noResp: true,
		subject: func(*hstack) string { return "ortbus.worker.hostile-none.drain" }, muts: hThin(t, &codec.Request{ID: "h-drain"}, o, 12)})
	beat := &codec.GatewayBeat{Gateway: hostileFakeGateway, Seq: 1, IntervalMS: gwHeartbeat.Milliseconds()}
	out = append(out,
		&hSurface{name: "nats ortbus.gw.<fake>.hb", kind: hNATSPublish, subject: func(*hstack) string { return "ortbus.gw." + hostileFakeGateway + ".hb" },
			muts: hThin(t, beat, o, 2)},
		&hSurface{name: "nats ortbus.gw.<gateway>.hb (forged)", kind: hNATSPublish, subject: func(s *hstack) string { return "ortbus.gw." + s.gwID + ".hb" },
			muts: hThin(t, beat, o, 6)},
	)
	// The envelope: valid and mutated bodies on the gateway's and a worker's subjects,
	// each with a reply subject that is no requester's inbox.
	for _, b := range []struct {
		subj   string
		sample any
	}{
		{"ortbus.v1.tag", samples[subjects.OpTag]},
		{"ortbus.v1.lease", samples[subjects.OpLease]},
		{"ortbus.v1.job.list", &codec.JobRef{}},
		{"ortbus.ops.cancel", &codec.Cancel{ID: "h-cancel"}},
		{"infer.fast.interactive", item("tag", "interactive")},
		{"ortbus.worker." + fastW + ".stats", &codec.Request{ID: "h-stats"}},
	} {
		subj := b.subj
		out = append(out, &hSurface{name: "nats " + subj + " (bad reply subject)", kind: hNATSBadReply, subject: func(*hstack) string { return subj },
			muts: hThin(t, b.sample, o, 40)})
	}
	// The job API (JetStream in the stack's store): every verb's body mutated.
	for _, j := range []struct {
		op     string
		sample any
		thin   int
	}{
		{subjects.OpJobSubmit, &codec.JobSubmit{Job: "h-job", Op: "tag", Items: []string{red}, Options: &codec.Request{TimeoutMS: 5000}}, 3},
		{subjects.OpJobStatus, &codec.JobRef{Job: "h-job"}, 6},
		{subjects.OpJobCancel, &codec.JobRef{Job: "h-none"}, 6},
		{subjects.OpJobPause, &codec.JobRef{Job: "h-none"}, 6},
		{subjects.OpJobResume, &codec.JobRef{Job: "h-none"}, 6},
		{subjects.OpJobResults, &codec.JobResultsRequest{Job: "h-job", From: 1, Limit: 10}, 6},
	} {
		subj := "ortbus.v1." + j.op
		out = append(out, &hSurface{name: "nats " + subj, kind: hNATSRequest, subject: func(*hstack) string { return subj },
			muts: hThin(t, j.sample, o, j.thin)})
	}
	// HTTP: every op's POST route, the GET routes, and unknown ops.
	for _, op := range subjects.Ops {
		n := 6
		if op == subjects.OpTag || op == subjects.OpSegment || op == subjects.OpCompare {
			n = 2
		}
		out = append(out, &hSurface{name: "http POST /v1/" + op, kind: hHTTPRoute, method: http.MethodPost, path: "/v1/" + op, op: op,
			muts: hThin(t, samples[op], oHTTP, n)})
	}
	for _, j := range []struct {
		verb   string
		sample any
	}{
		{"submit", &codec.JobSubmit{Job: "h-http-job", Op: "tag", Items: []string{red}}},
		{"status", &codec.JobRef{Job: "h-http-job"}},
		{"results", &codec.JobResultsRequest{Job: "h-http-job", Limit: 5}},
		{"list", &codec.JobRef{}},
	} {
		// op "job.<verb>": a result decodes as JSON, an error must carry a known code.
		out = append(out, &hSurface{name: "http POST /v1/job/" + j.verb, kind: hHTTPRoute, method: http.MethodPost, path: "/v1/job/" + j.verb,
			op: "job." + j.verb, muts: hThin(t, j.sample, oHTTP, 12)})
	}
	for _, p := range []string{"/v1/status", "/v1/health", "/healthz", "/readyz", "/metrics", "/v1/snapshot", "/", "/page/page.js"} {
		out = append(out, &hSurface{name: "http GET " + p, kind: hHTTPRoute, method: http.MethodGet, path: p,
			muts: hThin(t, &codec.Request{ID: "h-get"}, oHTTP, 40)})
	}
	for _, p := range []string{"/v1/%FF", "/v1/nope", "/v1/" + strings.Repeat("o", 10<<10), "/v1/tag%00", "/v1/..%2Fstatus"} {
		out = append(out, &hSurface{name: "http POST /v1/<unknown op>", kind: hHTTPRoute, method: http.MethodPost, path: p, op: "?",
			muts: hThin(t, samples[subjects.OpTag], oHTTP, 80)})
	}
	return out
}

func hMarshal(t *testing.T, v any) []byte {
	b, err := codec.Marshal(v)
	hMust(t, err)
	return b
}

// ---- sending ----

// send sends one job on stack s and judges its answer.
func (h *hostileRun) send(s *hstack, j hJob) {
	sd := j.sd
	name := sd.name
	if j.good != "" {
		name = "good tag"
	}
	switch sd.kind {
	case hHTTPRoute:
		h.count(name, func(c *hStats) { c.sent++ })
		key := "http-" + strconv.FormatInt(h.seq.Add(1), 10)
		h.others.Store(key, &hreq{surface: name, name: j.m.Name, sent: time.Now()})
		h.sendHTTP(s, j)
		h.others.Delete(key)
		return
	case hNATSPublish:
		key := "pub-" + strconv.FormatInt(h.seq.Add(1)%64, 10) // the last 64 published
		h.others.Store(key, &hreq{surface: name, name: j.m.Name, sent: time.Now()})
		h.publish(s, j, name, "")
		if h.seq.Add(1)%64 == 0 {
			s.g.NC.FlushTimeout(5 * time.Second)
		}
		return
	case hNATSBadReply:
		n := h.seq.Add(1)
		h.publish(s, j, name, hostileBadReplies[n%int64(len(hostileBadReplies))])
		return
	}
	key := strconv.FormatInt(h.seq.Add(1), 10)
	r := &hreq{key: key, surface: name, name: j.m.Name, sent: time.Now(), first: make(chan *nats.Msg, 1)}
	h.pending.Store(key, r)
	msg := &nats.Msg{Subject: sd.subject(s), Reply: s.prefix + "." + key, Data: j.m.Body, Header: nats.Header{}}
	if n, _ := strconv.Atoi(key); j.good == "" && n%5 == 0 && int64(len(j.m.Body)+16<<10) < s.g.NC.MaxPayload() {
		// The envelope is input too: headers the sender chose, with the body (one that
		// leaves them room in the bus's max_payload).
		for k, v := range hostileEnvelopeHeaders[(n/5)%len(hostileEnvelopeHeaders)] {
			msg.Header[k] = v
		}
		j.resend = msg.Header.Get(codec.HeaderResend) != ""
	}
	if j.m.JSON {
		msg.Header.Set(codec.HeaderContentType, codec.ContentTypeJSON)
	}
	if err := s.g.NC.PublishMsg(msg); err != nil {
		h.count(name, func(c *hStats) { c.sent++; c.sendErr++ })
		h.fail("send", fmt.Sprintf("%s %s (%d bytes): %v", sd.name, j.m.Name, len(j.m.Body), err))
		return
	}
	h.count(name, func(c *hStats) { c.sent++ })
	select {
	case m := <-r.first:
		h.judge(j, name, m)
	case <-s.down:
		h.count(name, func(c *hStats) { c.lost++ })
	case <-time.After(hostileReplyWait):
		h.count(name, func(c *hStats) { c.unanswered++ })
		h.fail("unanswered", fmt.Sprintf("%s %s: no reply within %v", name, j.m.Name, hostileReplyWait))
	}
}

// publish publishes one job without waiting for an answer (reply: its reply subject, or
// none) and counts it.
func (h *hostileRun) publish(s *hstack, j hJob, name, reply string) {
	msg := &nats.Msg{Subject: j.sd.subject(s), Reply: reply, Data: j.m.Body, Header: nats.Header{}}
	if j.m.JSON {
		msg.Header.Set(codec.HeaderContentType, codec.ContentTypeJSON)
	}
	err := s.g.NC.PublishMsg(msg)
	h.count(name, func(c *hStats) {
		c.sent++
		if err != nil {
			c.sendErr++
		} else {
			c.published++
		}
	})
	if err != nil {
		h.fail("send", fmt.Sprintf("%s %s: %v", j.sd.name, j.m.Name, err))
	}
}

// judge checks one NATS reply: an error with a contract code, or a result of the op.
func (h *hostileRun) judge(j hJob, name string, m *nats.Msg) {
	sd := j.sd
	if m.Header.Get("Status") == "503" && len(m.Data) == 0 {
		if sd.noResp {
			h.count(name, func(c *hStats) { c.ok++ })
			return
		}
		h.count(name, func(c *hStats) { c.noResp++ })
		h.fail("no_responders", fmt.Sprintf("%s %s", name, j.m.Name))
		return
	}
	if j.resend && subjects.IsWork(sd.op) && (m.Header.Get(codec.HeaderHeld) != "" || m.Header.Get(codec.HeaderErrorCode) == "") {
		// A resend's notice, or a kept answer of an earlier request with its id: exactly
		// one reply is all that is checked (duplicates are counted apart).
		h.count(name, func(c *hStats) { c.ok++ })
		return
	}
	// A JSON request is answered in JSON (the contract), whether or not the reply says so.
	asJSON := j.m.JSON || m.Header.Get(codec.HeaderContentType) == codec.ContentTypeJSON
	if hc := m.Header.Get(codec.HeaderErrorCode); hc != "" {
		var e codec.Error
		err := codec.Decode(m.Data, &e, asJSON)
		switch {
		case err == nil && e.Code.Known() && strconv.Itoa(e.Code.Status()) == hc:
			if j.good != "" {
				h.fail("good", fmt.Sprintf("good tag of %s answered %s: %s", j.good, e.Code, e.Message))
				h.count(name, func(c *hStats) { c.bad++ })
				return
			}
			h.count(name, func(c *hStats) { c.errCode++ })
			h.noteCode(e.Code, name+" "+j.m.Name+": "+hCut(e.Message, 200))
		default:
			h.count(name, func(c *hStats) { c.bad++ })
			h.fail("bad_error", fmt.Sprintf("%s %s: header %s, body %q (%v, code %q)", name, j.m.Name, hc, hTrunc(m.Data), err, e.Code))
		}
		return
	}
	if j.good != "" {
		var tr codec.TagReply
		if err := codec.Unmarshal(m.Data, &tr); err != nil {
			h.fail("good", fmt.Sprintf("good tag of %s: reply %q: %v", j.good, hTrunc(m.Data), err))
			h.count(name, func(c *hStats) { c.bad++ })
			return
		}
		if why := hColourTagProblem(&tr, j.good); why != "" {
			h.fail("good", why)
			h.count(name, func(c *hStats) { c.bad++ })
			return
		}
		h.mu.Lock()
		h.goodOK++
		h.mu.Unlock()
		h.count(name, func(c *hStats) { c.ok++ })
		return
	}
	var v any
	switch {
	case sd.stats:
		v = new(codec.Heartbeat)
	case sd.op != "":
		v = codec.NewReply(sd.op)
	default:
		v = new(map[string]any)
	}
	if err := codec.Decode(m.Data, v, asJSON); err != nil {
		h.count(name, func(c *hStats) { c.bad++ })
		h.fail("bad_result", fmt.Sprintf("%s %s: a result that does not decode: %v (%q)", name, j.m.Name, err, hTrunc(m.Data)))
		return
	}
	h.count(name, func(c *hStats) { c.ok++ })
}

func hColourTagProblem(r *codec.TagReply, colour string) string {
	if s, ok := r.General[colour]; !ok || s < 0.9 {
		return fmt.Sprintf("good tag of %s: general[%s] = %v (present %v); general %v", colour, colour, s, ok, r.General)
	}
	for _, c := range onnxgen.Colours {
		if c.Name != colour {
			if s, ok := r.General[c.Name]; ok {
				return fmt.Sprintf("good tag of %s: also tagged %s (%v)", colour, c.Name, s)
			}
		}
	}
	return ""
}

func hTrunc(b []byte) string {
	if len(b) > 160 {
		return string(b[:160]) + fmt.Sprintf("…(%d bytes)", len(b))
	}
	return string(b)
}

var hostileHTTP = &http.Client{Timeout: hostileReplyWait}

// sendHTTP sends one job to an HTTP route and judges the answer.
func (h *hostileRun) sendHTTP(s *hstack, j hJob) {
	sd := j.sd
	ctx, cancel := context.WithTimeout(context.Background(), hostileReplyWait)
	defer cancel()
	url := "http://" + s.http + sd.path
	if sd.method == http.MethodGet && len(j.m.Body) < 4096 {
		// GET routes: the body, and the same bytes as a query string.
		url += "?q=" + strings.ReplaceAll(fmt.Sprintf("%x", j.m.Body), " ", "") + "&raw=%ff%00"
	}
	req, err := http.NewRequestWithContext(ctx, sd.method, url, bytes.NewReader(j.m.Body))
	if err != nil {
		h.count(sd.name, func(c *hStats) { c.sendErr++ })
		h.fail("send", fmt.Sprintf("%s %s: %v", sd.name, j.m.Name, err))
		return
	}
	if j.m.JSON {
		req.Header.Set("Content-Type", codec.ContentTypeJSON)
	} else {
		req.Header.Set("Content-Type", "application/msgpack")
	}
	resp, err := hostileHTTP.Do(req)
	if err != nil {
		select {
		case <-s.down:
			h.count(sd.name, func(c *hStats) { c.lost++ })
		default:
			h.count(sd.name, func(c *hStats) { c.unanswered++ })
			h.fail("unanswered", fmt.Sprintf("%s %s: %v", sd.name, j.m.Name, err))
		}
		return
	}
	body, err := io.ReadAll(io.LimitReader(resp.Body, 8<<20))
	resp.Body.Close()
	if err != nil {
		h.count(sd.name, func(c *hStats) { c.unanswered++ })
		h.fail("unanswered", fmt.Sprintf("%s %s: reading the answer: %v", sd.name, j.m.Name, err))
		return
	}
	st := resp.StatusCode
	switch {
	case sd.op == "?" && st >= 400 && st < 500 && !json.Valid(body):
		// An unknown route answered by the HTTP mux itself (404, 405, a redirect's end).
		h.count(sd.name, func(c *hStats) { c.errCode++ })
	case sd.op == "": // GET routes
		okStatus := st == http.StatusOK || (sd.path == "/readyz" && st == http.StatusServiceUnavailable)
		if okStatus {
			h.count(sd.name, func(c *hStats) { c.ok++ })
		} else {
			h.count(sd.name, func(c *hStats) { c.bad++ })
			h.fail("http", fmt.Sprintf("%s %s: status %d %q", sd.name, j.m.Name, st, hTrunc(body)))
		}
	case st >= 200 && st < 300:
		v := codec.NewReply(sd.op)
		if v == nil {
			v = new(map[string]any)
		}
		if err := json.Unmarshal(body, v); err != nil {
			h.count(sd.name, func(c *hStats) { c.bad++ })
			h.fail("http", fmt.Sprintf("%s %s: status %d, result does not decode: %v", sd.name, j.m.Name, st, err))
			return
		}
		h.count(sd.name, func(c *hStats) { c.ok++ })
	default:
		var e codec.Error
		if err := json.Unmarshal(body, &e); err != nil || !e.Code.Known() || st < 400 {
			h.count(sd.name, func(c *hStats) { c.bad++ })
			h.fail("http", fmt.Sprintf("%s %s: status %d, body %q (%v)", sd.name, j.m.Name, st, hTrunc(body), err))
			return
		}
		if st != e.Code.Status() {
			// A more precise HTTP status (415 for the wrong Content-Type, 413 for a body
			// over the limit) is fine; noted, not failed.
			h.mu.Lock()
			h.statusNotes[fmt.Sprintf("%d %s", st, e.Code)]++
			h.mu.Unlock()
		}
		h.count(sd.name, func(c *hStats) { c.errCode++ })
		h.noteCode(e.Code, sd.name+" "+j.m.Name+": "+hCut(e.Message, 200))
	}
}

func (h *hostileRun) noteCode(c codec.Code, what string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.codes[c]++
	if c == codec.CodeInternal && len(h.internalEx) < 10 {
		h.internalEx = append(h.internalEx, what)
	}
}

// scrape GETs /metrics every hostileScrapeEvery until stop is closed.
func (h *hostileRun) scrapeLoop(stop <-chan struct{}, done chan<- struct{}) {
	defer close(done)
	tick := time.NewTicker(hostileScrapeEvery)
	defer tick.Stop()
	for {
		select {
		case <-stop:
			return
		case <-tick.C:
		}
		h.stackMu.Lock()
		s := h.stack
		h.stackMu.Unlock()
		select {
		case <-s.down:
			continue
		default:
		}
		h.scrapeOnce(s, "periodic")
	}
}

func (h *hostileRun) scrapeOnce(s *hstack, why string) error {
	err := func() error {
		resp, err := hostileHTTP.Get("http://" + s.http + "/metrics")
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		if err != nil {
			return err
		}
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("status %d: %s", resp.StatusCode, hTrunc(b))
		}
		if !bytes.Contains(b, []byte("ortbus_queued")) {
			return fmt.Errorf("no ortbus_queued in %d bytes", len(b))
		}
		return nil
	}()
	h.mu.Lock()
	defer h.mu.Unlock()
	if err != nil {
		h.scrapes.failed++
		if len(h.scrapeEr) < 8 {
			h.scrapeEr = append(h.scrapeEr, why+": "+err.Error())
		}
	} else {
		h.scrapes.ok++
	}
	return err
}

// ---- the flood ----

func (h *hostileRun) flood(t *testing.T) {
	s := h.live(t)
	if s == nil {
		t.Fatal("no live stack left")
	}
	defs := h.surfaces(t, s)
	stopScrape, scrapeDone := make(chan struct{}), make(chan struct{})
	go h.scrapeLoop(stopScrape, scrapeDone)

	jobs := make(chan hJob)
	var wg sync.WaitGroup
	for i := 0; i < hostileInFlight; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := range jobs {
				h.stackMu.Lock()
				cur := h.stack
				h.stackMu.Unlock()
				h.send(cur, j)
			}
		}()
	}
	goodDef := &hSurface{name: "good tag", kind: hNATSRequest, subject: func(*hstack) string { return "ortbus.v1.tag" }, op: subjects.OpTag}
	colours := []string{"red", "blue", "green"}
	hostileSent := 0
	t0 := time.Now()
	aborted := ""
feed:
	for _, sd := range defs {
		for m := range sd.muts {
			if cur := h.live(t); cur == nil {
				aborted = "the stack crashed more than " + strconv.Itoa(hostileMaxRestarts) + " times"
				break feed
			}
			h.mu.Lock()
			unanswered := h.nfail["unanswered"]
			h.mu.Unlock()
			if unanswered > hostileAbortUnanswd {
				aborted = fmt.Sprintf("over %d requests unanswered", hostileAbortUnanswd)
				break feed
			}
			jobs <- hJob{sd: sd, m: m}
			hostileSent++
			if hostileSent%hostileGoodEvery == 0 {
				c := colours[(hostileSent/hostileGoodEvery)%len(colours)]
				b := hMarshal(t, &codec.Request{Path: h.images[c], Class: "interactive", Model: "tagger"})
				h.mu.Lock()
				h.goodSent++
				h.mu.Unlock()
				jobs <- hJob{sd: goodDef, good: c, m: hostile.Mutation{Name: "good-" + c, Body: b}}
			}
		}
		// The gateway's RSS once the surface's messages are out, for the table.
		h.stackMu.Lock()
		pid := h.stack.pid
		h.stackMu.Unlock()
		rss := hVMRSS(pid)
		h.count(sd.name, func(c *hStats) { c.rss = rss })
	}
	close(jobs)
	wg.Wait()
	time.Sleep(hostileDupWait) // late and second replies still count
	close(stopScrape)
	<-scrapeDone
	t.Logf("flood: %d hostile messages in %v", hostileSent, time.Since(t0).Round(time.Millisecond))
	if aborted != "" {
		t.Errorf("the flood stopped early: %s", aborted)
	}
	// Duplicates: requests answered more than once.
	h.pending.Range(func(_, v any) bool {
		r := v.(*hreq)
		if n := r.replies.Load(); n > 1 {
			h.count(r.surface, func(c *hStats) { c.dup++ })
			h.fail("duplicate", fmt.Sprintf("%s %s: %d replies", r.surface, r.name, n))
		}
		return true
	})
	// The scrape after the flood, on a stack that is still up.
	if cur := h.live(t); cur != nil {
		h.scrapeOnce(cur, "final")
		h.checkBadReplies(t, cur)
	}
}

// ---- regressions ----

func (h *hostileRun) requestOnce(t *testing.T, s *hstack, subject string, body []byte) (*nats.Msg, error) {
	key := strconv.FormatInt(h.seq.Add(1), 10)
	r := &hreq{key: key, surface: "regression", name: subject, sent: time.Now(), first: make(chan *nats.Msg, 1)}
	h.pending.Store(key, r)
	if err := s.g.NC.PublishMsg(&nats.Msg{Subject: subject, Reply: s.prefix + "." + key, Data: body}); err != nil {
		return nil, err
	}
	select {
	case m := <-r.first:
		time.Sleep(200 * time.Millisecond)
		if n := r.replies.Load(); n != 1 {
			return m, fmt.Errorf("%d replies", n)
		}
		return m, nil
	case <-s.down:
		return nil, fmt.Errorf("the stack crashed")
	case <-time.After(hostileReplyWait):
		return nil, fmt.Errorf("no reply within %v", hostileReplyWait)
	}
}

// wantBadRequest checks that a regression message was answered bad_request and the stack
// survived it.
func (h *hostileRun) wantCode(t *testing.T, s *hstack, what string, m *nats.Msg, err error, want codec.Code) {
	t.Helper()
	if err != nil {
		t.Errorf("%s: %v", what, err)
	} else if m.Header.Get(codec.HeaderErrorCode) == "" {
		t.Errorf("%s: answered a result %q, want %s", what, hTrunc(m.Data), want)
	} else {
		var e codec.Error
		if derr := codec.Unmarshal(m.Data, &e); derr != nil || e.Code != want {
			t.Errorf("%s: answered %q (%v), want %s", what, hTrunc(m.Data), derr, want)
		}
	}
	time.Sleep(300 * time.Millisecond)
	select {
	case <-s.down:
		t.Errorf("%s: the stack crashed: %s", what, h.lastCrash())
	default:
	}
}

func (h *hostileRun) lastCrash() string {
	h.mu.Lock()
	defer h.mu.Unlock()
	if len(h.crashes) == 0 {
		return "(none recorded)"
	}
	c := h.crashes[len(h.crashes)-1]
	return c.what + "\n" + c.log
}

// regressionClassFF: a 19-byte msgpack request to ortbus.v1.tag whose class is 0xff.
func (h *hostileRun) regressionClassFF(t *testing.T) {
	s := h.live(t)
	if s == nil {
		t.Fatal("no live stack")
	}
	body := []byte{0x82, 0xa5, 'c', 'l', 'a', 's', 's', 0xa1, 0xff, 0xa2, 'i', 'd', 0xa6, 'r', 'e', 'g', '-', '0', '1'}
	if len(body) != 19 {
		t.Fatalf("regression body is %d bytes", len(body))
	}
	m, err := h.requestOnce(t, s, "ortbus.v1.tag", body)
	h.wantCode(t, s, "tag with class 0xff", m, err, codec.CodeBadRequest)
}

// regressionCandidates: a 16-byte compare whose candidates array claims 4 billion
// elements, to the gateway and straight to a worker.
func (h *hostileRun) regressionCandidates(t *testing.T) {
	// The bytes (it calls them 16; with the map header they are 17).
	body := []byte{0x81, 0xaa, 'c', 'a', 'n', 'd', 'i', 'd', 'a', 't', 'e', 's', 0xdd, 0xff, 0xff, 0xff, 0xff}
	for _, subj := range []string{"ortbus.v1.compare", "infer.fast.interactive", "infer.bulk.interactive"} {
		s := h.live(t)
		if s == nil {
			t.Fatal("no live stack")
		}
		rss0 := hVMRSS(s.pid)
		m, err := h.requestOnce(t, s, subj, body)
		h.wantCode(t, s, "compare with a 4G candidates header on "+subj, m, err, codec.CodeBadRequest)
		t.Logf("%s: gateway RSS %d -> %d MiB", subj, rss0>>20, hVMRSS(s.pid)>>20)
	}
}

// regressionHeartbeatUTF8: a heartbeat on ortbus.hb.<pool>.x whose worker id is not UTF-8,
// then a /metrics scrape that must succeed.
func (h *hostileRun) regressionHeartbeatUTF8(t *testing.T) {
	s := h.live(t)
	if s == nil {
		t.Fatal("no live stack")
	}
	for _, asJSON := range []bool{false, true} {
		hb := &codec.Heartbeat{V: 1, Worker: "x\xff\xc3\x28", Pool: "fast", PID: 1, Seq: 1, State: codec.StateReady, IntervalMS: 60000,
			Classes: []string{"interactive"}, Slots: 1}
		msg := nats.NewMsg("ortbus.hb.fast.x")
		if asJSON {
			// encoding/json would write \ufffd: put the raw bytes in by hand.
			c := *hb
			c.Worker = "WORKER-ID"
			b, _ := json.Marshal(&c)
			msg.Data = bytes.Replace(b, []byte(`"WORKER-ID"`), []byte("\"x\xff\xc3\x28\""), 1)
			msg.Header.Set(codec.HeaderContentType, codec.ContentTypeJSON)
		} else {
			msg.Data = hMarshal(t, hb)
		}
		if err := s.g.NC.PublishMsg(msg); err != nil {
			t.Errorf("heartbeat: %v", err)
		}
		s.g.NC.FlushTimeout(2 * time.Second)
		time.Sleep(100 * time.Millisecond)
		if err := h.scrapeOnce(s, fmt.Sprintf("after a non-UTF-8 heartbeat (json=%v)", asJSON)); err != nil {
			t.Errorf("GET /metrics after a heartbeat whose worker id is not UTF-8 (json=%v): %v", asJSON, err)
		}
		time.Sleep(300 * time.Millisecond)
		select {
		case <-s.down:
			t.Errorf("the stack crashed: %s", h.lastCrash())
			if s = h.live(t); s == nil {
				t.Fatal("no live stack")
			}
		default:
		}
	}
}

// ---- files and memory ----

// snapshot lists every file under the test's directory except the spool and the config
// directory (where the gateway writes its log).
func (h *hostileRun) snapshot(t *testing.T) map[string]hFileState {
	out := map[string]hFileState{}
	filepath.WalkDir(h.base, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return nil
		}
		if p == h.spool || p == h.cfgDir {
			return filepath.SkipDir
		}
		fi, err := os.Lstat(p)
		if err != nil {
			return nil
		}
		out[p] = hFileState{size: fi.Size(), mtime: fi.ModTime(), mode: fi.Mode()}
		return nil
	})
	return out
}

func hVMRSS(pid int) int64 {
	b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "status"))
	if err != nil {
		return -1
	}
	for _, line := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(line, "VmRSS:") {
			f := strings.Fields(line)
			if len(f) >= 2 {
				kb, _ := strconv.ParseInt(f[1], 10, 64)
				return kb << 10
			}
		}
	}
	return -1
}

// ---- the report ----

func (h *hostileRun) report(t *testing.T) {
	h.stackMu.Lock()
	s := h.stack
	h.stackMu.Unlock()
	// Processes: the final stack's gateway and workers are the ones it started with.
	var rssAfter int64 = -1
	select {
	case <-s.down:
	default:
		rssAfter = hVMRSS(s.pid)
		if st, err := hStatusOf(s); err != nil {
			t.Errorf("status at the end: %v", err)
		} else {
			for _, w := range st.Workers {
				if pid, ok := s.workers[w.Worker]; ok && (w.PID != pid || w.State != codec.StateReady || w.Restarts != 0) {
					t.Errorf("worker %s: pid %d -> %d, state %s, restarts %d", w.Worker, pid, w.PID, w.State, w.Restarts)
				}
			}
			for id := range s.workers {
				if !slices.ContainsFunc(st.Workers, func(w codec.WorkerStatus) bool { return w.Worker == id }) {
					t.Errorf("worker %s is no longer in the status", id)
				}
			}
		}
		if s.rss0 > 0 && rssAfter > 0 && rssAfter-s.rss0 > hostileRSSBound {
			t.Errorf("gateway RSS grew by %d MiB (%d -> %d MiB), bound %d MiB", (rssAfter-s.rss0)>>20, s.rss0>>20, rssAfter>>20, hostileRSSBound>>20)
		}
	}
	// Files: nothing outside the spool changed, no out_path target exists.
	if h.before != nil {
		after := h.snapshot(t)
		for p, a := range after {
			b, ok := h.before[p]
			switch {
			case !ok:
				t.Errorf("file written outside the spool: %s (%d bytes)", p, a.size)
			case a != b:
				t.Errorf("file changed outside the spool: %s (%+v -> %+v)", p, b, a)
			}
		}
		for p := range h.before {
			if _, ok := after[p]; !ok {
				t.Errorf("file removed outside the spool: %s", p)
			}
		}
		for _, p := range h.outPaths {
			if _, err := os.Lstat(p); err == nil {
				t.Errorf("an out_path attack wrote %s", p)
			}
		}
	}

	h.mu.Lock()
	defer h.mu.Unlock()
	var tot hStats
	var lines []string
	for _, name := range h.order {
		c := h.stats[name]
		tot.sent += c.sent
		tot.ok += c.ok
		tot.errCode += c.errCode
		tot.unanswered += c.unanswered
		tot.dup += c.dup
		tot.bad += c.bad
		tot.noResp += c.noResp
		tot.sendErr += c.sendErr
		tot.published += c.published
		tot.lost += c.lost
		lines = append(lines, fmt.Sprintf("  %-46s sent %5d  result %5d  error-code %5d  published %5d  unanswered %4d  dup %3d  bad %3d  no-resp %3d  send-err %3d  lost-in-crash %3d  gateway-rss %4d MiB",
			name, c.sent, c.ok, c.errCode, c.published, c.unanswered, c.dup, c.bad, c.noResp, c.sendErr, c.lost, c.rss>>20))
	}
	hostileTotal := tot.sent - h.stats["good tag"].orZero().sent
	summary := fmt.Sprintf("HOSTILE SUMMARY: %d messages (%d hostile, %d good) on %d surfaces; answered %d (results %d, error codes %d), published %d, unanswered %d, duplicates %d, bad answers %d, no-responders %d, send errors %d, lost in crashes %d; good %d/%d correct; crashes %d (restarts %d); /metrics scrapes %d ok, %d failed; gateway RSS %d -> %d MiB",
		tot.sent, hostileTotal, h.goodSent, len(h.order), tot.ok+tot.errCode, tot.ok, tot.errCode, tot.published, tot.unanswered, tot.dup, tot.bad, tot.noResp, tot.sendErr, tot.lost,
		h.goodOK, h.goodSent, len(h.crashes), h.restarts, h.scrapes.ok, h.scrapes.failed, s.rss0>>20, rssAfter>>20)
	t.Logf("per surface:\n%s", strings.Join(lines, "\n"))
	t.Logf("error codes of the answers: %v", h.codes)
	if len(h.internalEx) > 0 {
		t.Logf("answered internal (an unhandled case?), e.g.:\n  %s", strings.Join(h.internalEx, "\n  "))
	}
	if len(h.statusNotes) > 0 {
		t.Logf("HTTP error answers whose status is not their code's Status(): %v", h.statusNotes)
	}
	t.Log(summary)
	fmt.Fprintln(os.Stderr, summary)

	if hostileTotal < 10000 {
		t.Errorf("only %d hostile messages sent, want at least 10000", hostileTotal)
	}
	// Crashes, grouped by signature: the first in full, then the suspects of each.
	var sigs []string
	bySig := map[string][]hCrash{}
	for _, c := range h.crashes {
		if _, ok := bySig[c.sig]; !ok {
			sigs = append(sigs, c.sig)
		}
		bySig[c.sig] = append(bySig[c.sig], c)
	}
	for _, sig := range sigs {
		cs := bySig[sig]
		var b strings.Builder
		fmt.Fprintf(&b, "CRASH x%d: %s\n  first: %s\n%s\n", len(cs), sig, cs[0].what, hIndent(cs[0].log))
		for i, c := range cs {
			fmt.Fprintf(&b, "  crash %d (%s): in flight (%d): %s\n", i+1, c.what, len(c.suspects), strings.Join(c.suspects[:min(len(c.suspects), 40)], "; "))
		}
		t.Error(b.String())
	}
	if h.goodOK != h.goodSent {
		t.Errorf("%d of %d good requests answered correctly", h.goodOK, h.goodSent)
	}
	if tot.unanswered+tot.dup+tot.bad+tot.noResp+tot.sendErr > 0 {
		t.Errorf("hostile requests: %d unanswered, %d answered more than once, %d badly answered, %d no responders, %d not sent", tot.unanswered, tot.dup, tot.bad, tot.noResp, tot.sendErr)
	}
	if h.scrapes.failed > 0 {
		t.Errorf("%d /metrics scrapes failed: %s", h.scrapes.failed, strings.Join(h.scrapeEr, "; "))
	}
	if len(h.failures) > 0 {
		kinds := make([]string, 0, len(h.nfail))
		for k, n := range h.nfail {
			kinds = append(kinds, fmt.Sprintf("%s %d", k, n))
		}
		sort.Strings(kinds)
		t.Errorf("failures by kind: %s; first ones:\n  %s", strings.Join(kinds, ", "), strings.Join(h.failures, "\n  "))
	}
}

func (c *hStats) orZero() *hStats {
	if c == nil {
		return &hStats{}
	}
	return c
}

func hIndent(s string) string {
	return "    " + strings.ReplaceAll(s, "\n", "\n    ")
}

// hStatusOf asks a stack's gateway for its status, without failing the test.
func hStatusOf(s *hstack) (*codec.StatusReply, error) {
	m, err := s.g.NC.Request("ortbus.v1.status", []byte{0x80}, 5*time.Second)
	if err != nil {
		return nil, err
	}
	if code := m.Header.Get(codec.HeaderErrorCode); code != "" {
		return nil, fmt.Errorf("status answered an error (%s): %s", code, m.Header.Get(codec.HeaderError))
	}
	var st codec.StatusReply
	if err := codec.Unmarshal(m.Data, &st); err != nil {
		return nil, err
	}
	return &st, nil
}

// checkBadReplies: every request of the envelope attack was dropped and counted, by the
// gateway (ortbus_bad_messages_total{kind="reply_subject"}) or by the worker it was
// addressed to (its heartbeat's bad_messages). Counters restart with a crashed stack, so
// the counts are compared only on the first stack.
func (h *hostileRun) checkBadReplies(t *testing.T, s *hstack) {
	var toGateway, toWorkers int
	h.mu.Lock()
	for name, c := range h.stats {
		if !strings.HasSuffix(name, "(bad reply subject)") {
			continue
		}
		if strings.HasPrefix(name, "nats ortbus.v1.") || strings.HasPrefix(name, "nats ortbus.ops.") {
			toGateway += c.published
		} else {
			toWorkers += c.published
		}
	}
	restarts := h.restarts
	h.mu.Unlock()
	gw := badReplyCount(t, s.g)
	var workers uint64
	want := uint64(toWorkers)
	st := s.g.waitStatus(t, "the workers' heartbeats counting every bad reply subject", func(st *codec.StatusReply) bool {
		var n uint64
		for _, w := range st.Workers {
			n += w.Heartbeat.BadMessages
		}
		return restarts > 0 || n >= want
	})
	for _, w := range st.Workers {
		workers += w.Heartbeat.BadMessages
	}
	t.Logf("envelope: %d requests with bad reply subjects to the gateway (counted %v), %d to workers (counted %d)", toGateway, gw, toWorkers, workers)
	if restarts == 0 && (gw != float64(toGateway) || workers != want) {
		h.fail("bad reply uncounted", fmt.Sprintf("the gateway counted %v of %d, the workers %d of %d", gw, toGateway, workers, toWorkers))
	}
}
