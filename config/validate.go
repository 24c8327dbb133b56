package config

import (
	"errors"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/ortbus/ortbus/codec"
	"github.com/ortbus/ortbus/subjects"
)

// DefaultQueueBytes is a class queue's default bound in bytes of waiting requests.
const DefaultQueueBytes = 256 << 20

// defaultClasses are used for any of the three standard classes the file leaves out.
var defaultClasses = map[string]Class{
	subjects.ClassUrgent:      {Priority: 0, Timeout: Duration(200 * time.Millisecond), MaxTimeout: Duration(2 * time.Second), QueueBound: 64, Shed: ShedRejectNew},
	subjects.ClassInteractive: {Priority: 1, Timeout: Duration(10 * time.Second), MaxTimeout: Duration(60 * time.Second), QueueBound: 256, Shed: ShedRejectNew},
	subjects.ClassBatch:       {Priority: 2, Timeout: Duration(5 * time.Minute), MaxTimeout: Duration(time.Hour), QueueBound: 10000, Shed: ShedRejectNew, MinShare: 0.1},
}

// applyDefaults gives every key the file leaves out its default, section by section;
// the order matters where one default follows another (the cache's replicas follow the
// jobs'; the zero defaults of the standard classes need them added; a class's default
// chain lists the pools).
func (c *Config) applyDefaults() {
	c.applyServiceDefaults()
	c.applyJobDefaults()
	c.applyCacheDefaults()
	c.applyGatewayDefaults()
	c.applyModelDefaults()
	c.applyPoolDefaults()
	c.addClasses()
	c.applyZeroDefaults()
	c.applyClassDefaults()
}

// applyServiceDefaults gives [health], [security] and [nats] their defaults.
func (c *Config) applyServiceDefaults() {
	if c.Health.HeartbeatInterval == 0 {
		c.Health.HeartbeatInterval = Duration(DefaultHeartbeat)
	}
	if c.Health.MissCount == 0 {
		c.Health.MissCount = DefaultMissCount
	}
	if c.Security.MaxImagePixels == 0 {
		c.Security.MaxImagePixels = DefaultMaxImagePixels
	}
	if c.Security.MaxImageBytes == 0 {
		c.Security.MaxImageBytes = DefaultMaxImageBytes
	}
	if c.NATS.Embedded && c.NATS.Listen == "" {
		c.NATS.Listen = "127.0.0.1:4222"
	}
}

// applyJobDefaults gives [jobs] its defaults.
func (c *Config) applyJobDefaults() {
	j := &c.Jobs
	if j.Replicas == 0 {
		j.Replicas = 1
	}
	if j.AckWait == 0 {
		j.AckWait = Duration(30 * time.Second)
	}
	if j.MaxAckPending == 0 {
		j.MaxAckPending = 256
	}
	if j.MaxDeliveries == 0 {
		j.MaxDeliveries = 3
	}
	if j.MaxItems == 0 {
		j.MaxItems = DefaultJobMaxItems
	}
	if j.MaxRunning == 0 {
		j.MaxRunning = DefaultJobMaxRunning
	}
	if j.ItemsMaxBytes == 0 {
		j.ItemsMaxBytes = 1 << 30
	}
	if j.ResultsMaxBytes == 0 {
		j.ResultsMaxBytes = 4 << 30
	}
	if j.ResultsMaxAge == 0 {
		j.ResultsMaxAge = Duration(168 * time.Hour)
	}
}

// applyCacheDefaults gives [cache] its defaults; its replicas default to the jobs'
// (applyJobDefaults runs first).
func (c *Config) applyCacheDefaults() {
	if c.Cache.MaxBytes == 0 {
		c.Cache.MaxBytes = 1 << 30
	}
	if c.Cache.Replicas == 0 {
		c.Cache.Replicas = c.Jobs.Replicas
	}
	if c.Cache.StatEntries == 0 {
		c.Cache.StatEntries = 262144
	}
}

