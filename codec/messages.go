package codec

// WireVersion is the version of the message formats in this package. Messages carry it in
// their `v` field (absent means 1); a receiver refuses a version it does not know with
// bad_request instead of misreading it. The client API's subjects carry it too (ortbus.v1).
const WireVersion = 1

// Request is a client's request to the gateway, for every op (the op is the subject's last
// token). Fields an op does not use are left empty.
type Request struct {
	V         int    `msgpack:"v,omitempty" json:"v,omitempty"`
	ID        string `msgpack:"id,omitempty" json:"id,omitempty"`
	Model     string `msgpack:"model,omitempty" json:"model,omitempty"`
	Path      string `msgpack:"path,omitempty" json:"path,omitempty"`
	Class     string `msgpack:"class,omitempty" json:"class,omitempty"`
	Pool      string `msgpack:"pool,omitempty" json:"pool,omitempty"`
	Device    string `msgpack:"device,omitempty" json:"device,omitempty"` // only pools on this device
	TimeoutMS int64  `msgpack:"timeout_ms,omitempty" json:"timeout_ms,omitempty"`
	// Cache false bypasses the gateway's result cache for this request (neither read
	// nor written); absent or true: the cache is used where [cache] enables it.
	Cache *bool `msgpack:"cache,omitempty" json:"cache,omitempty"`

	// tag
	Thresholds *Thresholds `msgpack:"thresholds,omitempty" json:"thresholds,omitempty"`
	// detect
	Conf *float64 `msgpack:"conf,omitempty" json:"conf,omitempty"`
	IoU  *float64 `msgpack:"iou,omitempty" json:"iou,omitempty"`
	// segment
	OutPath string `msgpack:"out_path,omitempty" json:"out_path,omitempty"`
	// compare: one feature against N candidates.
	Feature    FloatVec   `msgpack:"feature,omitempty" json:"feature,omitempty"`
	Candidates []FloatVec `msgpack:"candidates,omitempty" json:"candidates,omitempty"`
	// infer: named input tensors, and the outputs wanted (all when empty).
	Inputs  map[string]*Tensor `msgpack:"inputs,omitempty" json:"inputs,omitempty"`
	Outputs []string           `msgpack:"outputs,omitempty" json:"outputs,omitempty"`
	// infer, tensors by path: inputs read from .npy files (by input name), and outputs
	// written as new .npy files, either each wanted output to <output_dir>/<name>.npy or
	// the named ones to their paths; written outputs come back as paths, not data.
	InputPaths  map[string]string `msgpack:"input_paths,omitempty" json:"input_paths,omitempty"`
	OutputDir   string            `msgpack:"output_dir,omitempty" json:"output_dir,omitempty"`
	OutputPaths map[string]string `msgpack:"output_paths,omitempty" json:"output_paths,omitempty"`
}

// Thresholds overrides a tagger's score thresholds per category.
type Thresholds struct {
	General   *float64 `msgpack:"general,omitempty" json:"general,omitempty"`
	Character *float64 `msgpack:"character,omitempty" json:"character,omitempty"`
}

// WorkItem is what the gateway publishes on infer.<pool>.<class>: the client's request
// with the op, the absolute deadline and the bookkeeping for claims and retries. A plain
// `nats req infer.cpu.interactive` with only the request fields is a valid work item too.
type WorkItem struct {
	Request `msgpack:",inline"`
	Op      string `msgpack:"op,omitempty" json:"op,omitempty"`
	// DeadlineUnixMS is the absolute deadline (Unix ms); 0 means the worker's default.
	DeadlineUnixMS int64 `msgpack:"deadline_unix_ms,omitempty" json:"deadline_unix_ms,omitempty"`
	// Attempt counts dispatches of this request (1 = first).
	Attempt int `msgpack:"attempt,omitempty" json:"attempt,omitempty"`
	// ClaimTo is the subject on which the worker announces that it took the item.
	ClaimTo string `msgpack:"claim_to,omitempty" json:"claim_to,omitempty"`
	// EnqueuedUnixUS is when the gateway accepted the request, for queue-time accounting.
	EnqueuedUnixUS int64 `msgpack:"enqueued_unix_us,omitempty" json:"enqueued_unix_us,omitempty"`
	// ReplyDirect says that the item's NATS reply subject is the client's own: the worker
	// answers there as always, and then tells the gateway with a claim of state "done" on
	// ClaimTo (which it requires).
	ReplyDirect bool `msgpack:"reply_direct,omitempty" json:"reply_direct,omitempty"`
}

