package test

import (
	"bytes"
	"context"
	"fmt"
	"image"
	"image/color"
	"image/png"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nuid"

	"github.com/ortbus/ortbus/codec"
	"github.com/ortbus/ortbus/config"
	"github.com/ortbus/ortbus/health"
	launchpkg "github.com/ortbus/ortbus/internal/launch"
	"github.com/ortbus/ortbus/internal/testkit/testenv"
	"github.com/ortbus/ortbus/models/onnxgen"
)

// Failure bounds: how long a test waits for an event before it gives up. They only bound
// a failure; a passing run never waits them out.
const (
	startBound = 30 * time.Second // a worker's ready or failed line
	replyBound = 20 * time.Second // one reply, claim or heartbeat
	exitBound  = 20 * time.Second // a process exit that the test caused
)

// heavyLayers is the heavy tagger's extra layer count here: ~4.4 ms a layer on one core,
// so one inference takes ~45 ms, well over the 20 ms the scheduling tests need to tell a
// queued item from a running one.
const heavyLayers = 10

var heavyOnce struct {
	sync.Once
	err error
}

// modelsDir returns the generated models (testenv.Models); heavyDir the heavy tagger.
func modelsDir(t testing.TB) string {
	t.Helper()
	return testenv.Models(t)
}

// heavyDir returns the folder of a heavy tagger with heavyLayers layers (testenv's has
// one), written once into the package's temporary directory: its graph from onnxgen, its
// label files copied from the plain tagger's.
func heavyDir(t testing.TB) string {
	t.Helper()
	hd := filepath.Join(pkgEnv.tmp, onnxgen.TaggerHeavyDir)
	heavyOnce.Do(func() {
		heavyOnce.err = onnxgen.GenerateTagger(hd, heavyLayers)
	})
	if heavyOnce.err != nil {
		t.Fatalf("heavy tagger: %v", heavyOnce.err)
	}
	return hd
}

// poolCfg is one [pools.NAME] table of a test config.
type poolCfg struct {
	Name     string
	Version  string // runtime version from .deps; ignored when Runtime is set
	Runtime  string // explicit runtime path
	EP       string
	Fallback []string
	Slots    int
	MaxBatch int
	MaxDelay string
	Classes  []string
	Models   []string
}

// allModels are the models every test config defines, in order; a pool loads those it
// names.
var allModels = []string{"tagger", "tagger_heavy", "ccip", "detector", "segmenter"}

// writeConfig writes a config for the package's NATS server, with root as the only
// allowed image root, every generated model defined and the given pools, into a temporary
// directory of t, and returns its path.
func writeConfig(t testing.TB, root string, pools ...poolCfg) string {
	t.Helper()
	return writeConfigIn(t, t.TempDir(), root, pools...)
}

// writeConfigIn is writeConfig into dir.
func writeConfigIn(t testing.TB, dir, root string, pools ...poolCfg) string {
	t.Helper()
	md := modelsDir(t)
	c := &config.Config{
		NATS:     config.NATS{URL: pkgEnv.natsURL},
		Health:   config.Health{HeartbeatInterval: config.Duration(100 * time.Millisecond)},
		Security: config.Security{AllowedRoots: []string{root}, OutputRoots: []string{root}},
		Pools:    map[string]*config.Pool{},
		Models: map[string]*config.Model{
			"tagger":       {Kind: config.KindTaggerPixAI, Dir: filepath.Join(md, onnxgen.TaggerDir)},
			"tagger_heavy": {Kind: config.KindTaggerPixAI, Dir: heavyDir(t)},
			"ccip":         {Kind: config.KindCCIP, Dir: filepath.Join(md, onnxgen.CCIPDir)},
			"detector":     {Kind: config.KindDetect, Dir: filepath.Join(md, onnxgen.DetectorDir)},
			"segmenter":    {Kind: config.KindSegment, Dir: filepath.Join(md, onnxgen.SegmenterDir)},
		},
	}
	c.SetOrder("models", allModels...)
	var names []string
	for _, p := range pools {
		classes := p.Classes
		if len(classes) == 0 {
			classes = []string{"interactive", "batch"}
		}
		c.Pools[p.Name] = &config.Pool{Runtime: runtimeOf(t, p.Runtime, p.Version), EP: p.EP, Fallback: p.Fallback, Threads: 1,
			Slots: p.Slots, MaxBatch: p.MaxBatch, MaxDelay: duration(t, p.MaxDelay), Classes: classes, Models: p.Models}
		names = append(names, p.Name)
	}
	c.SetOrder("pools", names...)
	return writeConfigFile(t, filepath.Join(dir, "ortbus.toml"), c)
}