// applyGatewayDefaults gives [gateway] its defaults.
func (c *Config) applyGatewayDefaults() {
	g := &c.Gateway
	if g.ShutdownGrace == 0 {
		g.ShutdownGrace = Duration(10 * time.Second)
	}
	if g.RestartBackoffMin == 0 {
		g.RestartBackoffMin = Duration(100 * time.Millisecond)
	}
	if g.RestartBackoffMax == 0 {
		g.RestartBackoffMax = Duration(10 * time.Second)
	}
	if g.CrashLoopCount == 0 {
		g.CrashLoopCount = 5
	}
	if g.CrashLoopWindow == 0 {
		g.CrashLoopWindow = Duration(30 * time.Second)
	}
	if g.Identity == "" {
		g.Identity = IdentityLocal
	}
	if g.Policy == "" {
		g.Policy = PolicyPriority
	}
	if g.HTTPMaxBody == 0 {
		g.HTTPMaxBody = DefaultHTTPMaxBody
	}
	if g.HTTPMaxConcurrent == 0 {
		g.HTTPMaxConcurrent = DefaultHTTPMaxConcurrent
	}
	if g.LeaseMaxTTL == 0 {
		g.LeaseMaxTTL = Duration(10 * time.Minute)
	}
	if g.LeaseDefaultTTL == 0 {
		g.LeaseDefaultTTL = Duration(min(30*time.Second, g.LeaseMaxTTL.D()))
	}
}

// applyModelDefaults makes every [models.NAME] table a model that knows its name.
func (c *Config) applyModelDefaults() {
	for name, m := range c.Models {
		if m == nil {
			m = &Model{}
			c.Models[name] = m
		}
		m.Name = name
	}
}

// applyPoolDefaults makes every [pools.NAME] table a pool that knows its name, and gives
// it its defaults.
func (c *Config) applyPoolDefaults() {
	for name, p := range c.Pools {
		if p == nil {
			p = &Pool{}
			c.Pools[name] = p
		}
		p.Name = name
		if p.EP == "" {
			p.EP = "cpu"
		}
		if p.Workers == 0 && p.IsLocal() {
			p.Workers = 1
		}
		if p.Slots == 0 {
			p.Slots = 1
		}
		if p.PendingMsgs == 0 {
			p.PendingMsgs = 1024
		}
		if p.QueueBound == 0 {
			p.QueueBound = 256
		}
		if p.MaxDelay == 0 {
			p.MaxDelay = Duration(5 * time.Millisecond)
		}
		if p.Device == "" {
			p.Device = defaultDevice(p)
		}
	}
}

// addClasses adds the standard classes the file leaves out (with their defaults), and
// makes every [classes.NAME] table a class.
func (c *Config) addClasses() {
	if c.Classes == nil {
		c.Classes = map[string]*Class{}
	}
	for name, def := range defaultClasses {
		if _, ok := c.Classes[name]; !ok {
			d := def
			c.Classes[name] = &d
		}
	}
	for name, cl := range c.Classes {
		if cl == nil {
			c.Classes[name] = &Class{}
		}
	}
}

// applyClassDefaults gives every class its defaults: a standard class its own, another
// the general ones; the pools have theirs already (a default chain lists the pools that
// serve the class).
func (c *Config) applyClassDefaults() {
	for name, cl := range c.Classes {
		def, std := defaultClasses[name]
		if cl.Timeout == 0 {
			cl.Timeout = pick(std, def.Timeout, Duration(30*time.Second))
		}
		if cl.MaxTimeout == 0 {
			cl.MaxTimeout = max(cl.Timeout, pick(std, def.MaxTimeout, cl.Timeout))
		}
		if cl.QueueBytes == 0 {
			cl.QueueBytes = DefaultQueueBytes
		}
		if cl.QueueBound == 0 {
			cl.QueueBound = pick(std, def.QueueBound, 256)
		}
		if cl.Shed == "" {
			cl.Shed = ShedRejectNew
		}
		if len(cl.Chain) == 0 {
			// Default chain: every pool that serves the class, in file order.
			for _, pn := range c.PoolNames() {
				if slices.Contains(c.Pools[pn].Classes, name) {
					cl.Chain = append(cl.Chain, pn)
				}
			}
		}
	}
}

