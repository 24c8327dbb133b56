// Package config reads the one ortbus configuration file (TOML) that every binary uses:
// the NATS connection, pools, models, classes, security and health settings. Load
// validates everything at once and refuses unknown keys and bad values, naming the file,
// the line and the reason, so a typo fails at start-up rather than at the first request.
//
// Relative paths in the file are taken relative to the file's own directory.
//
// Marshal and Write write a configuration back as a file that Load reads into the same
// values; the tests and the bench build theirs in code and write them so.
package config

import (
	"fmt"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/ortbus/ortbus/subjects"
)

// Config is the whole configuration.
type Config struct {
	NATS     NATS              `toml:"nats,omitempty"`
	Gateway  Gateway           `toml:"gateway,omitempty"`
	Health   Health            `toml:"health,omitempty"`
	Security Security          `toml:"security,omitempty"`
	Devices  map[string]Device `toml:"devices,omitempty"`
	Classes  map[string]*Class `toml:"classes,omitempty"`
	Pools    map[string]*Pool  `toml:"pools,omitempty"`
	Models   map[string]*Model `toml:"models,omitempty"`
	Jobs     Jobs              `toml:"jobs,omitempty"`
	Cache    Cache             `toml:"cache,omitempty"`

	// File is the path the configuration was read from ("" when parsed from bytes).
	File string `toml:"-"`
	// lines maps dotted key paths to their line in the file, for error messages.
	lines map[string]int
	// order is the order of a section's names set in code (SetOrder).
	order map[string][]string
}

// NATS says how to reach the bus: an external server (URL) or an embedded one.
type NATS struct {
	// URL of an external NATS server (or a comma-separated list for a cluster).
	URL string `toml:"url,omitempty"`
	// Embedded runs a NATS server inside the gateway process.
	Embedded bool `toml:"embedded,omitempty"`
	// Listen is the embedded server's client address (default 127.0.0.1:4222; port 0 = any).
	Listen string `toml:"listen,omitempty"`
	// StoreDir enables JetStream in the embedded server with this store directory.
	StoreDir string `toml:"store_dir,omitempty"`
	// Name is the client connection name prefix.
	Name string `toml:"name,omitempty"`
	// CredsFile, User/PasswordFile authenticate to a secured server (never inline secrets).
	CredsFile    string `toml:"creds_file,omitempty"`
	User         string `toml:"user,omitempty"`
	PasswordFile string `toml:"password_file,omitempty"`
	// TLS to the server: a CA file to trust, and a client certificate for mutual TLS.
	TLSCA   string `toml:"tls_ca,omitempty"`
	TLSCert string `toml:"tls_cert,omitempty"`
	TLSKey  string `toml:"tls_key,omitempty"`
	// InboxPrefix replaces nats.go's _INBOX as the prefix of this process's reply
	// subjects. A server that lets each user subscribe only to its own prefix (the
	// gateway role of deploy/cluster/permissions.conf: _INBOX_gateway.>) keeps one user
	// from reading another's replies.
	InboxPrefix string `toml:"inbox_prefix,omitempty"`
	// ReplyPrefixes are the only reply destinations a gateway or worker publishes an answer
	// to on a requester's behalf (subjects.CheckReply): a request whose reply subject is
	// under none of them is dropped and counted, never answered or forwarded. Default
	// subjects.DefaultReplyPrefixes; inbox_prefix is always added (the gateway's own
	// requests to workers come back to it). Each is a subject of whole tokens, e.g.
	// "_INBOX_app1".
	ReplyPrefixes []string `toml:"reply_prefixes,omitempty"`
}

// Replies is the effective list of reply prefixes: reply_prefixes (or the defaults) and
// inbox_prefix.
func (n *NATS) Replies() []string {
	out := n.ReplyPrefixes
	if len(out) == 0 {
		out = subjects.DefaultReplyPrefixes
	}
	if n.InboxPrefix != "" && !slices.Contains(out, n.InboxPrefix) {
		out = append(slices.Clip(out), n.InboxPrefix)
	}
	return out
}

