// Messages (codec/messages.go): the replies of the client API, as the client returns them.


/** A latency class: "urgent", "interactive", "batch", or one the gateway's config adds. */
export type OrtbusClass = "urgent" | "interactive" | "batch" | (string & {});

/** Timing of a reply, in microseconds. */
export interface Timing {
  queue_us: number;
  infer_us: number;
  total_us: number;
  /** How many requests shared the runtime call (dynamic batching). */
  batch?: number;
  /** The answer came from the gateway's result cache (queue_us and infer_us 0). */
  cached?: boolean;
}

/** Who served a reply; every inference reply carries it. */
export interface Served {
  id: string;
  model: string;
  pool: string;
  worker: string;
  /** ONNX Runtime version of the worker. */
  runtime?: string;
  /** Execution provider in use. */
  ep?: string;
  timing: Timing;
}

export interface TagReply extends Served {
  general: Record<string, number>;
  character: Record<string, number>;
  rating: Record<string, number>;
  ips: string[];
  ips_mapping: Record<string, string[]>;
}

export interface EmbedReply extends Served {
  dim: number;
  /** The embedding, decoded from msgpack bin (little-endian float32). */
  embedding: Float32Array;
}

export interface CompareReply extends Served {
  /** The feature's difference to each candidate, in candidate order. */
  differences: number[];
  /** The model's threshold: same character when difference <= threshold. */
  threshold: number;
  same: boolean[];
}

export interface Box {
  x1: number;
  y1: number;
  x2: number;
  y2: number;
  label: string;
  score: number;
}

export interface DetectReply extends Served {
  boxes: Box[];
}

export interface SegmentReply extends Served {
  /** Where the RGBA PNG cut-out was written. */
  out_path: string;
  width: number;
  height: number;
}

/** The element types whose data is little-endian bytes. */
export type NumericTensorType =
  | "float32" | "float64" | "float16" | "bfloat16"
  | "int64" | "int32" | "int16" | "int8"
  | "uint64" | "uint32" | "uint16" | "uint8" | "bool";

export type TensorType = NumericTensorType | "string";

/** A raw tensor of the infer op: little-endian element bytes of `type`. */
export interface NumericTensor {
  type: NumericTensorType;
  shape: number[];
  data: Uint8Array;
}

/** A string tensor of the infer op: its elements (msgpack str, UTF-8), in C order. */
export interface StringTensor {
  type: "string";
  shape: number[];
  data: string[];
}

export type Tensor = NumericTensor | StringTensor;

export interface InferReply extends Served {
  /** The wanted outputs sent inline. */
  outputs: Record<string, Tensor>;
  /** The .npy file written for each output sent to a file (InferOptions.outputDir, outputPaths). */
  output_paths?: Record<string, string>;
}

export interface CancelReply {
  id: string;
  /** True when the request was queued or running and is now being cancelled. */
  found: boolean;
}

export interface HealthReply {
  status: "ok" | "degraded" | (string & {});
  workers: number;
  pools: number;
}

export interface ModelStatus {
  name: string;
  kind: string;
  loaded: boolean;
  peak_bytes: number;
  peak_source?: string;
  max_batch?: number;
  load_ms: number;
}

export interface WorkerStatus {
  worker: string;
  pool: string;
  host: string;
  pid: number;
  seq: number;
  sent_unix_ms: number;
  state: string;
  runtime: string;
  library?: string;
  ep: string;
  device?: string;
  interval_ms: number;
  classes: string[];
  models: ModelStatus[];
  slots: number;
  queued: Record<string, number>;
  running: Record<string, number>;
  held: string[];
  served: number;
  failed: number;
  sessions_created: number;
  rss_bytes: number;
  uptime_ms: number;
  error?: { code: string; message: string; details?: Record<string, unknown> };
  heartbeat_age_ms: number;
  restarts: number;
  last_exit?: string;
}

export interface PoolStatus {
  name: string;
  ep: string;
  device: string;
  local: boolean;
  classes: string[];
  workers: number;
  live: number;
  crash_looping: boolean;
  error?: { code: string; message: string; details?: Record<string, unknown> };
}

export interface ClassStatus {
  name: string;
  priority: number;
  queued: number;
  running: number;
  bound: number;
  chain: string[];
  /** Results this gateway answered in the last minute, and their latency's p50 and p95 in
   * ms (absent without results). */
  answered_1m?: number;
  p50_ms_1m?: number;
  p95_ms_1m?: number;
  /** Requests answered overloaded (shed) and deadline_exceeded (expired) since the gateway started. */
  shed?: number;
  expired?: number;
}

export interface StatusReply {
  gateway: string;
  allowed_roots: string[];
  spool_dir: string;
  pools: PoolStatus[];
  workers: WorkerStatus[];
  devices: DeviceStatus[];
  classes: ClassStatus[];
  /** The classes paused on demand now (pauseClass). */
  pauses?: Pause[];
  /** The compute gates this gateway publishes (devices with gated or pressed leases). */
  gates?: GateStatus[];
}

/** One device in a status reply: its memory budget and who holds it. */
export interface DeviceStatus {
  device: string;
  capacity_bytes: number;
  safe_fraction: number;
  budget_bytes: number;
  admitted_bytes: number;
  free_bytes: number;
  pools: string[];
  leased_bytes?: number;
  leases?: Lease[];
  reserved_bytes?: number;
  /** Memory that processes outside ortbus are measured to use on the device, past what leases cover. */
  foreign_bytes?: number;
  /** The memory in use on the whole device as its driver reports it (absent for cpu). */
  driver_used_bytes?: number;
}

/** A memory lease as granted, renewed or released (status lists them without `lease`). */
export interface Lease {
  /** The lease's id: the holder's capability to renew or release it. */
  lease?: string;
  device: string;
  bytes: number;
  class: string;
  holder?: string;
  expires_unix_ms: number;
  released?: boolean;
  /** The granting gateway's id: a gated holder follows the gate `ortbus.gate.<gateway>.<device>`. */
  gateway?: string;
  /** As acquired: the holder follows the device's compute gate (`ortbus lease --gate`). */
  gate?: boolean;
  /** As acquired: the holder gives memory back on demand (`ortbus lease --on-pressure`). */
  reclaim?: boolean;
  /** A higher class wants this reclaimable lease's memory back. */
  pressed?: boolean;
}

/** One device's compute gate in status: its gating class, whether gated tenants are
 * paused now, and the share of the last minute they were. */
export interface GateStatus {
  device: string;
  class: string;
  paused: boolean;
  paused_share_1m: number;
  /** The time the gate was closed since it came to be, in ms. */
  paused_total_ms: number;
  seq: number;
  tenants: number;
}

/** A class paused on demand, as paused or resumed (status lists them as `pauses`). */
export interface Pause {
  class: string;
  device?: string;
  /** Whose pause it is and whose work it holds: `account:NAME` (its own work only), or absent for the operator's (everyone's). */
  owner?: string;
  until_unix_ms?: number;
  resumed?: boolean;
}