// applyZeroDefaults applies the defaults of the keys whose zero is a value of its own
// (security.spool_max_age "0s" keeps spool files forever, gateway.reserve_window "0s" turns
// the reservation off; a standard class's priority and min_share may be 0): such a key takes
// its default only when it has no value of its own.
func (c *Config) applyZeroDefaults() {
	if !c.set("security.spool_max_age", c.Security.SpoolMaxAge == 0) {
		c.Security.SpoolMaxAge = Duration(DefaultSpoolMaxAge)
	}
	if !c.set("gateway.reserve_window", c.Gateway.ReserveWindow == 0) {
		c.Gateway.ReserveWindow = Duration(DefaultReserveWindow)
	}
	for name, cl := range c.Classes {
		def, std := defaultClasses[name]
		if !std || cl == nil {
			continue
		}
		if !c.set("classes."+name+".priority", cl.Priority == 0) {
			cl.Priority = def.Priority
		}
		if !c.set("classes."+name+".min_share", cl.MinShare == 0) {
			cl.MinShare = def.MinShare
		}
	}
}

// set reports whether a key has a value of its own: written in the file, or not zero (a
// key the file leaves out decodes as zero; a config built in code has no file, and its
// zero means "the default", as a key left out does).
func (c *Config) set(key string, zero bool) bool {
	_, written := c.lines[key]
	return written || !zero
}

func pick[T any](ok bool, a, b T) T {
	if ok {
		return a
	}
	return b
}

func defaultDevice(p *Pool) string {
	id := p.EPOptions["device_id"]
	if id == "" {
		id = "0"
	}
	switch p.EP {
	case "cuda", "tensorrt":
		return "cuda:" + id
	case "openvino":
		return "gpu.intel:0"
	case "webgpu":
		// The adapter Dawn picks is not known here: the pool names its device (validate).
		return ""
	}
	return "cpu"
}

// validate checks the whole configuration once its defaults are in, and makes its paths
// absolute (relative to the file's folder); it returns every error found, in file order
// of the sections.
func (c *Config) validate() error {
	var errs errList
	add := errs.add
	add(c.validateServices())
	add(c.validateSecurityPaths())
	c.NATS.StoreDir = c.Path(c.NATS.StoreDir)
	c.NATS.CredsFile = c.Path(c.NATS.CredsFile)
	c.NATS.PasswordFile = c.Path(c.NATS.PasswordFile)
	c.NATS.TLSCA, c.NATS.TLSCert, c.NATS.TLSKey = c.Path(c.NATS.TLSCA), c.Path(c.NATS.TLSCert), c.Path(c.NATS.TLSKey)
	add(c.validateJobs())
	add(c.validateCache())
	add(c.validatePrefixes())
	add(c.validateDevices())
	for _, name := range c.Order("models", keys(c.Models)) {
		add(c.validateModel(name, c.Models[name]))
	}
	for _, name := range c.PoolNames() {
		add(c.validatePool(name, c.Pools[name]))
	}
	for _, name := range c.Order("classes", keys(c.Classes)) {
		add(c.validateClass(name, c.Classes[name]))
	}
	return errors.Join(errs...)
}

// errList gathers a validation's errors, nil ones left out.
type errList []error

// add appends err to the list unless it is nil.
func (l *errList) add(err error) {
	if err != nil {
		*l = append(*l, err)
	}
}