// Claim tells the dispatching gateway that a worker holds a request (State "taken"): it
// queued the work item.
type Claim struct {
	ID      string `msgpack:"id" json:"id"`
	Worker  string `msgpack:"worker" json:"worker"`
	Pool    string `msgpack:"pool" json:"pool"`
	Attempt int    `msgpack:"attempt,omitempty" json:"attempt,omitempty"`
	State   string `msgpack:"state" json:"state"`
	// Code is the error code of the reply a "done" claim reports ("" for a result), and
	// Timing the result's timing.
	Code   Code    `msgpack:"code,omitempty" json:"code,omitempty"`
	Timing *Timing `msgpack:"timing,omitempty" json:"timing,omitempty"`
}

// The states of a claim: the worker queued the item (taken), or it has sent the item's
// reply to the client itself (done; only for an item with reply_direct).
const (
	ClaimTaken = "taken"
	ClaimDone  = "done"
)

// ClaimVerdict is a gateway's answer to a "taken" claim that came with a reply subject
// (the claim of an item with reply_direct): Own says that the claimed attempt is the
// request's current one and that this worker holds it, so its reply may go to the client.
// Not Own, the worker drops the item unanswered: the gateway dispatched it again, gave it
// to another worker, or answered it already.
type ClaimVerdict struct {
	ID      string `msgpack:"id" json:"id"`
	Attempt int    `msgpack:"attempt,omitempty" json:"attempt,omitempty"`
	Own     bool   `msgpack:"own" json:"own"`
}

// Cancel asks that the request with this id be dropped (queued) or stopped (running).
type Cancel struct {
	ID string `msgpack:"id" json:"id"`
}

// Timing is the time a request spent queued, in inference, and in all, in microseconds.
type Timing struct {
	QueueUS int64 `msgpack:"queue_us" json:"queue_us"`
	InferUS int64 `msgpack:"infer_us" json:"infer_us"`
	TotalUS int64 `msgpack:"total_us" json:"total_us"`
	// Batch is how many requests shared the runtime call (dynamic batching); 1 when alone.
	Batch int `msgpack:"batch,omitempty" json:"batch,omitempty"`
	// Cached: the answer came from the gateway's result cache (queue_us and infer_us are
	// 0, total_us the lookup); the rest of Served names who computed it.
	Cached bool `msgpack:"cached,omitempty" json:"cached,omitempty"`
}

// Served says who answered a request: every reply carries it.
type Served struct {
	ID      string `msgpack:"id,omitempty" json:"id,omitempty"`
	Model   string `msgpack:"model,omitempty" json:"model,omitempty"`
	Pool    string `msgpack:"pool,omitempty" json:"pool,omitempty"`
	Worker  string `msgpack:"worker,omitempty" json:"worker,omitempty"`
	Runtime string `msgpack:"runtime,omitempty" json:"runtime,omitempty"` // ONNX Runtime version
	EP      string `msgpack:"ep,omitempty" json:"ep,omitempty"`           // execution provider in use
	Timing  Timing `msgpack:"timing" json:"timing"`
}

// TagReply answers tag.
type TagReply struct {
	Served     `msgpack:",inline"`
	General    map[string]float32  `msgpack:"general" json:"general"`
	Character  map[string]float32  `msgpack:"character" json:"character"`
	Rating     map[string]float32  `msgpack:"rating" json:"rating"`
	IPs        []string            `msgpack:"ips" json:"ips"`
	IPsMapping map[string][]string `msgpack:"ips_mapping" json:"ips_mapping"`
}

// EmbedReply answers embed.
type EmbedReply struct {
	Served    `msgpack:",inline"`
	Dim       int      `msgpack:"dim" json:"dim"`
	Embedding FloatVec `msgpack:"embedding" json:"embedding"`
}

// CompareReply answers compare: the difference of the feature to each candidate, the
// model's threshold, and whether each candidate is the same character (difference <=
// threshold).
type CompareReply struct {
	Served      `msgpack:",inline"`
	Differences []float32 `msgpack:"differences" json:"differences"`
	Threshold   float64   `msgpack:"threshold" json:"threshold"`
	Same        []bool    `msgpack:"same" json:"same"`
}

// Box is one detection, in the original image's pixel coordinates.
type Box struct {
	X1    float32 `msgpack:"x1" json:"x1"`
	Y1    float32 `msgpack:"y1" json:"y1"`
	X2    float32 `msgpack:"x2" json:"x2"`
	Y2    float32 `msgpack:"y2" json:"y2"`
	Label string  `msgpack:"label" json:"label"`
	Score float32 `msgpack:"score" json:"score"`
}

