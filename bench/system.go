package bench

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"image"
	"image/color"
	"image/png"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/ortbus/ortbus/client"
	"github.com/ortbus/ortbus/codec"
	"github.com/ortbus/ortbus/config"
	"github.com/ortbus/ortbus/internal/launch"
	"github.com/ortbus/ortbus/models/onnxgen"
)

// Bounds of starting and stopping a system; a healthy run never waits them out.
const (
	startBound = 90 * time.Second
	// webgpuStartBound is startBound for a system with webgpu pools (Options.startBound):
	// their workers compile the models' shaders at load, one after another on a device,
	// which takes minutes on lavapipe without Mesa's shader cache (measured: PP-OCRv4
	// det's first load 36 s at a load average of 6 on 2 cores, 83 s at 11-14; then seconds).
	webgpuStartBound = 5 * time.Minute
	stopBound        = 20 * time.Second
)

// workdir is a bench's temporary directory: configs, generated models, images, logs.
type workdir struct {
	dir    string
	models string // generated models (onnxgen)
	images string // the one allowed image root
	keep   bool
	// fetched maps the fetched models a scenario loads (vad, ocr) to their folders.
	fetched map[string]string
}

// newWorkdir makes the temporary directory and generates the models into it, the heavy
// tagger with heavyLayers compute layers (0 = none).
func newWorkdir(o *Options, heavyLayers int) (*workdir, error) {
	w, err := newBareWorkdir(o)
	if err != nil {
		return nil, err
	}
	if err := onnxgen.Generate(w.models, onnxgen.Options{TaggerComputeLayers: heavyLayers}); err != nil {
		w.close()
		return nil, err
	}
	return w, nil
}

// spool is the spool directory of the bench's configs: images/spool.
func (w *workdir) spool() string { return filepath.Join(w.images, "spool") }

func (w *workdir) close() {
	if w == nil {
		return
	}
	if w.keep {
		fmt.Fprintf(os.Stderr, "bench: kept %s\n", w.dir)
		return
	}
	os.RemoveAll(w.dir)
}

// solidPNG writes a size x size PNG of one colour into the image root and returns its path.
func (w *workdir) solidPNG(name string, size int, c color.RGBA) (string, error) {
	img := image.NewRGBA(image.Rect(0, 0, size, size))
	for i := 0; i < len(img.Pix); i += 4 {
		img.Pix[i], img.Pix[i+1], img.Pix[i+2], img.Pix[i+3] = c.R, c.G, c.B, 255
	}
	var buf bytes.Buffer
	if err := png.Encode(&buf, img); err != nil {
		return "", err
	}
	p := filepath.Join(w.images, name+".png")
	return p, os.WriteFile(p, buf.Bytes(), 0o644)
}

// poolSpec is one [pools.NAME] table of a generated config.
type poolSpec struct {
	Name    string
	Runtime string // absolute library path
	Workers int
	Slots   int
	Threads int
	// EP is the pool's execution provider ("" = cpu), strict: no fallback, so that a
	// bench never measures another EP than the one it names.
	EP       string
	Device   string
	Classes  []string
	Models   []string
	MaxBatch int
	MaxDelay time.Duration
	Nice     int // written only under the priority policy: part of the CPU sharing rule
	// AdapterMismatch is the pool's adapter_mismatch: "flag" for a webgpu pool on the
	// logical GPU of a machine without one (a smoke: lavapipe serves it, flagged).
	AdapterMismatch string
}

// classSpec is one [classes.NAME] table.
type classSpec struct {
	Name       string
	Chain      []string
	Timeout    time.Duration
	MaxTimeout time.Duration
	QueueBound int
	Degrade    bool
}

// modelSpec is one [models.NAME] table.
type modelSpec struct {
	Name, Kind, Dir string
}

