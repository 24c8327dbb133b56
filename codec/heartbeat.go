package codec

// Heartbeat is what a worker publishes on ortbus.hb.<pool>.<worker> every interval. The
// gateway derives liveness, free slots and the requests each worker holds from it.
type Heartbeat struct {
	V       int    `msgpack:"v,omitempty" json:"v,omitempty"`
	Worker  string `msgpack:"worker" json:"worker"`
	Pool    string `msgpack:"pool" json:"pool"`
	Host    string `msgpack:"host" json:"host"`
	PID     int    `msgpack:"pid" json:"pid"`
	Seq     uint64 `msgpack:"seq" json:"seq"`
	SentMS  int64  `msgpack:"sent_unix_ms" json:"sent_unix_ms"`
	State   string `msgpack:"state" json:"state"` // starting, ready, draining, failed
	Runtime string `msgpack:"runtime" json:"runtime"`
	Library string `msgpack:"library,omitempty" json:"library,omitempty"`
	EP      string `msgpack:"ep" json:"ep"`
	Device  string `msgpack:"device,omitempty" json:"device,omitempty"`
	// IntervalMS is the worker's heartbeat interval, so a tracker can judge silence.
	IntervalMS int64 `msgpack:"interval_ms" json:"interval_ms"`

	Classes []string      `msgpack:"classes" json:"classes"`
	Models  []ModelStatus `msgpack:"models" json:"models"`
	Slots   int           `msgpack:"slots" json:"slots"`
	// Direct says the worker also serves infer.<pool>.<class>.<worker> for each of its
	// classes, so that a gateway may send an item to it alone.
	Direct  bool           `msgpack:"direct,omitempty" json:"direct,omitempty"`
	Queued  map[string]int `msgpack:"queued" json:"queued"`
	Running map[string]int `msgpack:"running" json:"running"`
	Held    []string       `msgpack:"held" json:"held"`

	Served          uint64 `msgpack:"served" json:"served"`
	Failed          uint64 `msgpack:"failed" json:"failed"`
	SessionsCreated uint64 `msgpack:"sessions_created" json:"sessions_created"`
	RSSBytes        int64  `msgpack:"rss_bytes" json:"rss_bytes"`
	// DeviceBytes is the worker process's own memory on its pool's device as the driver
	// reports it for that process (nvidia-smi's per-process used memory for cuda:N, DRM
	// fdinfo for drm:N), sampled every heartbeat interval; DeviceSource names the reader,
	// "" when the device has none (cpu, or a KIND without a reader): DeviceBytes is then
	// not measured.
	DeviceBytes  int64  `msgpack:"device_bytes,omitempty" json:"device_bytes,omitempty"`
	DeviceSource string `msgpack:"device_source,omitempty" json:"device_source,omitempty"`
	// Adapter is, for a worker whose sessions run the webgpu EP, the Vulkan adapter they
	// run on (vendor, name, type, driver). AdapterMismatch is set when that adapter is not
	// the GPU its pool's device names (llvmpipe for cuda:0) and the pool serves all the
	// same (adapter_mismatch = "flag"): why, naming both.
	Adapter         string `msgpack:"adapter,omitempty" json:"adapter,omitempty"`
	AdapterMismatch string `msgpack:"adapter_mismatch,omitempty" json:"adapter_mismatch,omitempty"`
	UptimeMS        int64  `msgpack:"uptime_ms" json:"uptime_ms"`
	// Panics is how many panics the worker recovered (each answered internal, or failing
	// the model it was loading);
	// PublishErrors how many replies, claims or beats it could not send.
	Panics        uint64 `msgpack:"panics,omitempty" json:"panics,omitempty"`
	PublishErrors uint64 `msgpack:"publish_errors,omitempty" json:"publish_errors,omitempty"`
	// BadMessages is how many messages it dropped unanswered for their reply subject
	// (not under a reply prefix, or malformed: subjects.CheckReply).
	BadMessages uint64 `msgpack:"bad_messages,omitempty" json:"bad_messages,omitempty"`
	// DroppedReplies is how many replies of reply_direct items it dropped unsent: their
	// gateway had given the attempt to another (a claim that came late), or no verdict
	// came in time (the gateway answered those).
	DroppedReplies uint64 `msgpack:"dropped_replies,omitempty" json:"dropped_replies,omitempty"`
	// DecodeWaitMS is the time the worker's slots waited for their items' inputs to be
	// decoded (decoding them, or waiting for the decode stage), InferMS the time of their
	// runtime calls, both since it started: DecodeWaitMS / (DecodeWaitMS + InferMS) is
	// the share of its model's time spent waiting for input.
	DecodeWaitMS int64 `msgpack:"decode_wait_ms,omitempty" json:"decode_wait_ms,omitempty"`
	InferMS      int64 `msgpack:"infer_ms,omitempty" json:"infer_ms,omitempty"`

	// Error is set when State is failed: why the worker cannot serve (runtime_missing,
	// provider_unavailable, ...).
	Error *Error `msgpack:"error,omitempty" json:"error,omitempty"`
}