// writeConfigFile writes c to path (config.Write) and returns path.
func writeConfigFile(t testing.TB, path string, c *config.Config) string {
	t.Helper()
	if err := config.Write(path, c); err != nil {
		t.Fatal(err)
	}
	return path
}

// runtimeOf is a pool's runtime library: path, or else the one of version from .deps.
func runtimeOf(t testing.TB, path, version string) string {
	t.Helper()
	if path != "" {
		return path
	}
	return testenv.RuntimeLib(t, version)
}

// duration parses a duration of a test config ("" is 0: the default).
func duration(t testing.TB, s string) config.Duration {
	t.Helper()
	if s == "" {
		return 0
	}
	d, err := time.ParseDuration(s)
	if err != nil {
		t.Fatalf("test config: duration %q: %v", s, err)
	}
	return config.Duration(d)
}

// tinyConfig is the config of a test of one pool, pool, of the generated model tiny on ONNX
// Runtime 1.30.0 (one thread), serving classes, each chained to it alone: an embedded NATS
// server, root the allowed image root, the suite's heartbeats, grace the shutdown grace.
func tinyConfig(t testing.TB, root, pool string, grace time.Duration, classes ...string) *config.Config {
	t.Helper()
	c := &config.Config{
		NATS:     config.NATS{Embedded: true, Listen: "127.0.0.1:0"},
		Gateway:  config.Gateway{ShutdownGrace: config.Duration(grace)},
		Health:   config.Health{HeartbeatInterval: config.Duration(gwHeartbeat), MissCount: gwMissCount},
		Security: config.Security{AllowedRoots: []string{root}},
		Classes:  map[string]*config.Class{},
		Pools: map[string]*config.Pool{pool: {Runtime: testenv.RuntimeLib(t, "1.30.0"), Threads: 1, Classes: classes,
			Models: []string{"tiny"}}},
		Models: map[string]*config.Model{"tiny": {Kind: config.KindRaw, Dir: filepath.Join(testenv.Models(t), onnxgen.TinyDir)}},
	}
	for _, class := range classes {
		c.Classes[class] = &config.Class{Chain: []string{pool}}
	}
	return c
}