// Credentials is a NATS identity of its own, with the keys of [nats]: a credentials file,
// or a user whose password is the first line of password_file (never a secret written in
// the config; the environment's ORTBUS_NATS_PASSWORD is the gateway's, not the pool's).
type Credentials struct {
	CredsFile    string `toml:"creds_file,omitempty"`
	User         string `toml:"user,omitempty"`
	PasswordFile string `toml:"password_file,omitempty"`
}

// Gateway holds settings of the gateway process.
type Gateway struct {
	// ID names this gateway on the bus (claims subject); default: host-pid.
	ID string `toml:"id,omitempty"`
	// HTTPListen is the loopback address of the HTTP API and /metrics ("" = off).
	HTTPListen string `toml:"http_listen,omitempty"`
	// ShutdownGrace is how long workers get to drain on SIGTERM before being killed.
	ShutdownGrace Duration `toml:"shutdown_grace,omitempty"`
	// Restart backoff for supervised workers, and the crash-loop rule: CrashLoopCount
	// deaths within CrashLoopWindow mark a pool crash-looping.
	RestartBackoffMin Duration `toml:"restart_backoff_min,omitempty"`
	RestartBackoffMax Duration `toml:"restart_backoff_max,omitempty"`
	CrashLoopCount    int      `toml:"crash_loop_count,omitempty"`
	CrashLoopWindow   Duration `toml:"crash_loop_window,omitempty"`
	// Policy is the scheduling policy: "priority" (the default: strict class priority,
	// batch held to one unit in flight on a device while higher classes are busy there, a
	// device's last free slot kept from batch for ReserveWindow after urgent or interactive
	// work there, deadline feasibility) or "fifo" (arrival order, no sharing rule; for
	// comparison).
	Policy string `toml:"policy,omitempty"`
	// ReserveWindow is the hysteresis of the sharing policy's reservation (default
	// DefaultReserveWindow): while urgent or interactive work (a class of priority 0 or 1)
	// was queued for, or running on, a device within the last ReserveWindow, batch work
	// (priority 2 and below) may not take that device's last free slot beyond its floor of
	// one unit (or min_share), so the next urgent or interactive request finds a slot. "0s"
	// turns the reservation off. Its zero is a value of its own: Marshal always writes it.
	ReserveWindow Duration `toml:"reserve_window"`
	// Failover: this gateway records the requests it accepts over NATS, and their
	// answers, in the JetStream bucket ortbus_answers, so that a client's resend after a
	// gateway died is answered once (gateway/failover.go).
	Failover bool `toml:"failover,omitempty"`
	// Identity says who owns requests, jobs and leases (gateway/account.go): "local"
	// (the default: one owner, every requester on the bus) or "account" (each
	// application in a NATS account of its own importing the API; its account, from the
	// Nats-Request-Info header nats-server writes on the import, is the owner).
	Identity string `toml:"identity,omitempty"`
	// RelayReplies sends every worker's reply back through the gateway. By default a
	// worker answers a request that came over NATS in msgpack straight to the client's
	// reply subject and tells the gateway with a small notice (gateway/request.go,
	// replyDirect), which saves one leg of the bus; requests over HTTP or in JSON, job
	// items, pools with a path_map and gateways with failover are always relayed.
	RelayReplies bool `toml:"relay_replies,omitempty"`

	// The HTTP API's guards. HTTPHosts are extra names (host or host:port) a request's
	// Host header may carry besides the listen address (and, on loopback, localhost,
	// 127.0.0.1 and [::1] with its port); any other Host is refused (DNS rebinding).
	HTTPHosts []string `toml:"http_hosts,omitempty"`
	// HTTPTokenFile is a file holding a bearer token (never the token itself in this
	// file; ORTBUS_HTTP_TOKEN when unset): with a token, every route but /healthz needs
	// `Authorization: Bearer TOKEN`.
	HTTPTokenFile string `toml:"http_token_file,omitempty"`
	// HTTPAccounts gives applications bearer tokens of their own on the HTTP API (and
	// its page): account NAME -> a file holding NAME's token. A request bearing it is
	// served as the account "account:NAME" (gateway/account.go): it sees and acts on its
	// own jobs, leases, pauses and cache entries only, as the NATS account NAME does under
	// identity = "account". The operator's token (HTTPTokenFile or ORTBUS_HTTP_TOKEN) must
	// be set beside them, else a request without any token would be the operator's.
	HTTPAccounts map[string]string `toml:"http_accounts,omitempty"`
	// HTTPMaxBody bounds a request body (default 8MiB); a larger one is answered 413.
	HTTPMaxBody Bytes `toml:"http_max_body,omitempty"`
	// HTTPMaxConcurrent bounds the API requests served at once (default 256); one more
	// is answered 429 overloaded at once.
	HTTPMaxConcurrent int `toml:"http_max_concurrent,omitempty"`

	// LeaseMaxTTL bounds a memory lease's ttl (default 10m): a holder that stops renewing
	// loses its lease within this. A lease asked without a ttl gets LeaseDefaultTTL
	// (default 30s).
	LeaseMaxTTL     Duration `toml:"lease_max_ttl,omitempty"`
	LeaseDefaultTTL Duration `toml:"lease_default_ttl,omitempty"`
}