// Worker states, as reported in heartbeats.
const (
	StateStarting = "starting"
	StateReady    = "ready"
	StateDraining = "draining"
	StateFailed   = "failed"
)

// Model states, as a worker's heartbeat reports each of its models (ModelStatus.State).
// A worker loads each model on its own: one that fails is failed, with its reason, and
// the worker serves the others (a request for it is answered model_unavailable).
const (
	// ModelLoading: being loaded in place (the load control verb: WorkerLoad). A worker
	// loads its pool's models before its first heartbeat, so a starting worker's models
	// are never heard loading: the gateway's status says it of them (PoolStatus.Loading),
	// from the worker's "loading" event line. A model being reloaded stays ready: its
	// copy in force serves until the new one replaces it.
	ModelLoading = "loading"
	// ModelReady: loaded and warmed up; it serves.
	ModelReady = "ready"
	// ModelFailed: ONNX Runtime refused it, its files are missing, its load or warm-up
	// panicked, or its peak passed the memory budget (overloaded); ModelStatus.Error says
	// why.
	ModelFailed = "failed"
	// ModelUnloaded: the state in the answer to the unload control verb, once the model's
	// sessions are closed; an unloaded model leaves the worker's heartbeat (the gateway's
	// status lists it in PoolStatus.Unloaded while the config file still gives it).
	ModelUnloaded = "unloaded"
)

// MaxHeartbeatList bounds each list of a heartbeat (classes, models, queued and running
// classes): a gateway drops a heartbeat with a longer one (health), so a pool may serve
// at most this many classes and load at most this many models (config refuses more).
const MaxHeartbeatList = 64

// MaxNodesByEP bounds the EPs of a model's nodes_by_ep (a session's EP and the CPU's; a
// few more would be a runtime's own), and MaxNodes each count.
const (
	MaxNodesByEP = 8
	MaxNodes     = 1 << 24
)