// imageRoot makes an allowed image root for one test. Its path has its symlinks resolved,
// so what the worker reports back compares equal to what the test wrote.
func imageRoot(t testing.TB) string {
	t.Helper()
	d, err := filepath.EvalSymlinks(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	root := filepath.Join(d, "images")
	if err := os.Mkdir(root, 0o755); err != nil {
		t.Fatal(err)
	}
	return root
}

// proc is one ortworker process.
type proc struct {
	ID, Pool string
	Ready    codec.Event // the ready line, once seen
	lp       *launchpkg.Proc
}

// launch starts an ortworker for pool (id: pool + "-w") without waiting for it. The
// process is killed and reaped when t ends, and its stderr logged if t failed.
func launch(t testing.TB, cfgPath, pool string, extraEnv ...string) *proc {
	t.Helper()
	p := launchDetached(t, cfgPath, pool, extraEnv...)
	t.Cleanup(func() {
		p.kill()
		if t.Failed() {
			t.Logf("stderr of worker %s:\n%s", p.ID, p.lp.Log())
		}
	})
	return p
}

// launchDetached is launch without the cleanup; the caller must kill the process.
func launchDetached(t testing.TB, cfgPath, pool string, extraEnv ...string) *proc {
	t.Helper()
	p := &proc{ID: pool + "-w", Pool: pool}
	var err error
	p.lp, err = launchpkg.Start(pkgEnv.bin, []string{"-config", cfgPath, "-pool", pool, "-id", p.ID},
		launchpkg.Options{Name: "worker " + p.ID, Env: extraEnv})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// await waits for the process's ready or failed line.
func (p *proc) await() (codec.Event, error) {
	ev, err := p.lp.Event(context.Background(), startBound)
	if err != nil {
		return ev, fmt.Errorf("%v; stderr:\n%s", err, p.lp.Log())
	}
	return ev, nil
}

// awaitReady waits for the ready line and checks that it names this process.
func (p *proc) awaitReady() (codec.Event, error) {
	ev, err := p.await()
	if err != nil {
		return ev, err
	}
	if ev.Event != codec.EventReady {
		return ev, fmt.Errorf("worker %s: want a ready line, got %+v (error %+v); stderr:\n%s", p.ID, ev, ev.Error, p.lp.Log())
	}
	if ev.Worker != p.ID || ev.Pool != p.Pool || ev.PID != p.lp.PID() {
		return ev, fmt.Errorf("worker %s: ready line %+v does not name this worker (pid %d)", p.ID, ev, p.lp.PID())
	}
	return ev, nil
}

// event waits for the process's ready or failed line.
func (p *proc) event(t testing.TB) codec.Event {
	t.Helper()
	ev, err := p.await()
	if err != nil {
		t.Fatal(err)
	}
	return ev
}

// ready waits for the ready line and checks it.
func (p *proc) ready(t testing.TB) codec.Event {
	t.Helper()
	ev, err := p.awaitReady()
	if err != nil {
		t.Fatal(err)
	}
	p.Ready = ev
	return ev
}

// wait waits for the process to exit (bounded) and returns its state.
func (p *proc) wait(t testing.TB) *os.ProcessState {
	t.Helper()
	st, err := p.lp.Wait(exitBound)
	if err != nil {
		t.Fatalf("%v; stderr:\n%s", err, p.lp.Log())
	}
	return st
}

// kill kills the process if it still runs, and reaps it.
func (p *proc) kill() { p.lp.Kill() }

// startWorker launches one worker and waits until it is ready.
func startWorker(t testing.TB, cfgPath, pool string, extraEnv ...string) *proc {
	t.Helper()
	p := launch(t, cfgPath, pool, extraEnv...)
	p.ready(t)
	return p
}

// connect opens a NATS connection to the package's server, closed when t ends.
func connect(t testing.TB) *nats.Conn {
	t.Helper()
	nc, err := nats.Connect(pkgEnv.natsURL, nats.Name(t.Name()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	return nc
}

// inbox is one subscription on a wildcard inbox: every reply sent to one of its subjects
// arrives on one channel, in the order the server delivered them.
//
// A request posted to an inbox belongs to it: the gateway honours a cancel of it only when
// the cancel's reply subject is under the same inbox. Such cancel replies (keys
// "cancel.<id>", see cancelKey) are set aside by next and read with cancelReply.
type inbox struct {
	prefix string
	ch     chan *nats.Msg
	early  []*nats.Msg          // messages read while looking for a cancel reply
	cancel map[string]*nats.Msg // cancel replies by key
}

func newInbox(t testing.TB, nc *nats.Conn) *inbox {
	t.Helper()
	return newInboxAt(t, nc, nats.NewInbox())
}

// newClaimInbox is an inbox on a claim prefix of its own (ortbus.claim.<random>): a work
// item whose claim_to is its prefix has its claim arrive here (a worker publishes claims
// only under a gateway's claim prefix, as <claim_to>.<pool>.<worker>).
func newClaimInbox(t testing.TB, nc *nats.Conn) *inbox {
	t.Helper()
	return newInboxAt(t, nc, "ortbus.claim.t"+nuid.Next())
}

func newInboxAt(t testing.TB, nc *nats.Conn, prefix string) *inbox {
	t.Helper()
	in := &inbox{prefix: prefix, ch: make(chan *nats.Msg, 4096), cancel: map[string]*nats.Msg{}}
	sub, err := nc.ChanSubscribe(in.prefix+".>", in.ch)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sub.Unsubscribe() })
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	return in
}

// subject is the inbox subject for key.
func (in *inbox) subject(key string) string { return in.prefix + "." + key }

// key is the key of a message's subject.
func (in *inbox) key(m *nats.Msg) string { return strings.TrimPrefix(m.Subject, in.prefix+".") }

// cancelKey is the inbox key of the reply to a cancel of id.
func cancelKey(id string) string { return "cancel." + id }

// next returns the next message that is not a cancel reply, failing t after replyBound.
func (in *inbox) next(t testing.TB, what string) *nats.Msg {
	t.Helper()
	if len(in.early) > 0 {
		m := in.early[0]
		in.early = in.early[1:]
		return m
	}
	for {
		m := in.read(t, what)
		if k := in.key(m); strings.HasPrefix(k, "cancel.") {
			in.cancel[k] = m
			continue
		}
		return m
	}
}

// cancelReply returns the reply to the cancel of id sent from this inbox, keeping other
// messages for next.
func (in *inbox) cancelReply(t testing.TB, id string) *nats.Msg {
	t.Helper()
	for {
		if m, ok := in.cancel[cancelKey(id)]; ok {
			delete(in.cancel, cancelKey(id))
			return m
		}
		m := in.read(t, "the reply to the cancel of "+id)
		if k := in.key(m); strings.HasPrefix(k, "cancel.") {
			in.cancel[k] = m
		} else {
			in.early = append(in.early, m)
		}
	}
}

func (in *inbox) read(t testing.TB, what string) *nats.Msg {
	t.Helper()
	select {
	case m := <-in.ch:
		return m
	case <-time.After(replyBound):
		t.Fatalf("no %s within %v", what, replyBound)
	}
	return nil
}

// send publishes a work item on infer.<pool>.<class> with its reply going to the inbox
// subject key.
func send(t testing.TB, nc *nats.Conn, in *inbox, pool, class, key string, item *codec.WorkItem) {
	t.Helper()
	b, err := codec.Marshal(item)
	if err != nil {
		t.Fatal(err)
	}
	sendRaw(t, nc, in, pool, class, key, b, nil)
}

// sendRaw publishes raw bytes (and headers) as a work item.
func sendRaw(t testing.TB, nc *nats.Conn, in *inbox, pool, class, key string, data []byte, hdr nats.Header) {
	t.Helper()
	m := &nats.Msg{Subject: "infer." + pool + "." + class, Reply: in.subject(key), Data: data, Header: hdr}
	if err := nc.PublishMsg(m); err != nil {
		t.Fatal(err)
	}
}

// request sends one work item and waits for its one reply.
func request(t testing.TB, nc *nats.Conn, pool, class string, item *codec.WorkItem) *nats.Msg {
	t.Helper()
	b, err := codec.Marshal(item)
	if err != nil {
		t.Fatal(err)
	}
	m, err := nc.Request("infer."+pool+"."+class, b, replyBound)
	if err != nil {
		t.Fatalf("%s request to %s (%+v): %v", item.Op, pool, item.Request, err)
	}
	return m
}

// result decodes a successful reply into v, failing t on an error reply.
func result(t testing.TB, m *nats.Msg, v codec.Replier) {
	t.Helper()
	if code := m.Header.Get("Nats-Service-Error-Code"); code != "" {
		var e codec.Error
		codec.Unmarshal(m.Data, &e)
		t.Fatalf("want a result, got error %s %q: %+v", code, m.Header.Get("Nats-Service-Error"), e)
	}
	if err := codec.Unmarshal(m.Data, v); err != nil {
		t.Fatalf("decode reply: %v", err)
	}
}

// replyError decodes an error reply (msgpack, or JSON when asJSON), checking its headers.
func replyError(t testing.TB, m *nats.Msg, asJSON bool) *codec.Error {
	t.Helper()
	code := m.Header.Get("Nats-Service-Error-Code")
	if code == "" {
		t.Fatalf("want an error reply, got a result without Nats-Service-Error-Code: %q", m.Data)
	}
	var e codec.Error
	if err := codec.Decode(m.Data, &e, asJSON); err != nil {
		t.Fatalf("decode error body: %v (%q)", err, m.Data)
	}
	if code != strconv.Itoa(e.Code.Status()) {
		t.Errorf("error %s: header Nats-Service-Error-Code %q, want %d", e.Code, code, e.Code.Status())
	}
	if m.Header.Get("Nats-Service-Error") == "" {
		t.Errorf("error %s: no Nats-Service-Error header", e.Code)
	}
	return &e
}

// stats asks a worker for its state on ortbus.worker.<id>.stats.
func stats(t testing.TB, nc *nats.Conn, id string) *codec.Heartbeat {
	t.Helper()
	m, err := nc.Request("ortbus.worker."+id+".stats", nil, replyBound)
	if err != nil {
		t.Fatalf("stats of %s: %v", id, err)
	}
	var hb codec.Heartbeat
	if err := codec.Unmarshal(m.Data, &hb); err != nil {
		t.Fatalf("stats of %s: %v", id, err)
	}
	return &hb
}

// heartbeats subscribes to ortbus.hb.> and returns a function that waits for the next
// heartbeat of a worker that satisfies ok.
func heartbeats(t testing.TB, nc *nats.Conn) func(worker string, ok func(*codec.Heartbeat) bool) *codec.Heartbeat {
	t.Helper()
	ch := make(chan *nats.Msg, 1024)
	sub, err := nc.ChanSubscribe("ortbus.hb.>", ch)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sub.Unsubscribe() })
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	return func(worker string, ok func(*codec.Heartbeat) bool) *codec.Heartbeat {
		t.Helper()
		timeout := time.After(replyBound)
		for {
			select {
			case m := <-ch:
				var hb codec.Heartbeat
				if err := health.Decode(m, &hb); err != nil {
					t.Fatalf("heartbeat on %s: %v", m.Subject, err)
				}
				if hb.Worker == worker && (ok == nil || ok(&hb)) {
					return &hb
				}
			case <-timeout:
				t.Fatalf("no matching heartbeat of %s within %v", worker, replyBound)
				return nil
			}
		}
	}
}