// validateServices checks the scalar keys of [nats], [gateway], [health] and [security].
func (c *Config) validateServices() error {
	var errs errList
	add := errs.add
	if c.NATS.URL == "" && !c.NATS.Embedded {
		add(c.errf("nats", "set url (an external NATS server) or embedded = true"))
	}
	if id := c.Gateway.Identity; id != IdentityLocal && id != IdentityAccount {
		add(c.errf("gateway.identity", "want %q or %q, got %q", IdentityLocal, IdentityAccount, id))
	}
	if p := c.Gateway.Policy; p != PolicyPriority && p != PolicyFIFO {
		add(c.errf("gateway.policy", "want %q or %q, got %q", PolicyPriority, PolicyFIFO, p))
	}
	if c.Gateway.ReserveWindow < 0 {
		add(c.errf("gateway.reserve_window", "must not be negative (0 turns the reservation off)"))
	}
	add(c.validateHTTP())
	if c.Health.HeartbeatInterval < Duration(10*time.Millisecond) {
		add(c.errf("health.heartbeat_interval", "must be at least 10ms"))
	}
	if c.Health.MissCount < 1 {
		add(c.errf("health.miss_count", "must be at least 1"))
	}
	if c.Security.MaxImagePixels < 1 {
		add(c.errf("security.max_image_pixels", "must be positive"))
	}
	if c.Security.MaxImageBytes < 1 {
		add(c.errf("security.max_image_bytes", "must be positive"))
	}
	if c.Security.SpoolMaxAge < 0 {
		add(c.errf("security.spool_max_age", "must not be negative (0 keeps spool files forever)"))
	}
	return errors.Join(errs...)
}

// validateSecurityPaths makes the roots of [security] absolute and checks that the
// spool and the fsync roots are where they may be written.
func (c *Config) validateSecurityPaths() error {
	var errs errList
	add := errs.add
	for i, r := range c.Security.AllowedRoots {
		c.Security.AllowedRoots[i] = c.Path(r)
	}
	for i, r := range c.Security.OutputRoots {
		if r == "" {
			add(c.errf("security.output_roots", "an output root must not be empty"))
			continue
		}
		c.Security.OutputRoots[i] = c.Path(r)
		if c.Security.OutputRoots[i] == "/" {
			add(c.errf("security.output_roots", "the filesystem root cannot be an output root"))
		}
	}
	if c.Security.SpoolDir != "" {
		c.Security.SpoolDir = c.Path(c.Security.SpoolDir)
		if !within(c.Security.SpoolDir, c.Security.AllowedRoots) {
			add(c.errf("security.spool_dir", "%s is not inside any of allowed_roots", c.Security.SpoolDir))
		}
	}
	for i, r := range c.Security.FsyncRoots {
		c.Security.FsyncRoots[i] = c.Path(r)
		if !slices.Contains(c.Security.WriteRoots(), c.Security.FsyncRoots[i]) {
			add(c.errf("security.fsync_roots", "%s is not one of the write roots (spool_dir, output_roots)", c.Security.FsyncRoots[i]))
		}
	}
	return errors.Join(errs...)
}

// validatePrefixes checks nats.inbox_prefix and nats.reply_prefixes.
func (c *Config) validatePrefixes() error {
	var errs errList
	add := errs.add
	if err := checkInboxPrefix(c.NATS.InboxPrefix); err != nil {
		add(c.errf("nats.inbox_prefix", "%v", err))
	}
	for _, p := range c.NATS.ReplyPrefixes {
		if err := checkInboxPrefix(p); p == "" || err != nil {
			add(c.errf("nats.reply_prefixes", "%q: want a subject without wildcards, spaces or empty tokens, e.g. \"_INBOX_app1\"", p))
		}
	}

	return errors.Join(errs...)
}

// validateDevices gives each [devices.NAME] its safe_fraction default and checks its
// reservations and gating class.
func (c *Config) validateDevices() error {
	var errs errList
	add := errs.add
	for name, d := range c.Devices {
		if d.SafeFraction == 0 {
			d.SafeFraction = DefaultSafeFraction
			c.Devices[name] = d
		}
		if d.SafeFraction <= 0 || d.SafeFraction > 1 {
			add(c.errf("devices."+name+".safe_fraction", "must be in (0, 1], got %v", d.SafeFraction))
		}
		var reserved Bytes
		for class, b := range d.Reserve {
			if _, ok := c.Classes[class]; !ok {
				add(c.errf("devices."+name+".reserve", "class %q is not configured", class))
			}
			if b < 0 {
				add(c.errf("devices."+name+".reserve", "%s: must not be negative", class))
			}
			reserved += b
		}
		if d.Capacity > 0 && float64(reserved) > float64(d.Capacity)*d.SafeFraction {
			add(c.errf("devices."+name+".reserve", "reservations (%d bytes) exceed the budget (capacity x safe_fraction)", reserved))
		}
		if _, ok := c.Classes[d.GateClass]; d.GateClass != "" && !ok {
			add(c.errf("devices."+name+".gate_class", "class %q is not configured", d.GateClass))
		}
	}
	return errors.Join(errs...)
}