// Jobs configures durable batch jobs (package jobs), kept in JetStream: they run
// wherever the NATS server has JetStream (the embedded server does when nats.store_dir
// is set), and the job API answers unavailable where it has not.
type Jobs struct {
	// Disabled turns the job API and the job consumer off.
	Disabled bool `toml:"disabled,omitempty"`
	// Replicas of the job streams and bucket (3 on a 3-node cluster; default 1).
	Replicas int `toml:"replicas,omitempty"`
	// AckWait is how long an item may go without word from its gateway (a progress ack
	// every third of it while it runs) before JetStream gives it to another (default 30s).
	AckWait Duration `toml:"ack_wait,omitempty"`
	// MaxAckPending bounds the items delivered and not yet answered, across all gateways
	// (default 256); each gateway also takes no more than its batch pools have room for.
	MaxAckPending int `toml:"max_ack_pending,omitempty"`
	// MaxDeliveries: an item delivered this many times without a result (the gateway or
	// the whole stack died while it ran, each time) is answered poison_input instead of
	// being run again (default 3: an item runs at most twice).
	MaxDeliveries int `toml:"max_deliveries,omitempty"`
	// MaxItems bounds the items of one job (default 1,000,000).
	MaxItems int `toml:"max_items,omitempty"`
	// MaxRunning bounds the jobs running at once (submitted, not yet done, cancelled or
	// failed; default 256): past it a submit is answered overloaded. One owner other than
	// the local one may run a quarter of it (gateway/account.go).
	MaxRunning int `toml:"max_running,omitempty"`
	// ItemsMaxBytes bounds the stream of items waiting to run (default 1GiB); a submit
	// past it is answered overloaded.
	ItemsMaxBytes Bytes `toml:"items_max_bytes,omitempty"`
	// ResultsMaxBytes bounds the stored results (default 4GiB); ResultsMaxAge is how long
	// a job and its results are kept (default 168h).
	ResultsMaxBytes Bytes    `toml:"results_max_bytes,omitempty"`
	ResultsMaxAge   Duration `toml:"results_max_age,omitempty"`
	// Windows are the quiet hours in which jobs take new items, each "HH:MM-HH:MM" in the
	// gateway's local time (one past midnight, e.g. "22:00-07:00", spans it); none: any
	// time. Outside them the items wait in JetStream (those of jobs submitted anytime
	// excepted: jobs rule 9), and an item already running finishes. See InWindow.
	Windows []string `toml:"windows,omitempty"`
}