// sysConfig is a whole generated config.
type sysConfig struct {
	// Policy is the [gateway] policy ("" = leave the key out).
	Policy string
	// RelayReplies is [gateway] relay_replies.
	RelayReplies bool
	Images       string
	// Spool is security.spool_dir, inside Images ("" = none).
	Spool   string
	Pools   []poolSpec
	Classes []classSpec
	Models  []modelSpec
	// Heartbeat interval (default 250ms).
	Heartbeat time.Duration
	// StoreDir turns JetStream on in the embedded server (the job store); "" = off.
	StoreDir string
	// Jobs is the [jobs] table (zero = the defaults).
	Jobs config.Jobs
	// Devices are [devices.NAME] tables (nil: none).
	Devices map[string]config.Device
	// Cache is the [cache] table (zero: off).
	Cache config.Cache
}

// config is the configuration the bench writes: embedded NATS on a free port, quick
// restarts, the spec's classes, pools and models in its order.
func (c sysConfig) config() *config.Config {
	d := func(x time.Duration) config.Duration { return config.Duration(x) }
	hb := c.Heartbeat
	if hb == 0 {
		hb = 250 * time.Millisecond
	}
	cfg := &config.Config{
		NATS:     config.NATS{Embedded: true, Listen: "127.0.0.1:0", StoreDir: c.StoreDir},
		Gateway:  config.Gateway{ShutdownGrace: d(5 * time.Second), RestartBackoffMin: d(50 * time.Millisecond), Policy: c.Policy, RelayReplies: c.RelayReplies},
		Health:   config.Health{HeartbeatInterval: d(hb), MissCount: 3},
		Security: config.Security{AllowedRoots: []string{c.Images}, SpoolDir: c.Spool},
		Classes:  map[string]*config.Class{},
		Pools:    map[string]*config.Pool{},
		Models:   map[string]*config.Model{},
		Jobs:     c.Jobs,
		Cache:    c.Cache,
	}
	var classes, pools, models []string
	for _, cl := range c.Classes {
		cfg.Classes[cl.Name] = &config.Class{Chain: cl.Chain, Timeout: d(cl.Timeout), MaxTimeout: d(cl.MaxTimeout), QueueBound: cl.QueueBound, Degrade: cl.Degrade}
		classes = append(classes, cl.Name)
	}
	for _, p := range c.Pools {
		pc := &config.Pool{Runtime: p.Runtime, EP: orDefault(p.EP, "cpu"), Device: p.Device, Workers: max(p.Workers, 1), Slots: max(p.Slots, 1),
			Threads: max(p.Threads, 1), Classes: p.Classes, Models: p.Models, MaxBatch: p.MaxBatch, MaxDelay: d(p.MaxDelay), AdapterMismatch: p.AdapterMismatch}
		if c.Policy != config.PolicyFIFO {
			pc.Nice = p.Nice
		}
		cfg.Pools[p.Name] = pc
		pools = append(pools, p.Name)
	}
	for _, m := range c.Models {
		cfg.Models[m.Name] = &config.Model{Kind: m.Kind, Dir: m.Dir}
		models = append(models, m.Name)
	}
	if len(c.Devices) > 0 {
		cfg.Devices = c.Devices
	}
	cfg.SetOrder("classes", classes...)
	cfg.SetOrder("pools", pools...)
	cfg.SetOrder("models", models...)
	return cfg
}