// ModelStatus is one model of a worker as its heartbeat reports it.
type ModelStatus struct {
	Name string `msgpack:"name" json:"name"`
	Kind string `msgpack:"kind" json:"kind"`
	// State is ModelLoading, ModelReady or ModelFailed (ModelUnloaded in the answer to
	// unload; "" from a worker older than the field: Loaded says it).
	State string `msgpack:"state,omitempty" json:"state,omitempty"`
	// Loaded is State == ready.
	Loaded bool `msgpack:"loaded" json:"loaded"`
	// Error is why a failed model failed: its load error (the same as a request for it
	// gets in details.error).
	Error *Error `msgpack:"error,omitempty" json:"error,omitempty"`
	// WarmupError is why a ready model's warm-up on synthetic inputs (zeros) failed: such
	// inputs are not valid for every model (a VAD's sample rate of 0), so the model serves
	// all the same, its peak memory measured without the warm-up.
	WarmupError string `msgpack:"warmup_error,omitempty" json:"warmup_error,omitempty"`
	PeakBytes   int64  `msgpack:"peak_bytes" json:"peak_bytes"`
	// PeakSource says where PeakBytes comes from: measured (rss: the growth of the
	// process's peak resident set; device: the growth of the process's own memory on its
	// GPU, from before the model's load to after its warm-up runs) or declared;
	// rss-kept or device-kept: the largest peak measured of the same files at an earlier
	// load in the worker, which this load's measurement (a reload's growth, hidden by
	// reused memory) fell short of.
	PeakSource string `msgpack:"peak_source,omitempty" json:"peak_source,omitempty"`
	MaxBatch   int    `msgpack:"max_batch,omitempty" json:"max_batch,omitempty"`
	// PerItemBytes is the extra memory one more item of a dynamic batch takes (measured
	// between warm-ups at batch 1 and at max_batch), so a batch can be capped to fit.
	PerItemBytes int64 `msgpack:"per_item_bytes,omitempty" json:"per_item_bytes,omitempty"`
	// LoadMS is how long loading (and warming up) took, failed or not.
	LoadMS int64 `msgpack:"load_ms" json:"load_ms"`
	// NodesByEP is where the model's nodes ran in its warm-up, by EP ("webgpu": n,
	// "cpu": m), as ONNX Runtime's profiler recorded them (nodes after its graph
	// optimisations, copies between devices included); absent when no warm-up ran.
	// At most MaxNodesByEP EPs.
	NodesByEP map[string]int `msgpack:"nodes_by_ep,omitempty" json:"nodes_by_ep,omitempty"`
	// Revision is the revision of the files the worker loaded (cache.Revision, hashed
	// before and after loading, "" when they changed meanwhile), with [cache] enabled: the
	// gateway stores an answer only when the worker that computed it loaded the revision
	// its key names.
	Revision string `msgpack:"revision,omitempty" json:"revision,omitempty"`
}

// StatusReply answers status: the whole system as the gateway sees it.
type StatusReply struct {
	Gateway      string         `msgpack:"gateway" json:"gateway"`
	AllowedRoots []string       `msgpack:"allowed_roots" json:"allowed_roots"`
	SpoolDir     string         `msgpack:"spool_dir" json:"spool_dir"`
	Pools        []PoolStatus   `msgpack:"pools" json:"pools"`
	Workers      []WorkerStatus `msgpack:"workers" json:"workers"`
	Devices      []DeviceStatus `msgpack:"devices" json:"devices"`
	Classes      []ClassStatus  `msgpack:"classes" json:"classes"`
	// Pauses are the classes paused on demand now (op pause), each with its expiry.
	Pauses []PauseReply `msgpack:"pauses,omitempty" json:"pauses,omitempty"`
	// Gates are the compute gates this gateway publishes (devices with gated or
	// reclaimable leases; gateway/gate.go).
	Gates []GateStatus `msgpack:"gates,omitempty" json:"gates,omitempty"`
}

// PoolStatus is one pool in a status reply.
type PoolStatus struct {
	Name         string   `msgpack:"name" json:"name"`
	EP           string   `msgpack:"ep" json:"ep"`
	Device       string   `msgpack:"device" json:"device"`
	Local        bool     `msgpack:"local" json:"local"`
	Classes      []string `msgpack:"classes" json:"classes"`
	Workers      int      `msgpack:"workers" json:"workers"`
	Live         int      `msgpack:"live" json:"live"`
	CrashLooping bool     `msgpack:"crash_looping" json:"crash_looping"`
	Error        *Error   `msgpack:"error,omitempty" json:"error,omitempty"`
	// Loading are the models the pool's starting workers are loading now (local pools).
	Loading []string `msgpack:"loading,omitempty" json:"loading,omitempty"`
	// Skipped are the models this gateway no longer loads in the pool, and why: a worker
	// died (a native crash) while loading each. Its workers report them failed.
	Skipped map[string]string `msgpack:"skipped,omitempty" json:"skipped,omitempty"`
	// Unloaded are the models the config file gives the pool that an operator unloaded at
	// run time (`ortbus model unload`); a reload of the file loads them again.
	Unloaded []string `msgpack:"unloaded,omitempty" json:"unloaded,omitempty"`
}

// WorkerStatus is one worker in a status reply.
type WorkerStatus struct {
	Heartbeat      `msgpack:",inline"`
	HeartbeatAgeMS int64 `msgpack:"heartbeat_age_ms" json:"heartbeat_age_ms"`
	// HeldCount is how many requests the worker holds (their ids are not listed).
	HeldCount int    `msgpack:"held_count" json:"held_count"`
	Restarts  int    `msgpack:"restarts" json:"restarts"`
	LastExit  string `msgpack:"last_exit,omitempty" json:"last_exit,omitempty"`
}