// writePNG writes a w×h PNG of px under root and returns its path.
func writePNG(t testing.TB, root, name string, w, h int, px onnxgen.PixelFunc) string {
	t.Helper()
	img := image.NewNRGBA(image.Rect(0, 0, w, h))
	for y := 0; y < h; y++ {
		for x := 0; x < w; x++ {
			c := px(x, y)
			img.SetNRGBA(x, y, color.NRGBA{c[0], c[1], c[2], 255})
		}
	}
	var buf bytes.Buffer
	if err := png.Encode(&buf, img); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(root, name)
	if err := os.WriteFile(path, buf.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// colourPNG writes a uniformly coloured 64×48 PNG of a corner colour.
func colourPNG(t testing.TB, root, colour string) string {
	t.Helper()
	rgb, ok := onnxgen.ColourNames[colour]
	if !ok {
		t.Fatalf("no corner colour %q", colour)
	}
	return writePNG(t, root, colour+".png", 64, 48, onnxgen.Solid(rgb))
}

// tagItem is a tag work item for path.
func tagItem(id, path string) *codec.WorkItem {
	return &codec.WorkItem{Request: codec.Request{ID: id, Path: path}, Op: "tag"}
}

// checkColourTag checks a tag reply of a uniform corner-colour image: that colour as a
// general tag with score >= 0.9, and no other colour tag.
func checkColourTag(t testing.TB, r *codec.TagReply, colour string) {
	t.Helper()
	if s, ok := r.General[colour]; !ok || s < 0.9 {
		t.Errorf("%s image: general[%s] = %v (present %v), want >= 0.9; general %v", colour, colour, s, ok, r.General)
	}
	for _, c := range onnxgen.Colours {
		if c.Name != colour {
			if s, ok := r.General[c.Name]; ok {
				t.Errorf("%s image: also tagged %s (%v)", colour, c.Name, s)
			}
		}
	}
}

// built holds the binaries of cmd/<name> built by testBinary, once per test process.
var built struct {
	mu   sync.Mutex
	bins map[string]*builtBin
}

type builtBin struct {
	once sync.Once
	path string
	err  error
}

// testBinary builds ./cmd/<name> once per test process (without -race) into the
// package's temporary directory and returns its path. They all go into one directory
// (the Bun suite runs them from there).
func testBinary(t testing.TB, name string) string {
	t.Helper()
	p, err := buildBinary(name)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// buildBinary is testBinary for TestMain, which has no test (it builds ortworker): the
// tests run in the package's directory, so the repository root is "..".
func buildBinary(name string) (string, error) {
	built.mu.Lock()
	if built.bins == nil {
		built.bins = map[string]*builtBin{}
	}
	b := built.bins[name]
	if b == nil {
		b = &builtBin{}
		built.bins[name] = b
	}
	built.mu.Unlock()
	b.once.Do(func() {
		dir := filepath.Join(pkgEnv.tmp, "bin")
		if b.err = os.MkdirAll(dir, 0o755); b.err != nil {
			return
		}
		p := filepath.Join(dir, name)
		build := exec.Command("go", "build", "-o", p, "./cmd/"+name)
		build.Dir = ".."
		if out, err := build.CombinedOutput(); err != nil {
			b.err = fmt.Errorf("go build ./cmd/%s: %v\n%s", name, err, out)
			return
		}
		b.path = p
	})
	return b.path, b.err
}