func (c *Config) validateModel(name string, m *Model) error {
	key := "models." + name
	if err := subjects.ValidateToken("model", name); err != nil {
		return c.errf(key, "%v", err)
	}
	if _, ok := KindOf(m.Kind); !ok {
		return c.errf(key+".kind", "unknown model kind %q (want one of %s)", m.Kind, strings.Join(KnownKinds, ", "))
	}
	if m.Dir == "" && m.HFRepo == "" {
		return c.errf(key, "set dir (the model's folder) or hf_repo (ORG/NAME in the Hugging Face cache)")
	}
	if m.HFRepo != "" && strings.Count(m.HFRepo, "/") != 1 {
		return c.errf(key+".hf_repo", "want ORG/NAME, got %q", m.HFRepo)
	}
	m.Dir = c.Path(m.Dir)
	for _, f := range []struct {
		k string
		v float64
	}{{"general_threshold", m.General}, {"character_threshold", m.Character}, {"conf", m.Conf}, {"iou", m.IoU}} {
		if f.v < 0 || f.v > 1 {
			return c.errf(key+"."+f.k, "must be in [0, 1], got %v", f.v)
		}
	}
	if m.MaxBatch < 0 {
		return c.errf(key+".max_batch", "must not be negative")
	}
	return nil
}