// Cache configures the gateway's content-addressed result cache (package cache), kept in
// JetStream next to the jobs: a tag, embed or detect answer is kept under the hash of
// the image's bytes, the model's revision (a hash of its files and settings), the op and
// the options that change the answer, and served again for the same bytes.
type Cache struct {
	// Enabled turns the cache on (default off). It needs JetStream, as jobs do.
	Enabled bool `toml:"enabled,omitempty"`
	// MaxBytes bounds the stored entries (default 1GiB, at least 64KiB): a write that
	// finds the bucket full evicts the oldest written entries first.
	MaxBytes Bytes `toml:"max_bytes,omitempty"`
	// Replicas of the cache's stream (default: jobs.replicas).
	Replicas int `toml:"replicas,omitempty"`
	// StatEntries bounds the files whose stat key and content hash the gateway remembers
	// (default 262144; least recently used forgotten first).
	StatEntries int `toml:"stat_entries,omitempty"`
	// MaxAge drops entries older than this (default 0: kept until evicted).
	MaxAge Duration `toml:"max_age,omitempty"`
}

// InWindow reports whether t falls in one of the jobs' windows (always, without any).
// Windows are checked by validateJobs.
func (j *Jobs) InWindow(t time.Time) bool {
	if len(j.Windows) == 0 {
		return true
	}
	m := t.Hour()*60 + t.Minute()
	for _, w := range j.Windows {
		from, to, err := parseWindow(w)
		if err != nil {
			continue
		}
		if from <= to && m >= from && m < to || from > to && (m >= from || m < to) {
			return true
		}
	}
	return false
}

// parseWindow reads "HH:MM-HH:MM" as minutes of the day.
func parseWindow(w string) (from, to int, err error) {
	a, b, ok := strings.Cut(w, "-")
	if !ok {
		return 0, 0, fmt.Errorf("window %q: want HH:MM-HH:MM", w)
	}
	if from, err = parseClock(a); err == nil {
		to, err = parseClock(b)
	}
	if err == nil && from == to {
		err = fmt.Errorf("window %q is empty", w)
	}
	return from, to, err
}

func parseClock(s string) (int, error) {
	t, err := time.Parse("15:04", strings.TrimSpace(s))
	if err != nil {
		return 0, fmt.Errorf("%q is not HH:MM", s)
	}
	return t.Hour()*60 + t.Minute(), nil
}

// Health holds heartbeat settings shared by workers and gateways.
type Health struct {
	HeartbeatInterval Duration `toml:"heartbeat_interval,omitempty"`
	// MissCount heartbeats missed in a row mark a worker dead.
	MissCount int `toml:"miss_count,omitempty"`
}

// Security bounds what a request may touch.
type Security struct {
	// AllowedRoots are the only directories image paths may resolve into.
	AllowedRoots []string `toml:"allowed_roots,omitempty"`
	// SpoolDir is an allowed directory where clients may write temporary images.
	SpoolDir string `toml:"spool_dir,omitempty"`
	// MaxImagePixels refuses larger images before decoding them.
	MaxImagePixels int64 `toml:"max_image_pixels,omitempty"`
	// MaxImageBytes refuses larger image files before reading them (and bounds the read).
	MaxImageBytes Bytes `toml:"max_image_bytes,omitempty"`
	// OutputRoots are directories, besides SpoolDir, under which a request's out_path may
	// be written. Outputs are never written anywhere else, not even under AllowedRoots.
	OutputRoots []string `toml:"output_roots,omitempty"`
	// FsyncRoots are the write roots (spool_dir, output_roots) whose output files are
	// fsynced before the answer: durable across a power loss. Default: every output root,
	// and not the spool (its files are temporary, read by the client right after the
	// answer, from the page cache; the sync would only add to every answer's time).
	FsyncRoots []string `toml:"fsync_roots,omitempty"`
	// SpoolMaxAge is the age past which the gateway removes files from SpoolDir
	// (default 1h; "0s" keeps them forever). Its zero is a value of its own, so that
	// Marshal always writes it (as do gateway.reserve_window and a class's priority and
	// min_share); every other key is left out when zero, and Load gives it its default.
	SpoolMaxAge Duration `toml:"spool_max_age"`
}