func orDefault(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

// writeConfig writes the config as dir/name.toml and checks that the bench's gateway
// binary takes it (`gateway -check`), so that a key the binary does not know yet is
// reported as such.
func (w *workdir) writeConfig(o *Options, name string, c sysConfig) (string, error) {
	path := filepath.Join(w.dir, name+".toml")
	if err := config.Write(path, c.config()); err != nil {
		return "", err
	}
	out, err := exec.Command(filepath.Join(o.BinDir, "gateway"), "-check", "-config", path).CombinedOutput()
	if err != nil {
		return path, fmt.Errorf("%s refuses the config: %s", filepath.Join(o.BinDir, "gateway"), strings.TrimSpace(string(out)))
	}
	return path, nil
}

// policyRefused reports whether a config error is the gateway refusing the policy key
// (a gateway older than `[gateway] policy`).
func policyRefused(err error) bool {
	return err != nil && strings.Contains(err.Error(), "policy")
}

// runConfigs writes base as the configs of a scenario's runs: "policy" (the priority
// policy) and "fifo". refused is "" when the gateway took the policy key; else why not:
// then "policy" is written without the key (the gateway's built-in policy) and there is
// no FIFO config (fifo is "").
func (w *workdir) runConfigs(o *Options, base sysConfig) (policy, fifo, refused string, err error) {
	base.Policy = config.PolicyPriority
	policy, err = w.writeConfig(o, "policy", base)
	if policyRefused(err) {
		refused = err.Error()
		base.Policy = ""
		policy, err = w.writeConfig(o, "policy", base)
		return policy, "", refused, err
	}
	if err != nil {
		return "", "", "", err
	}
	base.Policy = config.PolicyFIFO
	fifo, err = w.writeConfig(o, "fifo", base)
	return policy, fifo, "", err
}

// system is a running gateway (with its embedded NATS server and local workers) and a
// client connection to its bus.
type system struct {
	name  string
	gw    *launch.Proc
	ready codec.Event // the gateway's ready line
	nc    *nats.Conn
	cl    *client.Client
	// gpuMem, when set, is the watch of the GPU's memory that each collision run samples
	// (gpumem.go); nil: none.
	gpuMem *memWatch
}

// startSystem runs `gateway -config cfg` on a free port with HTTP off and the bench's
// ortworker, waits for its ready line, connects, and checks that every pool has all its
// workers live. Its log is dir/name.log (and goes to o.Logs).
func startSystem(ctx context.Context, o *Options, w *workdir, name, cfg string) (*system, error) {
	return startSystemThen(ctx, o, w, name, cfg, nil)
}

// startSystemThen is startSystem that calls connected, when set, as soon as the
// connection to the bus is open (before the wait for the workers): a subscription made
// there sees everything the new system does.
func startSystemThen(ctx context.Context, o *Options, w *workdir, name, cfg string, connected func(*nats.Conn) error) (*system, error) {
	return startSystemEnv(ctx, o, w, name, cfg, nil, connected)
}

// startSystemEnv is startSystemThen with env (KEY=value) added to the gateway's
// environment (and so its local workers'). The OTEL_* variables of the bench's own
// environment are left out: a bench's system traces only where env says so
// (overhead_trace.go), so that its figures do not depend on the shell's.
func startSystemEnv(ctx context.Context, o *Options, w *workdir, name, cfg string, env []string, connected func(*nats.Conn) error) (*system, error) {
	return startSystemHTTP(ctx, o, w, name, cfg, env, "-", connected)
}

// startSystemHTTP is startSystemEnv with the gateway's HTTP API on httpListen ("-": off;
// "127.0.0.1:0": a free loopback port, in the ready line's http).
func startSystemHTTP(ctx context.Context, o *Options, w *workdir, name, cfg string, env []string, httpListen string, connected func(*nats.Conn) error) (*system, error) {
	environ := slices.DeleteFunc(os.Environ(), func(kv string) bool { return strings.HasPrefix(kv, "OTEL_") })
	gw, err := launch.Start(filepath.Join(o.BinDir, "gateway"), []string{"-config", cfg, "-nats-listen", "127.0.0.1:0",
		"-http-listen", httpListen, "-worker", filepath.Join(o.BinDir, "ortworker")},
		launch.Options{Name: "gateway " + name, LogFile: filepath.Join(w.dir, name+".log"), Tee: o.Logs, Environ: environ, Env: env})
	if err != nil {
		return nil, err
	}
	s := &system{name: name, gw: gw}
	bound := positiveOr(o.startBound, startBound)
	if s.ready, err = gw.Ready(ctx, bound); err != nil {
		gw.Kill()
		return nil, fmt.Errorf("%w; log tail:\n%s", err, gw.LogTail(30))
	}
	s.nc, err = nats.Connect(s.ready.NATSURL, nats.Name("ortbus bench"), nats.MaxReconnects(-1))
	if err != nil {
		s.stop()
		return nil, fmt.Errorf("connect to %s: %w", s.ready.NATSURL, err)
	}
	s.cl = client.New(s.nc)
	if connected != nil {
		if err := connected(s.nc); err != nil {
			s.stop()
			return nil, err
		}
	}
	if err := s.awaitWorkers(ctx, max(30*time.Second, o.startBound)); err != nil {
		s.stop()
		return nil, err
	}
	return s, nil
}

// awaitWorkers waits until every pool has as many live workers as configured.
func (s *system) awaitWorkers(ctx context.Context, bound time.Duration) error {
	until := time.Now().Add(bound)
	for {
		st, err := s.status(ctx)
		if err == nil {
			ok := true
			for _, p := range st.Pools {
				if p.Error != nil {
					return fmt.Errorf("pool %s failed: %s: %s; log tail:\n%s", p.Name, p.Error.Code, p.Error.Message, s.gw.LogTail(30))
				}
				if p.Live < p.Workers {
					ok = false
				}
			}
			if ok {
				return nil
			}
		}
		if time.Now().After(until) {
			return fmt.Errorf("gateway %s: pools not live within %v (last status error: %v); log tail:\n%s", s.name, bound, err, s.gw.LogTail(30))
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}

func (s *system) status(ctx context.Context) (*codec.StatusReply, error) {
	c, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	return s.cl.Status(c)
}

// runtimes adds the workers' runtime versions to rt.
func (s *system) runtimes(ctx context.Context, rt *Runtimes) {
	if st, err := s.status(ctx); err == nil {
		for _, w := range st.Workers {
			rt.addWorker(w.Runtime)
		}
	}
}

// stop closes the connection and stops the gateway (SIGTERM: it drains its workers),
// killing it if it does not exit in time.
func (s *system) stop() {
	if s == nil {
		return
	}
	if s.nc != nil {
		s.nc.Close()
	}
	s.gw.Stop(stopBound)
}

// caller sends requests asynchronously (publish with a reply subject) and records each
// one's terminal reply, so thousands can be outstanding without a goroutine each.
type caller struct {
	nc     *nats.Conn
	sub    *nats.Subscription
	prefix string

	mu      sync.Mutex
	calls   map[string]*call
	pending int
	idle    *sync.Cond
	// onReply, when set (setOnReply), is called outside mu for every reply.
	onReply func(*call)
}

// setOnReply sets a function called for every reply (on the subscription's goroutine).
func (c *caller) setOnReply(f func(*call)) {
	c.mu.Lock()
	c.onReply = f
	c.mu.Unlock()
}

// call is one request and its outcome.
type call struct {
	ID       string
	Class    string
	Sent     time.Time
	Deadline time.Duration // the request's timeout (0 = the class default)
	Done     bool
	Recv     time.Time
	Code     string // "" = a result
	QueueUS  int64
	Worker   string
	Runtime  string
	Pool     string // the pool that served it
}

// Latency is the time from sending to the reply.
func (c *call) Latency() time.Duration { return c.Recv.Sub(c.Sent) }

// Late reports whether a result arrived after the request's deadline.
func (c *call) Late() bool { return c.Code == "" && c.Deadline > 0 && c.Latency() > c.Deadline }

func newCaller(nc *nats.Conn) (*caller, error) {
	c := &caller{nc: nc, prefix: nc.NewRespInbox() + ".", calls: map[string]*call{}}
	c.idle = sync.NewCond(&c.mu)
	sub, err := nc.Subscribe(c.prefix+"*", c.handle)
	if err != nil {
		return nil, err
	}
	if err := sub.SetPendingLimits(-1, -1); err != nil {
		sub.Unsubscribe()
		return nil, err
	}
	c.sub = sub
	return c, nil
}

// served is the part every result shares.
type served struct {
	codec.Served `msgpack:",inline"`
}

func (c *caller) handle(m *nats.Msg) {
	now := time.Now()
	id := strings.TrimPrefix(m.Subject, c.prefix)
	var code string
	var sv served
	if err := client.Decode(m, &sv); err != nil {
		code = string(codec.AsError(err).Code)
	}
	c.mu.Lock()
	k, ok := c.calls[id]
	if !ok || k.Done {
		c.mu.Unlock()
		return
	}
	k.Done, k.Recv, k.Code = true, now, code
	k.QueueUS, k.Worker, k.Runtime, k.Pool = sv.Timing.QueueUS, sv.Worker, sv.Runtime, sv.Pool
	c.pending--
	if c.pending == 0 {
		c.idle.Broadcast()
	}
	f := c.onReply
	c.mu.Unlock()
	if f != nil {
		f(k)
	}
}

// send publishes req (its ID set) to ortbus.v1.<op>.
func (c *caller) send(op string, req *codec.Request) (*call, error) {
	data, err := codec.Marshal(req)
	if err != nil {
		return nil, err
	}
	k := &call{ID: req.ID, Class: req.Class, Deadline: time.Duration(req.TimeoutMS) * time.Millisecond}
	c.mu.Lock()
	if _, dup := c.calls[k.ID]; dup {
		c.mu.Unlock()
		return nil, fmt.Errorf("duplicate request id %s", k.ID)
	}
	c.calls[k.ID] = k
	c.pending++
	k.Sent = time.Now()
	c.mu.Unlock()
	if err := c.nc.PublishRequest("ortbus.v1."+op, c.prefix+k.ID, data); err != nil {
		c.mu.Lock()
		k.Done, k.Recv, k.Code = true, time.Now(), "publish_failed"
		c.pending--
		c.mu.Unlock()
		return k, err
	}
	return k, nil
}

// wait waits until every call is answered or bound passes; it returns how many are
// still unanswered.
func (c *caller) wait(ctx context.Context, bound time.Duration) int {
	done := make(chan struct{})
	stop := context.AfterFunc(ctx, func() { c.mu.Lock(); c.idle.Broadcast(); c.mu.Unlock() })
	defer stop()
	timer := time.AfterFunc(bound, func() { close(done); c.mu.Lock(); c.idle.Broadcast(); c.mu.Unlock() })
	defer timer.Stop()
	c.mu.Lock()
	defer c.mu.Unlock()
	for c.pending > 0 {
		select {
		case <-done:
			return c.pending
		default:
		}
		if ctx.Err() != nil {
			return c.pending
		}
		c.idle.Wait()
	}
	return 0
}

// snapshot returns copies of every call.
func (c *caller) snapshot() []call {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make([]call, 0, len(c.calls))
	for _, k := range c.calls {
		out = append(out, *k)
	}
	return out
}

func (c *caller) close() {
	if c.sub != nil {
		c.sub.Unsubscribe()
	}
}

// errCode is the stable code of an error from the client, or "error".
func errCode(err error) string {
	var e *codec.Error
	if errors.As(err, &e) {
		return string(e.Code)
	}
	if errors.Is(err, context.DeadlineExceeded) {
		return "client_timeout"
	}
	return "error"
}

// newBareWorkdir is a bench's temporary directory without generated models.
func newBareWorkdir(o *Options) (*workdir, error) {
	dir, err := os.MkdirTemp("", "ortbus-bench-")
	if err != nil {
		return nil, err
	}
	w := &workdir{dir: dir, models: filepath.Join(dir, "models"), images: filepath.Join(dir, "images"), keep: o.KeepTemp}
	if err := os.MkdirAll(w.images, 0o755); err != nil {
		w.close()
		return nil, err
	}
	return w, nil
}

// clearDir removes the files in dir (errors ignored).
func clearDir(dir string) {
	entries, _ := os.ReadDir(dir)
	for _, e := range entries {
		os.Remove(filepath.Join(dir, e.Name()))
	}
}