// DetectReply answers detect.
type DetectReply struct {
	Served `msgpack:",inline"`
	Boxes  []Box `msgpack:"boxes" json:"boxes"`
}

// SegmentReply answers segment: the RGBA PNG is written to OutPath, not sent.
type SegmentReply struct {
	Served  `msgpack:",inline"`
	OutPath string `msgpack:"out_path" json:"out_path"`
	Width   int    `msgpack:"width" json:"width"`
	Height  int    `msgpack:"height" json:"height"`
}

// InferReply answers infer with the named output tensors: inline in Outputs, or, for the
// outputs the request asked to be written (output_dir, output_paths), the path of each
// .npy file written in OutputPaths.
type InferReply struct {
	Served      `msgpack:",inline"`
	Outputs     map[string]*Tensor `msgpack:"outputs" json:"outputs"`
	OutputPaths map[string]string  `msgpack:"output_paths,omitempty" json:"output_paths,omitempty"`
}

// CancelReply answers the client API's cancel.
type CancelReply struct {
	ID string `msgpack:"id" json:"id"`
	// Found is true when the request was queued or running and is now being cancelled.
	Found bool `msgpack:"found" json:"found"`
}

// ModelControl asks a gateway to change one model at run time (ortbus.ops.model).
type ModelControl struct {
	// Action is ModelLoad, ModelUnload or ModelReload.
	Action string `msgpack:"action" json:"action"`
	// Model is a model of the configuration's [models].
	Model string `msgpack:"model" json:"model"`
	// Pool is the pool to load it into or unload it from. Load: required unless the
	// gateway has one local pool; unload and reload: default every pool that loads it.
	Pool string `msgpack:"pool,omitempty" json:"pool,omitempty"`
}

// ModelControl actions.
const (
	ModelLoad   = "load"
	ModelUnload = "unload"
	ModelReload = "reload"
)

// ReloadReply answers ortbus.ops.reload and ortbus.ops.model once the change is applied:
// every worker it started is ready or failed.
type ReloadReply struct {
	Gateway string `msgpack:"gateway" json:"gateway"`
	// Changes is what changed, in one line ("no change" when nothing did).
	Changes string `msgpack:"changes" json:"changes"`
	// Added, Removed: pools started and stopped; Replaced: pools whose workers were
	// replaced, and why.
	Added    []string          `msgpack:"added,omitempty" json:"added,omitempty"`
	Removed  []string          `msgpack:"removed,omitempty" json:"removed,omitempty"`
	Replaced map[string]string `msgpack:"replaced,omitempty" json:"replaced,omitempty"`
	// Models: pools whose models changed in place, their workers kept (models loaded,
	// unloaded and reloaded through the load and unload control verbs), and how.
	Models map[string]string `msgpack:"models,omitempty" json:"models,omitempty"`
	// Routing are changes only the gateway's routing reads (class chains, devices, ...).
	Routing []string `msgpack:"routing,omitempty" json:"routing,omitempty"`
	// Failed says, one line each, what a worker could not do in place: a model that
	// failed to load there (it is failed on that worker, and requests are routed around
	// it; a reload's copy in force keeps serving), or a worker replaced instead.
	Failed []string `msgpack:"failed,omitempty" json:"failed,omitempty"`
}

// HealthReply answers health.
type HealthReply struct {
	Status  string `msgpack:"status" json:"status"` // "ok" or "degraded"
	Workers int    `msgpack:"workers" json:"workers"`
	Pools   int    `msgpack:"pools" json:"pools"`
}

// NewReply returns a pointer to the empty reply type of an op, or nil for an unknown op.
// The gateway uses it to re-encode a worker's msgpack reply as JSON for a JSON client.
func NewReply(op string) any {
	switch op {
	case "tag":
		return new(TagReply)
	case "embed":
		return new(EmbedReply)
	case "compare":
		return new(CompareReply)
	case "detect":
		return new(DetectReply)
	case "segment":
		return new(SegmentReply)
	case "infer":
		return new(InferReply)
	case "cancel":
		return new(CancelReply)
	case "health":
		return new(HealthReply)
	case "status":
		return new(StatusReply)
	case "lease":
		return new(LeaseReply)
	case "pause":
		return new(PauseReply)
	}
	return nil
}

// Meta returns the Served part of a reply, so the worker can fill in who served it and
// the timing without knowing the reply's type.
func (s *Served) Meta() *Served { return s }

// Replier is implemented by every reply type that embeds Served.
type Replier interface{ Meta() *Served }