func (c *Config) validatePool(name string, p *Pool) error {
	key := "pools." + name
	if err := subjects.ValidateToken("pool", name); err != nil {
		return c.errf(key, "%v", err)
	}
	for _, ep := range append([]string{p.EP}, p.Fallback...) {
		if !slices.Contains(KnownEPs, ep) {
			return c.errf(key+".ep", "unknown execution provider %q (want one of %s)", ep, strings.Join(KnownEPs, ", "))
		}
	}
	if !p.AllowsCPUFallback() && (p.EP == "" || p.EP == "cpu") {
		return c.errf(key+".cpu_fallback", "false needs an ep other than cpu (every node of a cpu pool is on the CPU)")
	}
	if why := p.adapterMismatchProblem(); why != "" {
		return c.errf(key+".adapter_mismatch", "%s", why)
	}
	if p.Workers < 0 || p.Slots < 1 || p.Threads < 0 || p.QueueBound < 1 {
		return c.errf(key, "workers must be >= 0, slots >= 1, threads >= 0, queue_bound >= 1")
	}
	switch v := p.Spin.(type) {
	case nil, bool:
	case string:
		if v != SpinAuto {
			return c.errf(key+".spin", "want \"auto\", true or false, not %q", v)
		}
	default:
		return c.errf(key+".spin", "want \"auto\", true or false")
	}
	if p.PendingMsgs < 1 {
		return c.errf(key+".pending_msgs", "must be at least 1 (0 is refused by NATS)")
	}
	if len(p.Classes) == 0 {
		return c.errf(key+".classes", "a pool must serve at least one class")
	}
	if len(p.Models) > codec.MaxHeartbeatList || len(p.Classes) > codec.MaxHeartbeatList {
		// A worker's heartbeat lists them; a gateway drops a longer list (a pool that
		// would never go live).
		return c.errf(key, "a pool loads at most %d models and serves at most %d classes (split it into pools)", codec.MaxHeartbeatList, codec.MaxHeartbeatList)
	}
	for _, cl := range p.Classes {
		if _, ok := c.Classes[cl]; !ok {
			return c.errf(key+".classes", "unknown class %q", cl)
		}
	}
	if len(p.Models) == 0 {
		return c.errf(key+".models", "a pool must load at least one model")
	}
	for _, m := range p.Models {
		if _, ok := c.Models[m]; !ok {
			return c.errf(key+".models", "unknown model %q (define it under [models.%s])", m, m)
		}
	}
	if p.Device == "" && p.EP == "webgpu" {
		return c.errf(key+".device", "a webgpu pool names the GPU its adapter is on, for memory admission: cuda:N (NVIDIA, read through nvidia-smi), drm:N (AMD or Intel, /dev/dri/cardN), or cpu (lavapipe)")
	}
	if d := p.Device; d != "cpu" && !strings.Contains(d, ":") {
		return c.errf(key+".device", "want cpu or KIND:INDEX (cuda:0, gpu.intel:0), got %q", d)
	}
	p.Runtime = c.Path(p.Runtime)
	for i, d := range p.RuntimeDirs {
		p.RuntimeDirs[i] = c.Path(d)
	}
	p.Worker = c.Path(p.Worker)
	for from, to := range p.PathMap {
		if !filepath.IsAbs(from) || !filepath.IsAbs(to) {
			return c.errf(key+".path_map", "prefixes must be absolute: %q = %q", from, to)
		}
	}
	if p.MaxBatch < 0 {
		return c.errf(key+".max_batch", "must not be negative")
	}
	if p.DecodeThreads < 0 || p.DecodeThreads > maxDecodeThreads {
		return c.errf(key+".decode_threads", "must be in 0..%d (0: the cores the pool's intra-op threads leave free)", maxDecodeThreads)
	}
	if p.Nice < 0 || p.Nice > 19 {
		return c.errf(key+".nice", "must be in 0..19")
	}
	if k := p.KeepAlive; k != "" && k != "-1" && k != "0" {
		if d, err := time.ParseDuration(k); err != nil || d < 0 {
			return c.errf(key+".keep_alive", "%q: want a duration (\"5m\"), \"0\" (stop after each use) or \"-1\" (never)", k)
		}
	}
	if _, unload := p.Idle(); unload && !p.IsLocal() {
		return c.errf(key+".keep_alive", "only a local pool's workers can be stopped when idle")
	}
	if n := p.NATS; n != nil {
		switch {
		case n.CredsFile == "" && n.User == "":
			return c.errf(key+".nats", "set user (with password_file) or creds_file: the pool's workers' own NATS identity")
		case n.CredsFile != "" && (n.User != "" || n.PasswordFile != ""):
			return c.errf(key+".nats", "set creds_file, or user with password_file, not both")
		case n.User != "" && n.PasswordFile == "":
			// ORTBUS_NATS_PASSWORD is the gateway's own password, which its local workers
			// do not get.
			return c.errf(key+".nats", "user %q needs a password_file (ORTBUS_NATS_PASSWORD is [nats]'s password)", n.User)
		}
		n.CredsFile, n.PasswordFile = c.Path(n.CredsFile), c.Path(n.PasswordFile)
	}
	return nil
}

// checkInboxPrefix refuses an inbox prefix that is not a plain subject (nats.go would
// refuse it at connect time, or the server would never match it).
func checkInboxPrefix(p string) error {
	if p == "" {
		return nil
	}
	if strings.ContainsAny(p, "*> \t\r\n") || strings.HasPrefix(p, ".") || strings.HasSuffix(p, ".") || strings.Contains(p, "..") {
		return errors.New("want a subject without wildcards, spaces or empty tokens, e.g. \"_INBOX_gateway\"")
	}
	return nil
}

// maxDecodeThreads bounds a pool's decode_threads: each is a goroutine holding one
// decoded item.
const maxDecodeThreads = 1024