// DeviceStatus is one device group's memory budget in a status reply.
type DeviceStatus struct {
	Device        string `msgpack:"device" json:"device"`
	CapacityBytes int64  `msgpack:"capacity_bytes" json:"capacity_bytes"`
	// CapacityError says why the capacity is unknown (0): no [devices.NAME] capacity and
	// no reader for the device. Such a device admits nothing: its local pools are refused.
	CapacityError string   `msgpack:"capacity_error,omitempty" json:"capacity_error,omitempty"`
	SafeFraction  float64  `msgpack:"safe_fraction" json:"safe_fraction"`
	BudgetBytes   int64    `msgpack:"budget_bytes" json:"budget_bytes"`
	AdmittedBytes int64    `msgpack:"admitted_bytes" json:"admitted_bytes"`
	FreeBytes     int64    `msgpack:"free_bytes" json:"free_bytes"`
	Pools         []string `msgpack:"pools" json:"pools"`
	// LeasedBytes is held by leases (processes outside ortbus), counted in FreeBytes.
	LeasedBytes int64        `msgpack:"leased_bytes,omitempty" json:"leased_bytes,omitempty"`
	Leases      []LeaseReply `msgpack:"leases,omitempty" json:"leases,omitempty"`
	// ReservedBytes is the sum of the device's class reservations ([devices.NAME.reserve]).
	ReservedBytes int64 `msgpack:"reserved_bytes,omitempty" json:"reserved_bytes,omitempty"`
	// ForeignBytes is the memory that processes outside ortbus are measured to use on the
	// device (nvidia-smi for cuda:N) past what leases cover, counted in FreeBytes.
	ForeignBytes int64 `msgpack:"foreign_bytes,omitempty" json:"foreign_bytes,omitempty"`
	// DriverUsedBytes is the memory in use on the whole device, every process's, as its
	// driver reports it (nvidia-smi for cuda:N, sysfs for drm:N where the driver
	// publishes it); absent where there is no such reading (cpu).
	DriverUsedBytes int64 `msgpack:"driver_used_bytes,omitempty" json:"driver_used_bytes,omitempty"`
}

// ClassStatus is one latency class in a status reply.
type ClassStatus struct {
	Name     string   `msgpack:"name" json:"name"`
	Priority int      `msgpack:"priority" json:"priority"`
	Queued   int      `msgpack:"queued" json:"queued"`
	Running  int      `msgpack:"running" json:"running"`
	Bound    int      `msgpack:"bound" json:"bound"`
	Chain    []string `msgpack:"chain" json:"chain"`
	// Answered1m counts the results this gateway answered in the last minute, P50MS1m and
	// P95MS1m their latency's median and 95th percentile in ms (from acceptance to the
	// answer; absent without results), from its ortbus_request_seconds histogram.
	Answered1m int     `msgpack:"answered_1m,omitempty" json:"answered_1m,omitempty"`
	P50MS1m    float64 `msgpack:"p50_ms_1m,omitempty" json:"p50_ms_1m,omitempty"`
	P95MS1m    float64 `msgpack:"p95_ms_1m,omitempty" json:"p95_ms_1m,omitempty"`
	// Shed counts the class's requests this gateway answered overloaded (a full queue, a
	// bound) since it started, Expired those answered deadline_exceeded.
	Shed    uint64 `msgpack:"shed,omitempty" json:"shed,omitempty"`
	Expired uint64 `msgpack:"expired,omitempty" json:"expired,omitempty"`
}

// GatewayBeat is a gateway's own heartbeat, on ortbus.gw.<gateway>.hb, so that peer
// gateways and clients notice its death (clients then resend what they wait for).
type GatewayBeat struct {
	Gateway    string `msgpack:"gateway" json:"gateway"`
	Seq        uint64 `msgpack:"seq" json:"seq"`
	IntervalMS int64  `msgpack:"interval_ms" json:"interval_ms"`
}