// SyncRoots are the write roots whose outputs are fsynced: FsyncRoots when set, else
// OutputRoots.
func (s *Security) SyncRoots() []string {
	if s.FsyncRoots != nil {
		return s.FsyncRoots
	}
	return s.OutputRoots
}

// WriteRoots are the directories under which outputs may be written: SpoolDir (if set)
// and OutputRoots.
func (s *Security) WriteRoots() []string {
	var out []string
	if s.SpoolDir != "" {
		out = append(out, s.SpoolDir)
	}
	return append(out, s.OutputRoots...)
}

// Device is a physical device shared by the pools that name it, with a memory budget.
type Device struct {
	// Capacity in bytes; 0 = read it from the device (host memory for cpu).
	Capacity Bytes `toml:"capacity,omitempty"`
	// SafeFraction of the capacity that admitted peaks may use (default 0.85).
	SafeFraction float64 `toml:"safe_fraction,omitempty"`
	// Reserve keeps part of the budget for a class ([devices.NAME.reserve] urgent =
	// "2GiB"): only pools and leases of that class or a higher one may use it, so batch
	// pools and batch leases never can (gateway/admission.go).
	Reserve map[string]Bytes `toml:"reserve,omitempty"`
	// GateClass is the class whose work on the device pauses the processes of gated
	// leases (`ortbus lease --gate`), with every class of a higher priority; default
	// urgent (gateway/gate.go).
	GateClass string `toml:"gate_class,omitempty"`
}

// Class is a latency class.
type Class struct {
	// Priority orders classes: lower runs first (urgent 0, interactive 1, batch 2).
	Priority int `toml:"priority"`
	// Timeout is the default deadline of a request; MaxTimeout caps a request's timeout_ms.
	Timeout    Duration `toml:"timeout,omitempty"`
	MaxTimeout Duration `toml:"max_timeout,omitempty"`
	// QueueBound is how many requests may wait in the gateway's queue of this class.
	QueueBound int `toml:"queue_bound,omitempty"`
	// QueueBytes bounds the size of the requests waiting in the class's queue too
	// (default DefaultQueueBytes), so that a flood of large requests is refused
	// (overloaded) before it fills the gateway's memory.
	QueueBytes Bytes `toml:"queue_bytes,omitempty"`
	// Chain is the ordered list of pools that may serve the class.
	Chain []string `toml:"chain,omitempty"`
	// Shed is what a full queue does: reject_new (answer overloaded) or drop_oldest.
	Shed string `toml:"shed,omitempty"`
	// Degrade routes to the next pool of the chain when the preferred one cannot meet the
	// deadline, instead of waiting.
	Degrade bool `toml:"degrade,omitempty"`
	// MinShare is the minimum share of a shared device's dispatches kept for this class
	// while higher classes are busy (batch starvation bound), 0..1.
	MinShare float64 `toml:"min_share"`
	// Models maps an op to the class's default model name.
	Models map[string]string `toml:"models,omitempty"`
}