func (c *Config) validateClass(name string, cl *Class) error {
	key := "classes." + name
	if err := subjects.ValidateToken("class", name); err != nil {
		return c.errf(key, "%v", err)
	}
	if cl.QueueBound < 1 {
		return c.errf(key+".queue_bound", "must be at least 1")
	}
	if cl.Timeout <= 0 || cl.MaxTimeout < cl.Timeout {
		return c.errf(key, "timeout must be positive and max_timeout >= timeout")
	}
	if cl.Shed != ShedRejectNew && cl.Shed != ShedDropOldest {
		return c.errf(key+".shed", "want %s or %s, got %q", ShedRejectNew, ShedDropOldest, cl.Shed)
	}
	if cl.MinShare < 0 || cl.MinShare >= 1 {
		return c.errf(key+".min_share", "must be in [0, 1)")
	}
	for _, pn := range cl.Chain {
		p, ok := c.Pools[pn]
		if !ok {
			return c.errf(key+".chain", "unknown pool %q", pn)
		}
		if !slices.Contains(p.Classes, name) {
			return c.errf(key+".chain", "pool %q does not serve class %q (add it to pools.%s.classes)", pn, name, pn)
		}
	}
	for op, m := range cl.Models {
		mc, ok := c.Models[m]
		if !ok {
			return c.errf(key+".models."+op, "unknown model %q", m)
		}
		if k, ok := KindOf(mc.Kind); ok && !k.Serves(op) {
			return c.errf(key+".models."+op, "model %q (%s) does not serve op %q (it serves %s)", m, mc.Kind, op, strings.Join(k.Ops, ", "))
		}
	}
	return nil
}

// within reports whether path lies inside one of roots (lexically).
func within(path string, roots []string) bool {
	for _, r := range roots {
		rel, err := filepath.Rel(r, path)
		if err == nil && rel != ".." && !strings.HasPrefix(rel, "../") {
			return true
		}
	}
	return false
}

func keys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	return out
}

func (c *Config) validateCache() error {
	k := c.Cache
	var errs []error
	if k.MaxBytes < 64<<10 {
		errs = append(errs, c.errf("cache.max_bytes", "must be at least 64KiB"))
	}
	if k.Replicas < 1 || k.Replicas > 5 {
		errs = append(errs, c.errf("cache.replicas", "want 1 to 5, got %d", k.Replicas))
	}
	if k.StatEntries < 1 || k.StatEntries > 1<<24 {
		errs = append(errs, c.errf("cache.stat_entries", "want 1 to 16777216, got %d", k.StatEntries))
	}
	if k.MaxAge < 0 || k.MaxAge > 0 && k.MaxAge < Duration(time.Minute) {
		errs = append(errs, c.errf("cache.max_age", "must be 0 (no limit) or at least 1m"))
	}
	if k.Enabled && c.Jobs.Disabled {
		errs = append(errs, c.errf("cache.enabled", "the cache needs the job store's JetStream: jobs.disabled is set"))
	}
	return errors.Join(errs...)
}

func (c *Config) validateJobs() error {
	j := c.Jobs
	var errs []error
	if j.Replicas < 1 || j.Replicas > 5 {
		errs = append(errs, c.errf("jobs.replicas", "want 1 to 5, got %d", j.Replicas))
	}
	if j.AckWait < Duration(time.Second) {
		errs = append(errs, c.errf("jobs.ack_wait", "must be at least 1s"))
	}
	if j.MaxAckPending < 1 {
		errs = append(errs, c.errf("jobs.max_ack_pending", "must be at least 1"))
	}
	if j.MaxDeliveries < 2 {
		errs = append(errs, c.errf("jobs.max_deliveries", "must be at least 2"))
	}
	if j.MaxItems < 1 {
		errs = append(errs, c.errf("jobs.max_items", "must be at least 1"))
	}
	if j.MaxRunning < 1 {
		errs = append(errs, c.errf("jobs.max_running", "must be at least 1"))
	}
	if j.ItemsMaxBytes < 1<<20 || j.ResultsMaxBytes < 1<<20 {
		errs = append(errs, c.errf("jobs", "items_max_bytes and results_max_bytes must be at least 1MiB"))
	}
	if j.ResultsMaxAge < Duration(time.Minute) {
		errs = append(errs, c.errf("jobs.results_max_age", "must be at least 1m"))
	}
	for _, w := range j.Windows {
		if _, _, err := parseWindow(w); err != nil {
			errs = append(errs, c.errf("jobs.windows", "%v", err))
		}
	}
	return errors.Join(errs...)
}