// Pool is a named set of identical workers on one runtime and execution provider.
type Pool struct {
	// Runtime is the path of libonnxruntime.so for this pool (its own prefix, never the
	// system one). RuntimeDirs are more directories searched for it.
	Runtime     string   `toml:"runtime,omitempty"`
	RuntimeDirs []string `toml:"runtime_dirs,omitempty"`
	// EP is the execution provider: cpu, cuda, openvino, tensorrt.
	EP string `toml:"ep,omitempty"`
	// EPOptions are the provider's options (device_id, device_type, precision, ...).
	EPOptions map[string]string `toml:"ep_options,omitempty"`
	// Fallback EPs tried in order if EP cannot be appended (strict when empty).
	Fallback []string `toml:"fallback,omitempty"`
	// CPUFallback is whether a model may have nodes that ONNX Runtime places on its CPU
	// EP because the pool's EP has no kernel for them (the runtime's default, and
	// ortbus's: unset is true). false is strict: a model with any node off the EP its
	// session runs fails to load, naming those ops (ep other than cpu only).
	CPUFallback *bool `toml:"cpu_fallback,omitempty"`
	// Device is the physical device, e.g. cpu, cuda:0, gpu.intel:0.
	Device string `toml:"device,omitempty"`
	// AdapterMismatch is what a worker of a webgpu pool does when the Vulkan adapter its
	// sessions would run on is not the GPU Device names (llvmpipe for cuda:0): "refuse"
	// (the default: the worker fails to start, provider_unavailable, naming both) or
	// "flag" (it serves, and its heartbeat, status and doctor say so). See adapter.go.
	AdapterMismatch string `toml:"adapter_mismatch,omitempty"`
	// Env is extra environment for the pool's worker processes.
	Env map[string]string `toml:"env,omitempty"`
	// Workers is the number of worker processes (local pools).
	Workers int `toml:"workers,omitempty"`
	// Slots is how many inferences one worker runs at once.
	Slots int `toml:"slots,omitempty"`
	// Threads is ONNX Runtime's intra-op thread count (0 = runtime default).
	Threads int `toml:"threads,omitempty"`
	// Spin is whether the intra-op threads spin (busy-wait) between parallel sections:
	// "auto" (the default), true or false. See Config.Spins.
	Spin any `toml:"spin,omitempty"`
	// PendingMsgs bounds each work subscription's pending messages in the client.
	PendingMsgs int `toml:"pending_msgs,omitempty"`
	// QueueBound is how many items one worker holds queued per class before answering
	// overloaded.
	QueueBound int `toml:"queue_bound,omitempty"`
	// Classes served by this pool.
	Classes []string `toml:"classes,omitempty"`
	// Models loaded by this pool's workers.
	Models []string `toml:"models,omitempty"`
	// Local pools are supervised by the gateway; remote ones are known by heartbeats.
	Local *bool `toml:"local,omitempty"`
	// LazyLoad starts a local pool's workers on the pool's first request instead of at
	// gateway start; that request waits for them (the wait is in its timing.queue_us).
	LazyLoad bool `toml:"lazy_load,omitempty"`
	// KeepAlive stops a local pool's workers once the pool has been idle that long,
	// releasing their memory in the admission; its next request starts them again, as for
	// lazy_load (Ollama's keep_alive): a duration ("5m"), "0" (stop after each use), or
	// "-1" / unset (never: the workers stay loaded). See Pool.Idle.
	KeepAlive string `toml:"keep_alive,omitempty"`
	// MaxBatch and MaxDelay bound dynamic batching of the batch class (MaxBatch <= 1: off).
	MaxBatch int      `toml:"max_batch,omitempty"`
	MaxDelay Duration `toml:"max_delay,omitempty"`
	// DecodeThreads is how many items one worker decodes at once beside its inference
	// (images decoded, tensors read, ahead of the slots); 0: DecodeWorkers's default.
	DecodeThreads int `toml:"decode_threads,omitempty"`
	// PathMap maps path prefixes as the clients see them to prefixes on this pool's host.
	PathMap map[string]string `toml:"path_map,omitempty"`
	// Worker is the ortworker binary to run (default: next to the gateway binary).
	Worker string `toml:"worker,omitempty"`
	// Nice is the CPU scheduling niceness of local workers (0..19): a batch pool that
	// shares the CPU with interactive pools runs niced so that they keep their latency.
	Nice int `toml:"nice,omitempty"`
	// NATS is the pool's own NATS identity ([pools.NAME.nats]): its workers log in with it
	// instead of [nats]'s user, so the gateway's local workers never hold the gateway's
	// credentials (deploy/cluster: user worker-NAME). Unset: [nats]'s.
	NATS *Credentials `toml:"nats,omitempty"`

	// Name is the pool's key in the file.
	Name string `toml:"-"`
}

// DecodeWorkers is how many decode goroutines one worker of the pool runs on a machine
// of cpus cores: decode_threads when set, else the cores the pool's intra-op threads
// leave free (cpus − slots × threads, threads = 0 counting every core), at least 1.
func (p *Pool) DecodeWorkers(cpus int) int {
	if p.DecodeThreads > 0 {
		return p.DecodeThreads
	}
	intra := p.Threads
	if intra <= 0 {
		intra = cpus
	}
	return max(1, cpus-max(1, p.Slots)*intra)
}

// AllowsCPUFallback reports whether the pool's models may have nodes on the CPU EP
// beside its own (CPUFallback, default true).
func (p *Pool) AllowsCPUFallback() bool { return p.CPUFallback == nil || *p.CPUFallback }

// IsLocal reports whether the gateway supervises this pool's workers (default true).
func (p *Pool) IsLocal() bool { return p.Local == nil || *p.Local }

// HasCredentials reports whether the pool's workers log in with their own NATS identity.
func (p *Pool) HasCredentials() bool {
	return p.NATS != nil && (p.NATS.CredsFile != "" || p.NATS.User != "")
}

// WorkerNATS is the NATS section a worker of the named pool connects with: [nats], with
// the pool's own credentials in place of [nats]'s when it has them (and then no inbox
// prefix, which is the gateway's: a worker answers through the requests' reply subjects
// and makes no requests of its own).
func (c *Config) WorkerNATS(pool string) NATS {
	n := c.NATS
	if p := c.Pools[pool]; p != nil && p.HasCredentials() {
		n.CredsFile, n.User, n.PasswordFile = p.NATS.CredsFile, p.NATS.User, p.NATS.PasswordFile
		n.InboxPrefix = ""
	}
	return n
}

// Model is one model a pool may load.
type Model struct {
	// Kind is the pre/post-processing: tagger-pixai, tagger-wd14, tagger-oppai, ccip,
	// detect, segment, raw (Kinds: its ops, batching and files).
	Kind string `toml:"kind,omitempty"`
	// Dir holds the model's files; or HFRepo (ORG/NAME) finds them in the Hugging Face
	// cache ($HF_HOME/hub/models--ORG--NAME/snapshots/REV/), offline.
	Dir        string `toml:"dir,omitempty"`
	HFRepo     string `toml:"hf_repo,omitempty"`
	HFRevision string `toml:"hf_revision,omitempty"`
	// Files overrides file names inside Dir, by role (Kind.Files): model, metrics, tags,
	// thresholds, metrics_json, vocabulary.
	Files map[string]string `toml:"files,omitempty"`
	// Thresholds: general and character score thresholds (tagger kinds), conf/iou (detect).
	General   float64 `toml:"general_threshold,omitempty"`
	Character float64 `toml:"character_threshold,omitempty"`
	Conf      float64 `toml:"conf,omitempty"`
	IoU       float64 `toml:"iou,omitempty"`
	// Labels for detect outputs, in class order.
	Labels []string `toml:"labels,omitempty"`
	// Memory is a declared peak memory (used instead of a measurement when set).
	Memory Bytes `toml:"memory,omitempty"`
	// MaxBatch caps the dynamic batch of this model.
	MaxBatch int `toml:"max_batch,omitempty"`

	// Name is the model's key in the file.
	Name string `toml:"-"`
}

// MemBudgetEnv is the environment variable through which the gateway's supervisor tells
// a worker how many bytes its models may take on its device (unset: no limit).
const MemBudgetEnv = "ORTBUS_MEM_BUDGET"

// SkipModelsEnv is the environment variable through which the gateway's supervisor tells
// a worker the models of its pool not to load, and why (a JSON object, model: reason): a
// worker died natively while loading each, so loading it again would only crash again.
const SkipModelsEnv = "ORTBUS_SKIP_MODELS"

// PoolModelsEnv is the environment variable through which the gateway's supervisor tells
// a worker the models its pool loads when the operators changed them at run time (a JSON
// list; `ortbus model load|unload`): it replaces the pool's models of the file. Each must
// be a model of the file's [models].
const PoolModelsEnv = "ORTBUS_POOL_MODELS"

// Defaults used when the file leaves a value out. DefaultMaxImagePixels (16384×8192, 128 Mi
// pixels: a 100 MP camera photo of 11648×8736 fits, 512 MiB once decoded as RGBA) and
// DefaultMaxImageBytes are images.DefaultMaxPixels and images.DefaultMaxBytes.
const (
	DefaultHeartbeat      = time.Second
	DefaultMissCount      = 3
	DefaultMaxImagePixels = 16384 * 8192
	DefaultMaxImageBytes  = 128 << 20
	DefaultSpoolMaxAge    = time.Hour
	DefaultSafeFraction   = 0.85
	DefaultJobMaxItems    = 1_000_000
	DefaultJobMaxRunning  = 256
	// DefaultReserveWindow is gateway.reserve_window when the file leaves it out: longer
	// than the gaps between requests of a latency class under steady traffic (8 requests a
	// second leave a 2 s gap with probability e^-16), so the slot does not flip to batch and
	// back between two of them; short enough that batch has the whole device again soon
	// after that traffic stops.
	DefaultReserveWindow = 2 * time.Second
)

// Idle is the pool's keep_alive: how long it may stay idle before its workers are
// stopped, and whether they ever are (false: pinned, the default).
func (p *Pool) Idle() (time.Duration, bool) {
	switch p.KeepAlive {
	case "", "-1":
		return 0, false
	case "0":
		return 0, true
	}
	d, err := time.ParseDuration(p.KeepAlive)
	if err != nil || d < 0 {
		return 0, false
	}
	return d, true
}

// SpinAuto is the default of a pool's spin.
const SpinAuto = "auto"

// Spins reports whether pool's ONNX Runtime intra-op threads spin on a machine of cpus
// cores. A spinning thread busy-waits between the parallel sections of a run instead of
// sleeping: the next section starts without a wake-up (measured on PP-OCRv4 det 640, 2
// threads: about 15 % more items/s than without), but the thread keeps its core while it
// waits, which another process sharing that core loses. So spin = true or false decides;
// "auto" spins only when the local pools' intra-op threads have cores to themselves: the
// sum over local pools of workers × slots × threads is at most cpus − 1 (a core is left
// for the gateway, NATS and the workers' own goroutines), and no local pool leaves its
// thread count to the runtime (threads = 0: one per core).
func (c *Config) Spins(pool string, cpus int) bool {
	p := c.Pools[pool]
	if p == nil {
		return false
	}
	if b, ok := p.Spin.(bool); ok {
		return b
	}
	total := 0
	for _, q := range c.Pools {
		if !q.IsLocal() {
			continue
		}
		if q.Threads == 0 {
			return false
		}
		total += max(0, q.Workers) * max(1, q.Slots) * q.Threads
	}
	return total <= cpus-1
}

// PoolPriority is the highest priority (lowest number) among the classes pool serves
// (math.MaxInt for an unknown pool or one that serves no configured class).
func (c *Config) PoolPriority(pool string) int {
	best := math.MaxInt
	if pc := c.Pools[pool]; pc != nil {
		for _, name := range pc.Classes {
			if cl := c.Classes[name]; cl != nil {
				best = min(best, cl.Priority)
			}
		}
	}
	return best
}
