// @ortbus/client: the TypeScript client of ortbus (ONNX Runtime inference routed over NATS
// to resident worker processes), and OrtbusAiClient, a drop-in for an app's in-process AI
// client. ESM, typed, no build step: Bun (and any runtime that strips types) imports this
// file directly.
//
// Wire contract (docs/PROTOCOL.md): requests are msgpack maps sent to `ortbus.v1.<op>`;
// replies are msgpack maps; an error reply carries the headers Nats-Service-Error-Code /
// Nats-Service-Error and a body {code, message, details} whose `code` is one of
// ORTBUS_ERROR_CODES. Float vectors travel as msgpack bin of little-endian float32.

import { randomUUID } from "node:crypto";
import { mkdir, readFile, unlink, writeFile } from "node:fs/promises";
import { join } from "node:path";

import { Decoder, Encoder } from "@msgpack/msgpack";
import { headers as natsHeaders, connect as natsConnect } from "@nats-io/transport-node";
import type { Msg, NatsConnection, RequestOptions, Subscription } from "@nats-io/transport-node";

// ---------------------------------------------------------------------------------------
// Errors

/** Every stable error code of the ortbus contract; clients switch on these. */
export const ORTBUS_ERROR_CODES = [
  "bad_request",
  "unknown_op",
  "unknown_model",
  "unknown_pool",
  "unknown_job",
  "file_not_found",
  "forbidden_path",
  "unsupported_image",
  "image_too_large",
  "runtime_missing",
  "provider_unavailable",
  "no_worker",
  "overloaded",
  "deadline_exceeded",
  "cancelled",
  "worker_lost",
  "poison_input",
  "reply_too_large",
  "unavailable",
  "internal",
  "conflict",
] as const;

/** A stable ortbus error code. */
export type OrtbusErrorCode = (typeof ORTBUS_ERROR_CODES)[number];

const KNOWN_CODES: ReadonlySet<string> = new Set(ORTBUS_ERROR_CODES);

/** HTTP-like status of each code, as the gateway sends it in Nats-Service-Error-Code. */
export function statusOf(code: OrtbusErrorCode): number {
  switch (code) {
    case "bad_request":
    case "unsupported_image":
      return 400;
    case "forbidden_path":
      return 403;
    case "unknown_op":
    case "unknown_model":
    case "unknown_pool":
    case "unknown_job":
    case "file_not_found":
      return 404;
    case "conflict":
      return 409;
    case "image_too_large":
      return 413;
    case "poison_input":
      return 422;
    case "overloaded":
      return 429;
    case "cancelled":
      return 499;
    case "runtime_missing":
    case "provider_unavailable":
    case "no_worker":
    case "worker_lost":
    case "unavailable":
      return 503;
    case "deadline_exceeded":
      return 504;
    default:
      return 500;
  }
}

/**
 * The one error type every OrtbusClient / OrtbusAiClient call rejects with. `code` is a
 * stable contract code; `details` is what the gateway attached (pool, worker, paths
 * searched, ...); `status` is the HTTP-like number of the reply header (or of the code,
 * for errors the client itself raises: a local timeout, an abort, no gateway).
 */
export class OrtbusError extends Error {
  readonly code: OrtbusErrorCode;
  readonly details?: Record<string, unknown>;
  readonly status?: number;
  /** The request id the error belongs to, when there was one. */
  readonly requestId?: string;

  constructor(
    code: OrtbusErrorCode,
    message: string,
    opts: { details?: Record<string, unknown>; status?: number; requestId?: string; cause?: unknown } = {},
  ) {
    super(message, opts.cause === undefined ? undefined : { cause: opts.cause });
    this.name = "OrtbusError";
    this.code = code;
    if (opts.details !== undefined) this.details = opts.details;
    this.status = opts.status ?? statusOf(code);
    if (opts.requestId !== undefined) this.requestId = opts.requestId;
  }
}

/** Reports whether e is an OrtbusError (with the given code, if one is named). */
export function isOrtbusError(e: unknown, code?: OrtbusErrorCode): e is OrtbusError {
  return e instanceof OrtbusError && (code === undefined || e.code === code);
}

// ---------------------------------------------------------------------------------------
// Messages (codec/messages.go)

/** A latency class: "urgent", "interactive", "batch", or one the gateway's config adds. */
export type OrtbusClass = "urgent" | "interactive" | "batch" | (string & {});

/** Timing of a reply, in microseconds. */
export interface Timing {
  queue_us: number;
  infer_us: number;
  total_us: number;
  /** How many requests shared the runtime call (dynamic batching). */
  batch?: number;
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

export type TensorType = "float32" | "float64" | "int64" | "int32" | "uint8" | "bool";

/** A raw tensor of the infer op: little-endian element bytes of `type`. */
export interface Tensor {
  type: TensorType;
  shape: number[];
  data: Uint8Array;
}

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
}

export interface StatusReply {
  gateway: string;
  allowed_roots: string[];
  spool_dir: string;
  pools: PoolStatus[];
  workers: WorkerStatus[];
  devices: DeviceStatus[];
  classes: ClassStatus[];
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
}

// ---------------------------------------------------------------------------------------
// Leases (codec/lease.go): memory of a device held for a process ortbus does not run

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
}

// ---------------------------------------------------------------------------------------
// Jobs (codec/jobs.go): one op over many image paths, kept in JetStream by the gateways

/** The ops a job may run: those that take one image path. */
export const JOB_OPS = ["tag", "embed", "detect", "segment"] as const;
export type JobOp = (typeof JOB_OPS)[number];

/** The reply type of each job op: what each item's `result` is. */
export interface JobReplyOf {
  tag: TagReply;
  embed: EmbedReply;
  detect: DetectReply;
  segment: SegmentReply;
}

/** A directory whose images are a job's items. */
export interface JobDir {
  /** Absolute, inside the gateway's allowed roots. */
  path: string;
  /** Filter of base names (Go path.Match syntax, e.g. "*.png"); default: the image extensions. */
  glob?: string;
  recursive?: boolean;
}

/** The op's options applied to every item of a job. */
export interface JobItemOptions {
  /** tag */
  thresholds?: { general?: number; character?: number };
  /** detect */
  conf?: number;
  iou?: number;
  /** Each item's deadline in milliseconds, from when it is dispatched (sent as timeout_ms). */
  timeoutMs?: number;
  /** Run only on pools of this device. */
  device?: string;
}

/** What submitJob asks for: op over `items` (paths) or the images of `dir`, not both. */
export interface JobSubmitRequest {
  /**
   * The job's id (letters, digits, `-`, `_`; at most 64). Submitting the same spec under
   * the same id again adds nothing; another spec under it is refused `bad_request`.
   * Default: a random UUID, so that a submit the client sends again after a reconnect
   * never makes a second job.
   */
  job?: string;
  op: JobOp;
  /** Default: the class's default model for the op (fixed at submit). */
  model?: string;
  /** Default "batch". */
  class?: OrtbusClass;
  /** Strict: the items run on this pool or fail. */
  pool?: string;
  items?: string[];
  dir?: JobDir;
  options?: JobItemOptions;
}

export interface JobSubmitReply {
  job: string;
  /** The number of items. */
  total: number;
}

/** "running", then "done" (every item answered), "cancelled", or "failed" (its results
 * could not be stored: `error` says why). */
export type JobState = "running" | "done" | "cancelled" | "failed" | (string & {});

/** A job's counts and state (job.status, job.cancel, each entry of listJobs). */
export interface JobStatus {
  job: string;
  state: JobState;
  op: JobOp;
  model?: string;
  class: OrtbusClass;
  total: number;
  /** Items answered with the op's reply. */
  done: number;
  /** Items answered with an error; done + failed is total once the job is done. */
  failed: number;
  /** Items delivered and not yet answered (across gateways). */
  running: number;
  /** Items that needed more than one delivery. */
  redelivered: number;
  /** Items a second over the last minute. */
  rate_per_s: number;
  /** Seconds left at that rate. */
  eta_s: number;
  started_unix_ms: number;
  finished_unix_ms?: number;
  /** Why a failed job failed. */
  error?: { code: string; message: string; details?: Record<string, unknown> };
}

/** Reports whether a job will change no more (done, cancelled or failed). */
export function jobFinished(st: Pick<JobStatus, "state">): boolean {
  return st.state === "done" || st.state === "cancelled" || st.state === "failed";
}

export interface JobListReply {
  /** The jobs still kept, newest first. */
  jobs: JobStatus[];
}

/**
 * One item's outcome: the op's reply (`result`, typed by `op`) or an `error`. `op` is the
 * job's, copied onto each result by the client, so that `if (r.op === "tag")` narrows
 * `result` to a TagReply.
 */
export type JobResult = {
  [O in JobOp]: {
    op: O;
    /** The result's position in the job's results (a stream sequence): what `from` names. */
    seq: number;
    /** The item's index in the job. */
    i: number;
    path: string;
    result?: JobReplyOf[O];
    /** The item's error, as the OrtbusError a call of the op would have rejected with. */
    error?: OrtbusError;
  };
}[JobOp];

/** One page of a job's results, in the order they were recorded. */
export interface JobResultsPage {
  job: string;
  op: JobOp;
  results: JobResult[];
  /** The `from` of the next page. */
  next: number;
  /** Whether results past this page exist now (a running job records more later). */
  more: boolean;
}

/** Options of jobResults and eachJobResult. */
export interface JobResultsOptions extends Pick<CallOptions, "timeoutMs" | "signal"> {
  /** The first result's `seq` (0: the first); a page's `next`. */
  from?: number;
  /** At most this many results a page (default and cap 1000; fewer when they are large). */
  limit?: number;
}

/** Options of watchJob. */
export interface WatchJobOptions {
  /** Milliseconds between two status requests (default 1000). */
  intervalMs?: number;
  /** Ends the watch (rejecting with code "cancelled"); the job itself goes on. */
  signal?: AbortSignal;
  /** Bound of one status request (default max(intervalMs, 5000)). */
  timeoutMs?: number;
}

// ---------------------------------------------------------------------------------------
// Options

/** Options of OrtbusClient.connect and OrtbusAiClient.connect. */
export interface ConnectOptions {
  /** NATS server URL(s), e.g. "nats://127.0.0.1:4222". */
  servers: string | string[];
  /** Default class of every request (the gateway's default, interactive, when unset). */
  class?: OrtbusClass;
  /** Default pool (strict: the request goes there or fails). */
  pool?: string;
  /**
   * Default timeout of every request in milliseconds (default 30000). It is sent as the
   * request's `timeout_ms` (the gateway caps it by the class's max_timeout and answers
   * deadline_exceeded), and bounds the wait in the client too (timeout + 2 s grace), so
   * no call waits forever even when no gateway answers.
   */
  timeoutMs?: number;
  /** NATS connection name (default "ortbus ts client"). */
  name?: string;
  /** Milliseconds between reconnect attempts (default 250); reconnects never give up. */
  reconnectTimeWaitMs?: number;
  /**
   * Prefix of the reply subjects (default nats.js's "_INBOX"). A server that lets each user
   * subscribe only to its own inboxes needs it: deploy/cluster's user `client` gets its
   * replies on `_INBOX_client.>` only, so connect with `inboxPrefix: "_INBOX_client"`.
   */
  inboxPrefix?: string;
  /** NATS user and password (keep the password in the environment, never in source). */
  user?: string;
  pass?: string | undefined;
  /** TLS to the server: the CA to trust (`caFile`), a client certificate for mutual TLS. */
  tls?: { caFile?: string; certFile?: string; keyFile?: string };
  /**
   * Gateway failover (default false): follow the gateways' beats (`ortbus.gw.*.hb`) and,
   * when the gateway holding a waiting inference call dies, send its request again (same
   * id, header `Ortbus-Resend`); the call takes the first answer that is not a notice.
   * Its holder is known once a notice named it; until then any gateway's death counts.
   * Without failover a call whose gateway dies ends only at its timeoutMs.
   * Call `gateways()` at start and wait until it lists the gateways you expect: a gateway
   * that dies before the client heard it is never judged dead.
   */
  failover?: boolean;
  /** Beat intervals of silence that make a gateway dead, with failover (default 3). */
  missCount?: number;
}

/** Per-call options of every OrtbusClient method. */
export interface CallOptions {
  class?: OrtbusClass;
  pool?: string;
  timeoutMs?: number;
  /** Aborting sends ortbus.v1.cancel for the request and rejects with code "cancelled". */
  signal?: AbortSignal;
  /** Model name (default: the class's default model for the op). */
  model?: string;
  /** Request id (default: a random UUID); what `cancel(id)` names. */
  id?: string;
}

export interface TagOptions extends CallOptions {
  thresholds?: { general?: number; character?: number };
}

export interface DetectOptions extends CallOptions {
  conf?: number;
  iou?: number;
}

export interface SegmentOptions extends CallOptions {
  /** Where to write the PNG (inside the allowed roots); default: the gateway's spool dir. */
  outPath?: string;
}

export interface InferOptions extends CallOptions {
  /** Output names wanted (all when unset). */
  outputs?: string[];
  /**
   * Inputs read by the workers from NumPy .npy files (npyBytes writes one), by input name:
   * absolute paths under the allowed roots, for tensors too big for the bus.
   */
  inputPaths?: Record<string, string>;
  /** Write every wanted output as a new file <outputDir>/<name>.npy (under spool_dir or output_roots). */
  outputDir?: string;
  /** Write the named outputs as new .npy files at these paths (not with outputDir). */
  outputPaths?: Record<string, string>;
}

/** A float vector as a client may pass it. */
export type FloatVector = Float32Array | Float64Array | ArrayLike<number>;

/** A tensor as a client may pass it to infer: raw bytes or a typed array of its type. */
export interface TensorInput {
  type: TensorType;
  shape: number[];
  data: Uint8Array | Float32Array | Float64Array | Int32Array | BigInt64Array | ArrayLike<number> | ArrayLike<boolean>;
}

// ---------------------------------------------------------------------------------------
// Encoding helpers

const LITTLE_ENDIAN = new Uint8Array(new Uint16Array([1]).buffer)[0] === 1;

/**
 * A copy of b's bytes in a fresh ArrayBuffer (byteOffset 0). Not b.slice(): a Node/Bun
 * Buffer's slice is a view into the same memory, and what msgpack decodes from a NATS
 * message is such a view into the whole message.
 */
export function copyBytes(b: Uint8Array): Uint8Array {
  const out = new Uint8Array(b.byteLength);
  out.set(b);
  return out;
}

/**
 * Bounds on what a reply may hold, sized to what replies legitimately carry (a tensor or
 * an embedding as bin, tag maps, status lists). A reply over any of them is refused
 * before it is built, with an OrtbusError of code `internal`: a gateway never sends one,
 * so it is a broken or hostile peer, never the caller's mistake.
 */
export const REPLY_LIMITS = {
  /** Longest msgpack str (and map key), in bytes. */
  maxStrLength: 1 << 20,
  /** Longest msgpack bin (an infer output tensor), in bytes. */
  maxBinLength: 64 << 20,
  /** Most elements of one array, and entries of one map. */
  maxArrayLength: 1_000_000,
  maxMapLength: 1_000_000,
  /** Longest msgpack ext (replies have none), in bytes. */
  maxExtLength: 1 << 20,
  /** Deepest nesting of arrays and maps (a status reply is 5 deep; the gateway's own bound is 16). */
  maxDepth: 16,
  /** Largest reply body of any encoding, in bytes (a JSON body is refused above it before parsing). */
  maxBytes: 128 << 20,
} as const;

// Go's codec writes small ints compactly; a true int64/uint64 decodes as a JS number
// (never a bigint), exact up to 2^53.
const decoder = new Decoder({
  useBigInt64: false,
  maxStrLength: REPLY_LIMITS.maxStrLength,
  maxBinLength: REPLY_LIMITS.maxBinLength,
  maxArrayLength: REPLY_LIMITS.maxArrayLength,
  maxMapLength: REPLY_LIMITS.maxMapLength,
  maxExtLength: REPLY_LIMITS.maxExtLength,
});
const encoder = new Encoder({ ignoreUndefined: true, useBigInt64: false });

/** msgpack-encodes v (undefined fields are left out). */
export function encodeMsg(v: unknown): Uint8Array {
  return encoder.encode(v);
}

/**
 * msgpack-decodes b; int64 values come back as numbers. b is walked first (no allocation):
 * every length must fit in the bytes that follow it, nesting is at most
 * REPLY_LIMITS.maxDepth, and no bytes may trail the value; then the decoder applies the
 * other REPLY_LIMITS. Anything else throws an OrtbusError of code `internal`, never a
 * RangeError, a hang or an allocation the message's size cannot justify.
 */
export function decodeMsg<T = unknown>(b: Uint8Array): T {
  try {
    if (b.byteLength > REPLY_LIMITS.maxBytes) throw new Error(`${b.byteLength} bytes, over the ${REPLY_LIMITS.maxBytes}-byte bound`);
    checkMsgpack(b);
    return decoder.decode(b) as T;
  } catch (e) {
    if (e instanceof OrtbusError) throw e;
    throw new OrtbusError("internal", `malformed msgpack reply: ${errText(e)}`, { cause: e });
  }
}

/**
 * JSON-parses a reply body (a reply to a request sent as JSON) within REPLY_LIMITS:
 * maxBytes before parsing, maxDepth brackets deep. Failures are OrtbusError `internal`.
 */
export function decodeJSON<T = unknown>(b: Uint8Array): T {
  try {
    if (b.byteLength > REPLY_LIMITS.maxBytes) throw new Error(`${b.byteLength} bytes, over the ${REPLY_LIMITS.maxBytes}-byte bound`);
    let depth = 0;
    let inStr = false;
    for (let i = 0; i < b.length; i++) {
      const c = b[i]!;
      if (inStr) {
        if (c === 0x5c) i++; // backslash: skip the escaped byte
        else if (c === 0x22) inStr = false;
        continue;
      }
      if (c === 0x22) inStr = true;
      else if (c === 0x5b || c === 0x7b) {
        if (++depth > REPLY_LIMITS.maxDepth) throw new Error(`nested deeper than ${REPLY_LIMITS.maxDepth} at byte ${i}`);
      } else if (c === 0x5d || c === 0x7d) depth--;
    }
    return JSON.parse(new TextDecoder().decode(b)) as T;
  } catch (e) {
    throw new OrtbusError("internal", `malformed JSON reply: ${errText(e)}`, { cause: e });
  }
}

/**
 * Walks one msgpack value filling b exactly, iteratively (no recursion, no allocation but
 * a stack of at most maxDepth counters), and throws when a length header claims more
 * than the bytes left, nesting passes REPLY_LIMITS.maxDepth, or bytes trail the value.
 */
function checkMsgpack(b: Uint8Array): void {
  const dv = new DataView(b.buffer, b.byteOffset, b.byteLength);
  const end = b.byteLength;
  let i = 0;
  const need = (n: number, what: string) => {
    if (n > end - i) throw new Error(`${what} of ${n} bytes at byte ${i} is more than the ${end - i} bytes left`);
  };
  // Values still to read at each open level; the top level holds one value.
  const todo: number[] = [1];
  while (todo.length > 0) {
    const left = todo[todo.length - 1]!;
    if (left === 0) {
      todo.pop();
      continue;
    }
    todo[todo.length - 1] = left - 1;
    need(1, "value");
    const c = b[i++]!;
    let items = -1; // values of an array or map header
    if (c <= 0x7f || c >= 0xe0 || c === 0xc0 || c === 0xc2 || c === 0xc3) {
      continue; // fixint, nil, bool
    } else if (c >= 0xa0 && c <= 0xbf) {
      need(c & 0x1f, "string"); // fixstr
      i += c & 0x1f;
    } else if (c >= 0x90 && c <= 0x9f) {
      items = c & 0x0f; // fixarray
    } else if (c >= 0x80 && c <= 0x8f) {
      items = 2 * (c & 0x0f); // fixmap
    } else if (MSGPACK_FIXED[c] !== undefined) {
      need(MSGPACK_FIXED[c], "value");
      i += MSGPACK_FIXED[c];
    } else if (MSGPACK_SIZED[c] !== undefined) {
      const [size, extra, kind] = MSGPACK_SIZED[c];
      need(size, "length");
      const n = size === 1 ? dv.getUint8(i) : size === 2 ? dv.getUint16(i) : dv.getUint32(i);
      i += size;
      if (kind === "array") items = n;
      else if (kind === "map") items = 2 * n;
      else {
        need(extra + n, kind);
        i += extra + n;
      }
    } else {
      throw new Error(`invalid msgpack code 0x${c.toString(16)} at byte ${i - 1}`);
    }
    if (items >= 0) {
      // Each value takes at least one byte.
      if (items > end - i) throw new Error(`${items} values at byte ${i} cannot fit in the ${end - i} bytes left`);
      if (todo.length > REPLY_LIMITS.maxDepth) throw new Error(`nested deeper than ${REPLY_LIMITS.maxDepth} at byte ${i}`);
      todo.push(items);
    }
  }
  if (i !== end) throw new Error(`${end - i} bytes after the reply's value`);
}

/** msgpack codes of fixed size: the bytes after the code (numbers, fixext). */
const MSGPACK_FIXED: Readonly<Record<number, number>> = {
  0xcc: 1, 0xd0: 1, 0xcd: 2, 0xd1: 2, 0xce: 4, 0xd2: 4, 0xca: 4, 0xcf: 8, 0xd3: 8, 0xcb: 8, // uint, int, float
  0xd4: 2, 0xd5: 3, 0xd6: 5, 0xd7: 9, 0xd8: 17, // fixext 1/2/4/8/16: type byte + data
};

/** msgpack codes with a length: its size in bytes, bytes before the data, and the kind. */
const MSGPACK_SIZED: Readonly<Record<number, readonly [1 | 2 | 4, number, "string" | "bin" | "ext" | "array" | "map"]>> = {
  0xd9: [1, 0, "string"], 0xda: [2, 0, "string"], 0xdb: [4, 0, "string"],
  0xc4: [1, 0, "bin"], 0xc5: [2, 0, "bin"], 0xc6: [4, 0, "bin"],
  0xc7: [1, 1, "ext"], 0xc8: [2, 1, "ext"], 0xc9: [4, 1, "ext"], // type byte + data
  0xdc: [2, 0, "array"], 0xdd: [4, 0, "array"],
  0xde: [2, 0, "map"], 0xdf: [4, 0, "map"],
};

/** Little-endian float32 bytes of a vector (what msgpack sends as bin). */
export function float32Bytes(v: FloatVector): Uint8Array {
  if (v instanceof Float32Array && LITTLE_ENDIAN) {
    // A copy of exactly the view's bytes, whatever its offset in its buffer.
    return copyBytes(new Uint8Array(v.buffer, v.byteOffset, v.byteLength));
  }
  const out = new Uint8Array(4 * v.length);
  const dv = new DataView(out.buffer);
  for (let i = 0; i < v.length; i++) dv.setFloat32(4 * i, Number(v[i]), true);
  return out;
}

/**
 * A Float32Array from little-endian float32 bytes. The bytes are copied first: a msgpack
 * bin arrives as a view into the message whose byteOffset need not be a multiple of 4.
 * A number array (a JSON reply, a Go []float32) is accepted too.
 */
export function float32FromBytes(raw: unknown): Float32Array {
  if (raw == null) return new Float32Array(0);
  if (Array.isArray(raw)) return Float32Array.from(raw as number[]);
  if (!(raw instanceof Uint8Array)) {
    throw new OrtbusError("internal", `float vector: want bin or number array, got ${typeof raw}`);
  }
  if (raw.byteLength % 4 !== 0) {
    throw new OrtbusError("internal", `float32 bin of ${raw.byteLength} bytes is not a multiple of 4`);
  }
  const n = raw.byteLength / 4;
  if (LITTLE_ENDIAN) {
    const copy = copyBytes(raw); // own buffer, byteOffset 0
    return new Float32Array(copy.buffer, 0, n);
  }
  const out = new Float32Array(n);
  const dv = new DataView(raw.buffer, raw.byteOffset, raw.byteLength);
  for (let i = 0; i < n; i++) out[i] = dv.getFloat32(4 * i, true);
  return out;
}

const ELEM_SIZE: Record<TensorType, number> = { float32: 4, float64: 8, int64: 8, int32: 4, uint8: 1, bool: 1 };

/** Encodes a tensor for infer: its values as little-endian bytes of its type. */
export function tensorBytes(t: TensorInput): Tensor {
  const size = ELEM_SIZE[t.type];
  if (size === undefined) throw new OrtbusError("bad_request", `tensor type ${String(t.type)} is not one of ${Object.keys(ELEM_SIZE).join(", ")}`);
  const shape = t.shape.map((d) => Number(d));
  const d = t.data;
  if (d instanceof Uint8Array && t.type !== "uint8" && t.type !== "bool") {
    return { type: t.type, shape, data: copyBytes(d) }; // already raw bytes
  }
  const n = (d as ArrayLike<unknown>).length;
  const out = new Uint8Array(n * size);
  const dv = new DataView(out.buffer);
  for (let i = 0; i < n; i++) {
    const v = (d as ArrayLike<unknown>)[i];
    switch (t.type) {
      case "float32":
        dv.setFloat32(4 * i, Number(v), true);
        break;
      case "float64":
        dv.setFloat64(8 * i, Number(v), true);
        break;
      case "int64":
        dv.setBigInt64(8 * i, typeof v === "bigint" ? v : BigInt(Math.trunc(Number(v))), true);
        break;
      case "int32":
        dv.setInt32(4 * i, Number(v), true);
        break;
      case "uint8":
        dv.setUint8(i, Number(v));
        break;
      case "bool":
        dv.setUint8(i, v ? 1 : 0);
        break;
    }
  }
  return { type: t.type, shape, data: out };
}

const NPY_DESCR: Record<TensorType, string> = { float32: "<f4", float64: "<f8", int64: "<i8", int32: "<i4", uint8: "|u1", bool: "|b1" };
const NPY_MAGIC = [0x93, 0x4e, 0x55, 0x4d, 0x50, 0x59]; // \x93NUMPY

/**
 * A tensor as the bytes of a NumPy .npy file (version 1.0, C order, little-endian, the
 * header padded to 64 bytes as np.save writes it): what infer's inputPaths read.
 */
export function npyBytes(t: TensorInput): Uint8Array {
  const w = tensorBytes(t);
  const shape = w.shape.length === 1 ? `(${w.shape[0]},)` : `(${w.shape.join(", ")})`;
  let h = `{'descr': '${NPY_DESCR[w.type]}', 'fortran_order': False, 'shape': ${shape}, }`;
  h += " ".repeat((64 - ((10 + h.length + 1) % 64)) % 64) + "\n";
  const out = new Uint8Array(10 + h.length + w.data.byteLength);
  out.set([...NPY_MAGIC, 1, 0, h.length & 0xff, h.length >> 8]);
  for (let i = 0; i < h.length; i++) out[10 + i] = h.charCodeAt(i);
  out.set(w.data, 10 + h.length);
  return out;
}

/**
 * Reads a NumPy .npy file (versions 1.0 to 3.0, C order, little-endian, a tensor type) as
 * a Tensor, such as an output infer wrote; its data is a copy. Anything else throws
 * OrtbusError bad_request.
 */
export function tensorFromNpy(b: Uint8Array): Tensor {
  const bad = (why: string) => new OrtbusError("bad_request", `not a usable .npy tensor: ${why}`);
  if (b.byteLength < 10 || NPY_MAGIC.some((m, i) => b[i] !== m)) throw bad("no \\x93NUMPY magic");
  const dv = new DataView(b.buffer, b.byteOffset, b.byteLength);
  const major = b[6]!;
  if (b[7] !== 0 || major < 1 || major > 3) throw bad(`format version ${major}.${b[7]}`);
  const start = major === 1 ? 10 : 12;
  if (b.byteLength < start) throw bad("truncated header length");
  const hlen = major === 1 ? dv.getUint16(8, true) : dv.getUint32(8, true);
  if (hlen > 65536 || start + hlen > b.byteLength) throw bad(`header length ${hlen}`);
  const h = new TextDecoder("latin1").decode(b.subarray(start, start + hlen));
  const descr = /['"]descr['"]\s*:\s*['"]([^'"]*)['"]/.exec(h)?.[1];
  const type = (Object.keys(NPY_DESCR) as TensorType[]).find((k) => NPY_DESCR[k] === descr || (NPY_DESCR[k][0] === "|" && descr === "<" + NPY_DESCR[k].slice(1)));
  if (type === undefined) throw bad(`dtype ${descr}`);
  if (/['"]fortran_order['"]\s*:\s*True/.test(h)) throw bad("fortran_order is True");
  const dims = /['"]shape['"]\s*:\s*\(([^)]*)\)/.exec(h)?.[1];
  if (dims === undefined) throw bad("no shape");
  const shape = dims.split(",").map((d) => d.trim().replace(/L$/, "")).filter((d) => d !== "").map(Number);
  if (shape.some((d) => !Number.isSafeInteger(d) || d < 0)) throw bad(`shape (${dims})`);
  const n = shape.reduce((a, d) => a * d, 1);
  if (n * ELEM_SIZE[type] !== b.byteLength - start - hlen) throw bad(`shape (${dims}) does not match ${b.byteLength - start - hlen} bytes of data`);
  return { type, shape, data: copyBytes(b.subarray(start + hlen)) };
}

/**
 * The values of a tensor: Float32Array, Float64Array, Int32Array or Uint8Array for those
 * types; int64 as a number array (exact up to 2^53, never bigints); bool as booleans.
 */
export function tensorValues(t: Tensor): Float32Array | Float64Array | Int32Array | Uint8Array | number[] | boolean[] {
  const size = ELEM_SIZE[t.type];
  if (size === undefined) throw new OrtbusError("internal", `unknown tensor type ${String(t.type)}`);
  const n = Math.floor(t.data.byteLength / size);
  const dv = new DataView(t.data.buffer, t.data.byteOffset, t.data.byteLength);
  switch (t.type) {
    case "float32": {
      const out = new Float32Array(n);
      for (let i = 0; i < n; i++) out[i] = dv.getFloat32(4 * i, true);
      return out;
    }
    case "float64": {
      const out = new Float64Array(n);
      for (let i = 0; i < n; i++) out[i] = dv.getFloat64(8 * i, true);
      return out;
    }
    case "int64": {
      const out: number[] = new Array(n);
      for (let i = 0; i < n; i++) out[i] = Number(dv.getBigInt64(8 * i, true));
      return out;
    }
    case "int32": {
      const out = new Int32Array(n);
      for (let i = 0; i < n; i++) out[i] = dv.getInt32(4 * i, true);
      return out;
    }
    case "uint8":
      return copyBytes(t.data);
    case "bool":
      return Array.from(t.data, (b) => b !== 0);
  }
}

// ---------------------------------------------------------------------------------------
// OrtbusClient

/** Subject prefix of the client API. */
export const API_PREFIX = "ortbus.v1";

/** The client API's ops. */
export type Op =
  | "tag"
  | "embed"
  | "compare"
  | "detect"
  | "segment"
  | "infer"
  | "cancel"
  | "status"
  | "health"
  | "lease"
  | "job.submit"
  | "job.status"
  | "job.cancel"
  | "job.list"
  | "job.results";

const DEFAULT_TIMEOUT_MS = 30_000;
/** How much longer than a request's timeout the client waits for the gateway's own answer. */
const GRACE_MS = 2_000;

/**
 * After a reconnect, a request that finds no subscriber (the gateway has not resubscribed
 * yet) is tried again every RETRY_MS for this long, within its own timeout.
 */
const SETTLE_MS = 5_000;
const RETRY_MS = 100;

const HEADER_ERROR_CODE = "Nats-Service-Error-Code";
const HEADER_ERROR = "Nats-Service-Error";

// ---------------------------------------------------------------------------------------
// Gateway failover (the Go client's client/failover.go; the gateway's side is
// gateway/failover.go): the client follows the gateways' beats on ortbus.gw.*.hb, and when
// a gateway stops beating while a call waits, it sends the call's request again, same
// body and id, with the header Ortbus-Resend. Whichever gateway takes the resend runs it,
// answers it from what the answers bucket kept, or answers the notice Ortbus-Held (empty
// body) when a live gateway still holds it: the call then goes on waiting, every request
// it sent still outstanding (the holder answers on the first one's reply subject). The
// call takes the first reply that is not a notice. A call knows its holder once a notice
// names it: from then on only that gateway's death sends it again (a peer that flaps or
// crash-loops does not spend its resends); before, any gateway's death does.

/** Header of a request sent again after a gateway died. */
const HEADER_RESEND = "Ortbus-Resend";
/** Header of a gateway's notice that a live gateway (its value) holds the request. */
const HEADER_HELD = "Ortbus-Held";
/** Beat intervals of silence that make a gateway dead, by default. */
const DEFAULT_MISS_COUNT = 3;
/** At most this many resends of one call. */
const MAX_RESENDS = 8;
/** How often silent gateways are judged. */
const JUDGE_EVERY_MS = 20;
/** The subject of every gateway's beats. */
const GATEWAY_BEATS = "ortbus.gw.*.hb";
/** The ops that are inference work: queued, answered later, sent again after a gateway died. */
const WORK_OPS: ReadonlySet<Op> = new Set<Op>(["tag", "embed", "compare", "detect", "segment", "infer"]);

/** A gateway's beat (codec.GatewayBeat). */
interface GatewayBeat {
  gateway?: unknown;
  seq?: unknown;
  interval_ms?: unknown;
}

/** The gateways heard beating, judged dead after missCount of their intervals of silence. */
class GatewayBeats {
  /** Each gateway heard: its last beat, interval, whether judged dead, and how many times it was. */
  private readonly peers = new Map<string, { seen: number; interval: number; dead: boolean; deaths: number }>();
  /** Called (each once a tick, however many died in it) when a gateway is judged dead. */
  private readonly onDeath = new Set<() => void>();
  private readonly sub: Subscription;
  private readonly timer: ReturnType<typeof setInterval>;

  constructor(
    nc: NatsConnection,
    private readonly missCount: number,
  ) {
    this.sub = nc.subscribe(GATEWAY_BEATS, {
      callback: (err, m) => {
        if (err === null) this.hear(m);
      },
    });
    this.timer = setInterval(() => this.judge(), JUDGE_EVERY_MS);
    (this.timer as { unref?: () => void }).unref?.();
  }

  private hear(m: Msg): void {
    const t = m.subject.split(".");
    const id = t[2];
    if (t.length !== 4 || t[0] !== "ortbus" || t[1] !== "gw" || t[3] !== "hb" || !id) return;
    let b: GatewayBeat;
    try {
      b = decodeMsg<GatewayBeat>(m.data);
    } catch {
      return;
    }
    const iv = b?.interval_ms;
    if (b?.gateway !== id || typeof iv !== "number" || !(iv > 0) || iv > 3_600_000) return;
    let p = this.peers.get(id);
    if (p === undefined) {
      if (this.peers.size >= 256) return;
      p = { seen: 0, interval: 0, dead: false, deaths: 0 };
      this.peers.set(id, p);
    }
    p.seen = performance.now();
    p.interval = iv;
    p.dead = false;
  }

  private judge(): void {
    const now = performance.now();
    let died = false;
    for (const [id, p] of this.peers) {
      if (p.dead) {
        if (now - p.seen > 3_600_000) this.peers.delete(id);
      } else if (now - p.seen > this.missCount * p.interval) {
        p.dead = true;
        p.deaths++;
        died = true;
      }
    }
    if (died) for (const f of [...this.onDeath]) f();
  }

  /** The gateways heard beating and not judged dead, sorted. */
  alive(): string[] {
    return [...this.peers].filter(([, p]) => !p.dead).map(([id]) => id).sort();
  }

  /**
   * Whether gateway id is judged dead, its beat interval in milliseconds, and how many
   * times it was judged dead.
   */
  isDead(id: string): [boolean, number, number] {
    const p = this.peers.get(id);
    return p === undefined ? [false, 0, 0] : [p.dead, p.interval, p.deaths];
  }

  /** Calls f whenever gateways are judged dead, until the returned function is called. */
  deaths(f: () => void): () => void {
    this.onDeath.add(f);
    return () => this.onDeath.delete(f);
  }

  close(): void {
    clearInterval(this.timer);
    this.onDeath.clear();
    try {
      this.sub.unsubscribe();
    } catch {
      // the connection is closed
    }
  }
}

/** Wire request fields (codec.Request), snake_case. */
interface WireRequest {
  id?: string;
  model?: string;
  path?: string;
  class?: string;
  pool?: string;
  timeout_ms?: number;
  thresholds?: { general?: number; character?: number };
  conf?: number;
  iou?: number;
  out_path?: string;
  feature?: Uint8Array;
  candidates?: Uint8Array[];
  inputs?: Record<string, Tensor>;
  outputs?: string[];
  input_paths?: Record<string, string>;
  output_dir?: string;
  output_paths?: Record<string, string>;
}

/**
 * The ortbus API over NATS: one method per op. Every method rejects only with OrtbusError.
 *
 *   const c = await OrtbusClient.connect({ servers: "nats://127.0.0.1:4222" });
 *   const r = await c.tag("/srv/images/a.png", { class: "batch" });
 */
export class OrtbusClient {
  readonly nc: NatsConnection;
  /** Defaults for requests that leave them unset. */
  class?: OrtbusClass;
  pool?: string;
  timeoutMs: number;
  /**
   * Gateway failover (ConnectOptions.failover): inference calls are sent again when a
   * gateway dies while they wait. missCount is read when the client starts following the
   * beats: at connect with failover, else at its first call with failover or gateways().
   */
  failover: boolean;
  missCount: number;
  private beats: GatewayBeats | undefined;

  // Connection state, from the connection's status events: a request is not published
  // while the connection is down (nats.js would lose it, or its reply, around the
  // reconnect); it waits for the reconnect, within its own timeout.
  private connected = true;
  private reconnected: Promise<void> = Promise.resolve();
  private onReconnected: () => void = () => {};
  private lastReconnect = 0;
  // Called at every disconnect: the requests waiting (each removes its own listener). A
  // request published before a disconnect may have been lost with the server (at most
  // once), so it is sent again after the reconnect.
  private readonly disconnects = new Set<() => void>();

  constructor(
    nc: NatsConnection,
    defaults: { class?: OrtbusClass; pool?: string; timeoutMs?: number; failover?: boolean; missCount?: number } = {},
  ) {
    this.nc = nc;
    if (defaults.class !== undefined) this.class = defaults.class;
    if (defaults.pool !== undefined) this.pool = defaults.pool;
    this.timeoutMs = defaults.timeoutMs ?? DEFAULT_TIMEOUT_MS;
    this.failover = defaults.failover ?? false;
    this.missCount = defaults.missCount ?? DEFAULT_MISS_COUNT;
    void this.watch();
  }

  private async watch(): Promise<void> {
    try {
      for await (const s of this.nc.status()) {
        if (s.type === "disconnect" && this.connected) {
          this.connected = false;
          this.reconnected = new Promise((res) => (this.onReconnected = res));
          for (const f of [...this.disconnects]) f();
        } else if (s.type === "reconnect") {
          this.connected = true;
          this.lastReconnect = performance.now();
          this.onReconnected();
        }
      }
    } catch {
      // the status iterator ends with the connection
    } finally {
      this.connected = true; // closed: requests fail at once with the connection's error
      this.onReconnected();
    }
  }

  /** Waits (at most ms) until the connection is up. */
  private async whenConnected(ms: number): Promise<void> {
    if (this.connected || ms <= 0) return;
    let timer: ReturnType<typeof setTimeout> | undefined;
    await Promise.race([this.reconnected, new Promise<void>((res) => (timer = setTimeout(res, ms)))]);
    if (timer) clearTimeout(timer);
  }

  /** Connects to NATS (reconnecting forever after a loss) and returns a client. */
  static async connect(opts: ConnectOptions): Promise<OrtbusClient> {
    let nc: NatsConnection;
    try {
      nc = await natsConnect({
        servers: opts.servers,
        name: opts.name ?? "ortbus ts client",
        maxReconnectAttempts: -1,
        reconnectTimeWait: opts.reconnectTimeWaitMs ?? 250,
        reconnectJitter: 50,
        waitOnFirstConnect: false,
        ...(opts.inboxPrefix !== undefined ? { inboxPrefix: opts.inboxPrefix } : {}),
        ...(opts.user !== undefined ? { user: opts.user } : {}),
        ...(opts.pass !== undefined ? { pass: opts.pass } : {}),
        ...(opts.tls !== undefined ? { tls: opts.tls } : {}),
      });
    } catch (e) {
      throw new OrtbusError("no_worker", `cannot connect to NATS at ${String(opts.servers)}: ${errText(e)}`, {
        details: { servers: opts.servers },
        cause: e,
      });
    }
    const d: { class?: OrtbusClass; pool?: string; timeoutMs?: number; failover?: boolean; missCount?: number } = {};
    if (opts.class !== undefined) d.class = opts.class;
    if (opts.pool !== undefined) d.pool = opts.pool;
    if (opts.timeoutMs !== undefined) d.timeoutMs = opts.timeoutMs;
    if (opts.failover !== undefined) d.failover = opts.failover;
    if (opts.missCount !== undefined) d.missCount = opts.missCount;
    const c = new OrtbusClient(nc, d);
    if (c.failover) c.followBeats(); // hear the gateways from the start
    return c;
  }

  /**
   * The gateways heard beating now (sorted ids), starting to follow their beats if the
   * client does not yet. A gateway that dies before the client has heard it is never
   * judged dead: a client with failover calls this at start and waits until it lists the
   * gateways it expects (their beats come every heartbeat_interval) before its first
   * calls. Throws an OrtbusError (`no_worker`) when the connection is closed.
   */
  gateways(): string[] {
    return this.followBeats().alive();
  }

  /** The beats followed (started on first use). */
  private followBeats(): GatewayBeats {
    if (this.beats === undefined) {
      try {
        this.beats = new GatewayBeats(this.nc, this.missCount > 0 ? this.missCount : DEFAULT_MISS_COUNT);
      } catch (e) {
        throw new OrtbusError("no_worker", `cannot follow the gateways' beats (${GATEWAY_BEATS}): ${errText(e)}`, { cause: e });
      }
    }
    return this.beats;
  }

  /**
   * Drains the connection (replies already on their way are still delivered) and closes
   * it; bounded: after 5 s (say, while the server is unreachable) it just closes.
   */
  async close(): Promise<void> {
    this.beats?.close();
    this.beats = undefined;
    if (this.nc.isClosed()) return;
    let timer: ReturnType<typeof setTimeout> | undefined;
    try {
      await Promise.race([
        this.nc.drain(),
        new Promise<void>((_, rej) => {
          timer = setTimeout(() => rej(new Error("drain timed out")), 5_000);
        }),
      ]);
    } catch {
      await this.nc.close().catch(() => {});
    } finally {
      if (timer) clearTimeout(timer);
    }
  }

  /** Tags the image at path (absolute, inside the gateway's allowed roots). */
  tag(path: string, opts: TagOptions = {}): Promise<TagReply> {
    const req: WireRequest = { path };
    if (opts.thresholds) req.thresholds = { ...opts.thresholds };
    return this.request<TagReply>("tag", req, opts).then(normTag);
  }

  /** The embedding (e.g. CCIP feature) of the image at path, as a Float32Array. */
  async embed(path: string, opts: CallOptions = {}): Promise<EmbedReply> {
    const r = await this.request<Omit<EmbedReply, "embedding"> & { embedding: unknown }>("embed", { path }, opts);
    return { ...r, embedding: float32FromBytes(r.embedding) };
  }

  /** Differences of one feature to each candidate, in one request (N = 1: pairwise). */
  async compare(feature: FloatVector, candidates: FloatVector[], opts: CallOptions = {}): Promise<CompareReply> {
    const req: WireRequest = { feature: float32Bytes(feature), candidates: candidates.map(float32Bytes) };
    const r = await this.request<CompareReply>("compare", req, opts);
    return { ...r, differences: (r.differences ?? []).map(Number), same: r.same ?? [] };
  }

  /** Boxes found in the image at path. */
  detect(path: string, opts: DetectOptions = {}): Promise<DetectReply> {
    const req: WireRequest = { path };
    if (opts.conf !== undefined) req.conf = opts.conf;
    if (opts.iou !== undefined) req.iou = opts.iou;
    return this.request<DetectReply>("detect", req, opts).then((r) => ({ ...r, boxes: r.boxes ?? [] }));
  }

  /** Writes the image's cut-out (RGBA PNG) and returns where. */
  segment(path: string, opts: SegmentOptions = {}): Promise<SegmentReply> {
    const req: WireRequest = { path };
    if (opts.outPath !== undefined) req.out_path = opts.outPath;
    return this.request<SegmentReply>("segment", req, opts);
  }

  /**
   * Runs a raw model on named tensors: inline, or by path (opts.inputPaths); the outputs
   * come back inline, or as .npy files (opts.outputDir, opts.outputPaths; read them with
   * tensorFromNpy) named in the reply's output_paths.
   */
  async infer(inputs: Record<string, TensorInput>, opts: InferOptions = {}): Promise<InferReply> {
    const wire: Record<string, Tensor> = {};
    for (const [k, v] of Object.entries(inputs)) wire[k] = tensorBytes(v);
    const req: WireRequest = {};
    if (Object.keys(wire).length > 0) req.inputs = wire;
    if (opts.outputs) req.outputs = [...opts.outputs];
    if (opts.inputPaths) req.input_paths = { ...opts.inputPaths };
    if (opts.outputDir !== undefined) req.output_dir = opts.outputDir;
    if (opts.outputPaths) req.output_paths = { ...opts.outputPaths };
    const r = await this.request<InferReply>("infer", req, opts);
    const outputs: Record<string, Tensor> = {};
    for (const [k, t] of Object.entries(r.outputs ?? {})) {
      outputs[k] = { type: t.type, shape: (t.shape ?? []).map(Number), data: t.data instanceof Uint8Array ? copyBytes(t.data) : new Uint8Array(0) };
    }
    return { ...r, outputs };
  }

  /** Cancels a request by id: dropped if queued, stopped if running. */
  cancel(id: string, opts: Pick<CallOptions, "timeoutMs" | "signal"> = {}): Promise<CancelReply> {
    return this.send<CancelReply>("cancel", { id }, id, opts);
  }

  /** The system as the answering gateway sees it (pools, workers, classes, spool_dir). */
  status(opts: Pick<CallOptions, "timeoutMs" | "signal"> = {}): Promise<StatusReply> {
    return this.send<StatusReply>("status", {}, undefined, opts);
  }

  /** The answering gateway's health. */
  health(opts: Pick<CallOptions, "timeoutMs" | "signal"> = {}): Promise<HealthReply> {
    return this.send<HealthReply>("health", {}, undefined, opts);
  }

  // -------------------------------------------------------------------------------------
  // Leases: device memory held for a process ortbus does not run (an LLM server, a game),
  // counted in the device's memory admission until released or expired.

  /**
   * Acquires `bytes` of `device`'s memory budget. Rejects with code "overloaded" (details:
   * device, sum_bytes, budget_bytes) when the budget cannot hold it. An urgent or
   * interactive lease holds batch work on the device to one unit while it lives.
   */
  acquireLease(
    device: string,
    bytes: number,
    o: { class?: OrtbusClass; ttlMs?: number; holder?: string } & Pick<CallOptions, "timeoutMs" | "signal"> = {},
  ): Promise<Lease> {
    const req: Record<string, unknown> = { action: "acquire", device, bytes };
    if (o.class !== undefined) req.class = o.class;
    if (o.ttlMs !== undefined) req.ttl_ms = o.ttlMs;
    if (o.holder !== undefined) req.holder = o.holder;
    return this.send<Lease>("lease", req, undefined, o);
  }

  /** Extends a lease by `ttlMs` (default: the gateway's) from now. */
  renewLease(lease: string, o: { ttlMs?: number } & Pick<CallOptions, "timeoutMs" | "signal"> = {}): Promise<Lease> {
    const req: Record<string, unknown> = { action: "renew", lease };
    if (o.ttlMs !== undefined) req.ttl_ms = o.ttlMs;
    return this.send<Lease>("lease", req, undefined, o);
  }

  /** Gives a lease's memory back. */
  releaseLease(lease: string, opts: Pick<CallOptions, "timeoutMs" | "signal"> = {}): Promise<Lease> {
    return this.send<Lease>("lease", { action: "release", lease }, undefined, opts);
  }

  // -------------------------------------------------------------------------------------
  // Jobs: kept in JetStream by the gateways (the gateway's NATS server needs JetStream;
  // without it every job call rejects with code "unavailable").

  /**
   * Submits a job: op over `items` (paths) or the images of `dir`. The same submit sent
   * again under the same `job` id adds nothing (it answers the same total); another spec
   * under that id is refused `bad_request`. `opts.timeoutMs` bounds the wait (a submit of
   * very many items publishes them all before it answers).
   */
  submitJob(req: JobSubmitRequest, opts: Pick<CallOptions, "timeoutMs" | "signal"> = {}): Promise<JobSubmitReply> {
    const wire: Record<string, unknown> = { job: req.job ?? randomUUID(), op: req.op };
    if (req.model !== undefined) wire.model = req.model;
    if (req.class !== undefined) wire.class = req.class;
    if (req.pool !== undefined) wire.pool = req.pool;
    if (req.items !== undefined) wire.items = [...req.items];
    if (req.dir !== undefined) wire.dir = { ...req.dir };
    if (req.options !== undefined) {
      const o = req.options;
      const w: Record<string, unknown> = {};
      if (o.thresholds !== undefined) w.thresholds = { ...o.thresholds };
      if (o.conf !== undefined) w.conf = o.conf;
      if (o.iou !== undefined) w.iou = o.iou;
      if (o.timeoutMs !== undefined) w.timeout_ms = Math.max(1, Math.ceil(o.timeoutMs));
      if (o.device !== undefined) w.device = o.device;
      wire.options = w;
    }
    return this.send<JobSubmitReply>("job.submit", wire, undefined, opts);
  }

  /** A job's counts and state; an unknown (or expired) job rejects with code "unknown_job". */
  jobStatus(job: string, opts: Pick<CallOptions, "timeoutMs" | "signal"> = {}): Promise<JobStatus> {
    return this.send<JobStatus>("job.status", { job }, undefined, opts).then(normJobStatus);
  }

  /**
   * Cancels a job: its waiting items are removed and its running ones stopped; what it
   * has done stays readable. Answers its status (state "cancelled").
   */
  cancelJob(job: string, opts: Pick<CallOptions, "timeoutMs" | "signal"> = {}): Promise<JobStatus> {
    return this.send<JobStatus>("job.cancel", { job }, undefined, opts).then(normJobStatus);
  }

  /** The jobs still kept, newest first. */
  async listJobs(opts: Pick<CallOptions, "timeoutMs" | "signal"> = {}): Promise<JobListReply> {
    const r = await this.send<JobListReply>("job.list", {}, undefined, opts);
    return { jobs: (r.jobs ?? []).map(normJobStatus) };
  }

  /**
   * One page of a job's results from `from` (0: the first), each `result` typed by the
   * job's op (a TagReply for tag, an EmbedReply with a Float32Array for embed, ...).
   */
  async jobResults(job: string, opts: JobResultsOptions = {}): Promise<JobResultsPage> {
    const req: Record<string, unknown> = { job };
    if (opts.from !== undefined && opts.from > 0) req.from = opts.from;
    if (opts.limit !== undefined && opts.limit > 0) req.limit = Math.floor(opts.limit);
    const r = await this.send<WireJobResults>("job.results", req, undefined, opts);
    const op = r.op as JobOp;
    return {
      job: r.job,
      op,
      results: (r.results ?? []).map((x) => jobResult(op, x)),
      next: Number(r.next ?? 0),
      more: r.more === true,
    };
  }

  /**
   * Every result the job has recorded so far, in the order they were recorded, page by
   * page (`limit` a page), from `from`:
   *
   *   for await (const r of c.eachJobResult(job)) if (r.op === "tag" && r.result) use(r.result.general);
   */
  async *eachJobResult(job: string, opts: JobResultsOptions = {}): AsyncGenerator<JobResult, void, undefined> {
    let from = opts.from ?? 0;
    for (;;) {
      const page = await this.jobResults(job, { ...opts, from });
      yield* page.results;
      if (!page.more || page.next <= from) return; // (a page that moves nothing would loop)
      from = page.next;
    }
  }

  /**
   * The job's status every `intervalMs` (default 1000), each one yielded, until the job is
   * finished: the last status yielded is the one whose state is "done" or "cancelled".
   * Errors that say the gateway is briefly gone (`no_worker`, `unavailable`, `overloaded`,
   * `deadline_exceeded`: a gateway restarting, the job store not open yet, NATS down) are
   * retried, since a job outlives gateways; any other error ends the watch by rejecting.
   * Aborting `signal` ends it with code "cancelled" (the job goes on; cancelJob stops it).
   */
  async *watchJob(job: string, opts: WatchJobOptions = {}): AsyncGenerator<JobStatus, JobStatus, undefined> {
    const interval = Math.max(1, opts.intervalMs ?? 1_000);
    const timeoutMs = opts.timeoutMs ?? Math.max(interval, 5_000);
    const signal = opts.signal;
    for (;;) {
      if (signal?.aborted) throw new OrtbusError("cancelled", `watch of job ${job} aborted by the caller`, { cause: signal.reason });
      let st: JobStatus | undefined;
      try {
        st = await this.jobStatus(job, signal ? { timeoutMs, signal } : { timeoutMs });
      } catch (e) {
        if (signal?.aborted || !isOrtbusError(e) || !WATCH_TRANSIENT.has(e.code)) throw e;
      }
      if (st) {
        yield st;
        if (jobFinished(st)) return st;
      }
      await abortableSleep(interval, signal);
    }
  }

  /** Sends an inference request of op, filling id, class, pool, model and timeout. */
  private request<T>(op: Op, req: WireRequest, opts: CallOptions): Promise<T> {
    const id = opts.id ?? randomUUID();
    const full: WireRequest = { ...req, id };
    const cls = opts.class ?? this.class;
    if (cls !== undefined) full.class = cls;
    const pool = opts.pool ?? this.pool;
    if (pool !== undefined) full.pool = pool;
    if (opts.model !== undefined) full.model = opts.model;
    full.timeout_ms = Math.max(1, Math.ceil(opts.timeoutMs ?? this.timeoutMs));
    return this.send<T>(op, full, id, { ...opts, timeoutMs: full.timeout_ms });
  }

  /**
   * One request/reply on ortbus.v1.<op>. The wait is bounded by timeoutMs + grace; on an
   * abort or a local timeout the request is cancelled on the gateway (fire and forget).
   */
  private send<T>(op: Op, body: object, id: string | undefined, opts: Pick<CallOptions, "timeoutMs" | "signal">): Promise<T> {
    const subject = `${API_PREFIX}.${op}`;
    const timeoutMs = Math.max(1, opts.timeoutMs ?? this.timeoutMs);
    const signal = opts.signal;
    const withId = (o: { details?: Record<string, unknown>; status?: number; cause?: unknown }) =>
      id === undefined ? o : { ...o, requestId: id };
    if (signal?.aborted) {
      return Promise.reject(new OrtbusError("cancelled", `${op} aborted before it was sent`, withId({ cause: signal.reason })));
    }
    let data: Uint8Array;
    try {
      data = encodeMsg(body);
    } catch (e) {
      return Promise.reject(new OrtbusError("bad_request", `encode ${op} request: ${errText(e)}`, withId({ cause: e })));
    }
    const failover = this.failover && WORK_OPS.has(op);
    return new Promise<T>((resolve, reject) => {
      let settled = false;
      // Ends a failover exchange still waiting (an abort).
      let stopExchange: (() => void) | undefined;
      const finish = (fn: () => void) => {
        if (settled) return;
        settled = true;
        signal?.removeEventListener("abort", onAbort);
        stopExchange?.();
        fn();
      };
      const onAbort = () => {
        finish(() => {
          if (id !== undefined && op !== "cancel") this.publishCancel(id);
          reject(new OrtbusError("cancelled", `${op} ${id ?? ""} aborted by the caller`.trim(), withId({ cause: signal?.reason })));
        });
      };
      signal?.addEventListener("abort", onAbort, { once: true });
      const deadline = performance.now() + timeoutMs + GRACE_MS;
      const resendable = op !== "cancel";
      const settling = () => this.lastReconnect > 0 && performance.now() - this.lastReconnect < SETTLE_MS;
      const attempt = async (): Promise<T> => {
        for (;;) {
          await this.whenConnected(deadline - performance.now());
          const left = Math.ceil(deadline - performance.now());
          if (left <= 0) throw new TimeoutLocal();
          let msg: Msg;
          try {
            if (failover) {
              // Sent again, within the exchange, when a gateway dies or the connection drops.
              msg = await this.exchange(subject, data, deadline, (stop) => (stopExchange = stop));
            } else if (!resendable) {
              msg = await this.nc.request(subject, data, { timeout: left });
            } else {
              // Told of the next disconnect through a listener the request removes once
              // settled: a reaction left on a shared promise would keep every reply alive
              // until the next disconnect.
              let onLost: () => void = () => {};
              const lost = new Promise<null>((res) => (onLost = () => res(null)));
              this.disconnects.add(onLost);
              const req = this.nc.request(subject, data, { timeout: left });
              let got: Msg | null;
              try {
                got = await Promise.race([req, lost]);
              } finally {
                this.disconnects.delete(onLost);
              }
              if (got === null) {
                // The connection went down with the request out: it (or its reply) may be
                // gone with the server. Inference is idempotent: send it again once
                // reconnected.
                req.catch(() => {});
                if (settled) throw new TimeoutLocal();
                continue;
              }
              msg = got;
            }
          } catch (e) {
            // Nobody subscribed just after a reconnect: the gateway is still resubscribing.
            if (!settled && settling() && isNoResponders(e) && deadline - performance.now() > RETRY_MS) {
              await new Promise((r) => setTimeout(r, RETRY_MS));
              continue;
            }
            throw e;
          }
          try {
            return decodeReply<T>(op, msg, id);
          } catch (e) {
            // Just after a reconnect the gateway may be back before the workers are: its
            // no_worker then means "not yet"; the request never ran, so it is sent again.
            if (!settled && resendable && settling() && isOrtbusError(e, "no_worker") && deadline - performance.now() > RETRY_MS) {
              await new Promise((r) => setTimeout(r, RETRY_MS));
              continue;
            }
            throw e;
          }
        }
      };
      attempt().then(
        (v) => finish(() => resolve(v)),
        (e) =>
          finish(() => {
            const err = transportError(op, e, timeoutMs, withId);
            if (err.code === "deadline_exceeded" && id !== undefined && op !== "cancel") this.publishCancel(id);
            reject(err);
          }),
      );
    });
  }

  /**
   * One call's request/reply with failover (see "Gateway failover" above): sends data to
   * subject, and sends it again with the header Ortbus-Resend (at most MAX_RESENDS times)
   * when a gateway is judged dead, once reconnected after the connection dropped, after
   * one beat interval when a notice names a gateway this client judged dead, and shortly
   * after a resend found no gateway while another send is still out. Every send stays out
   * until the end. Resolves with the first reply that is not a notice; rejects with the
   * last send's error when nothing is out or due any more, or with TimeoutLocal at
   * deadline (or when onStop's function is called).
   */
  private exchange(subject: string, data: Uint8Array, deadline: number, onStop: (stop: () => void) => void): Promise<Msg> {
    const beats = this.followBeats();
    return new Promise<Msg>((resolve, reject) => {
      let done = false;
      let waiting = 0; // sends still out
      let resends = 0;
      let retry: ReturnType<typeof setTimeout> | undefined; // a resend due later
      // The gateway the last notice named as holding the call (undefined: not known), and
      // its deaths then: the death of another gateway does not send again.
      let holder: string | undefined;
      let holderDeaths = 0;
      const end = (fn: () => void) => {
        if (done) return;
        done = true;
        clearTimeout(timer);
        if (retry !== undefined) clearTimeout(retry);
        offDeaths();
        this.disconnects.delete(resend);
        fn();
      };
      const timer = setTimeout(() => end(() => reject(new TimeoutLocal())), Math.max(0, deadline - performance.now()));
      onStop(() => end(() => reject(new TimeoutLocal())));
      const onReply = (m: Msg) => {
        waiting--;
        if (done) return;
        const held = m.headers?.get(HEADER_HELD) ?? "";
        if (held === "") {
          end(() => resolve(m));
          return;
        }
        // A live gateway holds it: wait for its answer. One this client already judged
        // dead while the answering gateway did not yet: ask again after one of its beats.
        const [dead, interval, deaths] = beats.isDead(held);
        holder = held;
        holderDeaths = deaths;
        if (dead) later(interval);
      };
      const onError = (e: unknown) => {
        waiting--;
        if (done) return;
        if (isNoResponders(e) && waiting > 0) {
          later(RETRY_MS); // no gateway right now (they are restarting): ask again shortly
        } else if (waiting === 0 && retry === undefined) {
          end(() => reject(e));
        }
      };
      // Publishes one send, already counted in waiting.
      const sendOnce = (resend: boolean) => {
        const left = Math.ceil(deadline - performance.now());
        if (left <= 0) {
          onError(new TimeoutLocal());
          return;
        }
        const o: RequestOptions = { timeout: left };
        if (resend) {
          const h = natsHeaders();
          h.set(HEADER_RESEND, "1");
          o.headers = h;
        }
        let p: Promise<Msg>;
        try {
          p = this.nc.request(subject, data, o);
        } catch (e) {
          p = Promise.reject(e);
        }
        p.then(onReply, onError);
      };
      const resend = () => {
        if (done || resends >= MAX_RESENDS) return;
        resends++;
        waiting++;
        // Not published while the connection is down (nats.js could lose it around the
        // reconnect): sent once reconnected.
        void this.whenConnected(deadline - performance.now()).then(() => {
          if (!done) sendOnce(true);
        });
      };
      const later = (ms: number) => {
        if (retry !== undefined) clearTimeout(retry);
        retry = setTimeout(() => {
          retry = undefined;
          resend();
        }, ms);
      };
      // Gateways were judged dead: sent again when the holder is among them, or not known.
      const onDeaths = () => {
        if (done) return;
        if (holder !== undefined && beats.isDead(holder)[2] === holderDeaths) return; // another one died
        holder = undefined; // the resend's answer names who holds it now
        resend();
      };
      const offDeaths = beats.deaths(onDeaths);
      // The connection went down with the sends out: they (or their replies) may be gone
      // with the server. Sent again once reconnected; a gateway that still holds the
      // request answers that resend with a notice, and its answer comes to the first send.
      this.disconnects.add(resend);
      waiting++;
      sendOnce(false);
    });
  }

  private publishCancel(id: string): void {
    try {
      // Sent as a request on this connection (its answer is not awaited): the gateway
      // honours a cancel only when its reply subject is under the inbox of the connection
      // that sent the request.
      if (!this.nc.isClosed()) {
        this.nc.request(`${API_PREFIX}.cancel`, encodeMsg({ id }), { timeout: 5000 }).catch(() => {});
      }
    } catch {
      // The connection is gone: nothing runs for a client that cannot reach the bus.
    }
  }
}

/** Codes that watchJob retries: the gateway or its job store is briefly not there. */
const WATCH_TRANSIENT: ReadonlySet<OrtbusErrorCode> = new Set<OrtbusErrorCode>(["no_worker", "unavailable", "overloaded", "deadline_exceeded"]);

/** Waits ms, or rejects with code "cancelled" when signal aborts first. */
function abortableSleep(ms: number, signal: AbortSignal | undefined): Promise<void> {
  return new Promise((resolve, reject) => {
    const onAbort = () => {
      clearTimeout(timer);
      reject(new OrtbusError("cancelled", "watch aborted by the caller", { cause: signal?.reason }));
    };
    const timer = setTimeout(() => {
      signal?.removeEventListener("abort", onAbort);
      resolve();
    }, ms);
    if (signal?.aborted) onAbort();
    else signal?.addEventListener("abort", onAbort, { once: true });
  });
}

/** A job.results reply as it arrives. */
interface WireJobResults {
  job: string;
  op: string;
  results?: { seq?: number; i?: number; path?: string; result?: unknown; error?: { code?: unknown; message?: unknown; details?: unknown } }[];
  next?: number;
  more?: boolean;
}

function normJobStatus(st: JobStatus): JobStatus {
  const n = (v: unknown) => (typeof v === "number" ? v : Number(v ?? 0));
  return {
    ...st,
    total: n(st.total),
    done: n(st.done),
    failed: n(st.failed),
    running: n(st.running),
    redelivered: n(st.redelivered),
    rate_per_s: n(st.rate_per_s),
    eta_s: n(st.eta_s),
    started_unix_ms: n(st.started_unix_ms),
  };
}

/** One wire result, its reply typed (and normalised) as the op's call would return it. */
function jobResult(op: JobOp, x: NonNullable<WireJobResults["results"]>[number]): JobResult {
  const out = { op, seq: Number(x.seq ?? 0), i: Number(x.i ?? 0), path: String(x.path ?? "") } as JobResult;
  if (x.error != null) {
    const e = x.error;
    const code = typeof e.code === "string" ? e.code : "";
    const details = e.details && typeof e.details === "object" ? (e.details as Record<string, unknown>) : undefined;
    out.error = KNOWN_CODES.has(code)
      ? new OrtbusError(code as OrtbusErrorCode, String(e.message ?? code), details ? { details } : {})
      : new OrtbusError("internal", String(e.message ?? `item failed with code ${code}`), { details: { ...details, original_code: code } });
    return out;
  }
  if (x.result != null && typeof x.result === "object") {
    const r = x.result as Record<string, unknown>;
    switch (op) {
      case "tag":
        out.result = normTag(r as unknown as TagReply);
        break;
      case "embed":
        out.result = { ...(r as unknown as EmbedReply), embedding: float32FromBytes(r.embedding) };
        break;
      case "detect":
        out.result = { ...(r as unknown as DetectReply), boxes: (r.boxes as Box[] | undefined) ?? [] };
        break;
      default:
        (out as { result?: unknown }).result = r;
    }
  }
  return out;
}

function normTag(r: TagReply): TagReply {
  return {
    ...r,
    general: r.general ?? {},
    character: r.character ?? {},
    rating: r.rating ?? {},
    ips: r.ips ?? [],
    ips_mapping: r.ips_mapping ?? {},
  };
}

function errText(e: unknown): string {
  return e instanceof Error ? e.message : String(e);
}

/** Reads a reply: an error reply (micro headers) becomes an OrtbusError. */
function decodeReply<T>(op: Op, msg: Msg, id: string | undefined): T {
  const h = msg.headers;
  const codeHeader = h?.get(HEADER_ERROR_CODE) ?? "";
  if (codeHeader !== "") {
    const status = Number.parseInt(codeHeader, 10);
    const text = h?.get(HEADER_ERROR) ?? "";
    let body: { code?: unknown; message?: unknown; details?: unknown } | undefined;
    if (msg.data.length > 0) {
      try {
        body = decodeBody(msg);
      } catch {
        body = undefined;
      }
    }
    const o: { details?: Record<string, unknown>; status?: number; requestId?: string } = {};
    if (Number.isFinite(status)) o.status = status;
    if (id !== undefined) o.requestId = id;
    if (body && typeof body.code === "string" && KNOWN_CODES.has(body.code)) {
      if (body.details && typeof body.details === "object") o.details = body.details as Record<string, unknown>;
      return throwErr(new OrtbusError(body.code as OrtbusErrorCode, String(body.message ?? text), o));
    }
    o.details = { status, ...(body && typeof body.code === "string" ? { original_code: body.code } : {}) };
    return throwErr(new OrtbusError("internal", text || `${op} failed with status ${codeHeader}`, o));
  }
  try {
    return decodeBody<T>(msg);
  } catch (e) {
    throw new OrtbusError("internal", `decode ${op} reply: ${errText(e)}`, id === undefined ? { cause: e } : { cause: e, requestId: id });
  }
}

/** A reply body within REPLY_LIMITS: msgpack, or JSON when the reply says so. */
function decodeBody<T = unknown>(msg: Msg): T {
  const ct = msg.headers?.get("Content-Type") ?? "";
  return ct.split(";")[0]!.trim().toLowerCase() === "application/json" ? decodeJSON<T>(msg.data) : decodeMsg<T>(msg.data);
}

function throwErr(e: OrtbusError): never {
  throw e;
}

/** The client's own wait ran out before a request could be sent. */
class TimeoutLocal extends Error {
  constructor() {
    super("timeout waiting for the connection");
    this.name = "TimeoutError";
  }
}

function isNoResponders(e: unknown): boolean {
  const name = e instanceof Error ? e.name : "";
  const cause = e instanceof Error ? (e as Error & { cause?: unknown }).cause : undefined;
  const causeName = cause instanceof Error ? cause.name : "";
  return (
    name === "NoRespondersError" ||
    causeName === "NoRespondersError" ||
    (typeof (e as { isNoResponders?: () => boolean })?.isNoResponders === "function" &&
      (e as { isNoResponders: () => boolean }).isNoResponders()) ||
    /no responders/i.test(errText(e))
  );
}

/** Maps a nats.js request failure to an OrtbusError. */
function transportError(
  op: Op,
  e: unknown,
  timeoutMs: number,
  withId: (o: { details?: Record<string, unknown>; status?: number; cause?: unknown }) => object,
): OrtbusError {
  if (e instanceof OrtbusError) return e;
  const name = e instanceof Error ? e.name : "";
  const msg = errText(e);
  const cause = e instanceof Error ? (e as Error & { cause?: unknown }).cause : undefined;
  const causeName = cause instanceof Error ? cause.name : "";
  if (isNoResponders(e)) {
    return new OrtbusError("no_worker", `no ortbus gateway is answering ${API_PREFIX}.${op}`, withId({ cause: e }));
  }
  if (name === "TimeoutError" || causeName === "TimeoutError" || /timeout/i.test(msg)) {
    return new OrtbusError(
      "deadline_exceeded",
      `no answer to ${op} within ${timeoutMs + GRACE_MS} ms (timeout ${timeoutMs} ms + ${GRACE_MS} ms grace)`,
      withId({ details: { client_timeout_ms: timeoutMs + GRACE_MS }, cause: e }),
    );
  }
  return new OrtbusError("internal", `${op} request failed: ${msg}`, withId({ details: { transport: name || "error" }, cause: e }));
}

// ---------------------------------------------------------------------------------------
// OrtbusAiClient: the app's IAiClient

/** The app's tagging result. */
export interface TaggingResponse {
  general: Record<string, number>;
  character: Record<string, number>;
  ips: string[];
  ips_mapping: Record<string, string[]>;
}

/** The app's OppaiOracle result. */
export interface OppaiOracleResponse {
  general: Record<string, number>;
  rating: Record<string, number>;
  /** Every tag returned, general, character and rating together. */
  tag: Record<string, number>;
}

export interface CcipFeatureResponse {
  feature: number[];
}

export interface CcipDifferenceResponse {
  difference: number;
}

export interface PersonDetection {
  bbox: { x1: number; y1: number; x2: number; y2: number };
  label: string;
  score: number;
}

/** The app's AI client interface, as its in-process implementation has it. */
export interface IAiClient {
  healthCheck(): Promise<boolean>;
  tagImage(imageBuffer: ArrayBuffer): Promise<TaggingResponse>;
  tagImageByPath(path: string): Promise<TaggingResponse>;
  tagImageOppaiOracleByPath(path: string): Promise<OppaiOracleResponse>;
  extractCcipFeature(imageBuffer: ArrayBuffer): Promise<CcipFeatureResponse>;
  extractCcipFeatureByPath(path: string): Promise<CcipFeatureResponse>;
  calculateCcipDifference(feature1: number[], feature2: number[]): Promise<CcipDifferenceResponse>;
  calculateCcipDistances(feature: number[], candidates: number[][]): Promise<number[]>;
}

/** Options of OrtbusAiClient.connect. */
export interface AiConnectOptions extends ConnectOptions {
  /** Model of tagImageOppaiOracleByPath (default "oppai"). */
  oppaiModel?: string;
  /** Models for the other methods (default: the class's default model of each op). */
  tagModel?: string;
  ccipModel?: string;
  detectModel?: string;
  segmentModel?: string;
}

/** Per-call options of the AI client's methods. */
export type AiCallOptions = Pick<CallOptions, "class" | "pool" | "timeoutMs" | "signal">;

/**
 * The app's IAiClient on top of ortbus: every method is one request (two for the buffer
 * variants: status once, to learn the spool dir). Defaults to the interactive class; pass
 * `{ class: "batch" }` per call (or `class` at connect) for library-wide jobs.
 */
export class OrtbusAiClient implements IAiClient {
  readonly client: OrtbusClient;
  private readonly opts: AiConnectOptions;
  private spool: Promise<string> | undefined;

  constructor(client: OrtbusClient, opts: Omit<AiConnectOptions, "servers"> = {}) {
    this.client = client;
    this.opts = { servers: [], ...opts };
    if (client.class === undefined) client.class = "interactive";
  }

  static async connect(opts: AiConnectOptions): Promise<OrtbusAiClient> {
    const c = await OrtbusClient.connect(opts);
    return new OrtbusAiClient(c, opts);
  }

  close(): Promise<void> {
    return this.client.close();
  }

  /**
   * The gateways heard beating (OrtbusClient.gateways): with `failover`, wait at start
   * until it lists the gateways you expect.
   */
  gateways(): string[] {
    return this.client.gateways();
  }

  /** True when the gateway answers and every pool has a live worker. */
  async healthCheck(opts: AiCallOptions = {}): Promise<boolean> {
    try {
      const h = await this.client.health({ timeoutMs: opts.timeoutMs ?? 5_000, ...(opts.signal ? { signal: opts.signal } : {}) });
      return h.status === "ok";
    } catch {
      return false;
    }
  }

  async tagImageByPath(path: string, opts: AiCallOptions = {}): Promise<TaggingResponse> {
    const r = await this.client.tag(path, this.call(opts, this.opts.tagModel));
    return { general: r.general, character: r.character, ips: r.ips, ips_mapping: r.ips_mapping };
  }

  tagImage(imageBuffer: ArrayBuffer | ArrayBufferView, opts: AiCallOptions = {}): Promise<TaggingResponse> {
    return this.withSpooled(imageBuffer, (p) => this.tagImageByPath(p, opts));
  }

  /** OppaiOracle tags (model `oppaiModel`, default "oppai", of kind tagger-oppai). */
  async tagImageOppaiOracleByPath(path: string, opts: AiCallOptions = {}): Promise<OppaiOracleResponse> {
    const r = await this.client.tag(path, this.call(opts, this.opts.oppaiModel ?? "oppai"));
    return { general: r.general, rating: r.rating, tag: { ...r.general, ...r.character, ...r.rating } };
  }

  async extractCcipFeatureByPath(path: string, opts: AiCallOptions = {}): Promise<CcipFeatureResponse> {
    const r = await this.client.embed(path, this.call(opts, this.opts.ccipModel));
    return { feature: Array.from(r.embedding) };
  }

  extractCcipFeature(imageBuffer: ArrayBuffer | ArrayBufferView, opts: AiCallOptions = {}): Promise<CcipFeatureResponse> {
    return this.withSpooled(imageBuffer, (p) => this.extractCcipFeatureByPath(p, opts));
  }

  async calculateCcipDifference(feature1: number[], feature2: number[], opts: AiCallOptions = {}): Promise<CcipDifferenceResponse> {
    const r = await this.client.compare(feature1, [feature2], this.call(opts, this.opts.ccipModel));
    const d = r.differences[0];
    if (d === undefined) throw new OrtbusError("internal", "compare returned no difference");
    return { difference: d };
  }

  /** Differences of feature to every candidate, in ONE compare request. */
  async calculateCcipDistances(feature: number[], candidates: number[][], opts: AiCallOptions = {}): Promise<number[]> {
    if (candidates.length === 0) return [];
    const r = await this.client.compare(feature, candidates, this.call(opts, this.opts.ccipModel));
    return r.differences;
  }

  /** Person boxes in the image at path. */
  async detectPersons(path: string, opts: AiCallOptions & { conf?: number; iou?: number } = {}): Promise<PersonDetection[]> {
    const o: DetectOptions = this.call(opts, this.opts.detectModel);
    if (opts.conf !== undefined) o.conf = opts.conf;
    if (opts.iou !== undefined) o.iou = opts.iou;
    const r = await this.client.detect(path, o);
    return r.boxes.map((b) => ({ bbox: { x1: b.x1, y1: b.y1, x2: b.x2, y2: b.y2 }, label: b.label, score: b.score }));
  }

  /**
   * isnetis background removal: writes the RGBA PNG to outPath (default: a file in the
   * gateway's spool dir) and returns its path.
   */
  async removeBackground(path: string, outPath?: string, opts: AiCallOptions = {}): Promise<string> {
    const o: SegmentOptions = this.call(opts, this.opts.segmentModel);
    if (outPath !== undefined) o.outPath = outPath;
    const r = await this.client.segment(path, o);
    return r.out_path;
  }

  /** isnetis background removal returning the PNG's bytes (the spool file is removed). */
  async removeBackgroundToBuffer(path: string, opts: AiCallOptions = {}): Promise<Uint8Array> {
    const out = await this.removeBackground(path, undefined, opts);
    try {
      return new Uint8Array(await readFile(out));
    } finally {
      await unlink(out).catch(() => {});
    }
  }

  private call(opts: AiCallOptions, model: string | undefined): CallOptions {
    const o: CallOptions = {};
    if (opts.class !== undefined) o.class = opts.class;
    if (opts.pool !== undefined) o.pool = opts.pool;
    if (opts.timeoutMs !== undefined) o.timeoutMs = opts.timeoutMs;
    if (opts.signal !== undefined) o.signal = opts.signal;
    if (model !== undefined) o.model = model;
    return o;
  }

  /** The gateway's spool dir (asked once; asked again after a failure). */
  private spoolDir(): Promise<string> {
    if (!this.spool) {
      this.spool = this.client.status({ timeoutMs: 5_000 }).then((st) => {
        if (!st.spool_dir) {
          throw new OrtbusError("bad_request", "the gateway has no spool_dir configured ([security] spool_dir): pass image paths instead of buffers");
        }
        return st.spool_dir;
      });
      this.spool.catch(() => {
        this.spool = undefined;
      });
    }
    return this.spool;
  }

  /** Writes buf to a fresh file in the spool dir, runs fn on its path, removes the file. */
  private async withSpooled<T>(buf: ArrayBuffer | ArrayBufferView, fn: (path: string) => Promise<T>): Promise<T> {
    const dir = await this.spoolDir();
    const bytes = ArrayBuffer.isView(buf) ? new Uint8Array(buf.buffer, buf.byteOffset, buf.byteLength) : new Uint8Array(buf);
    const path = join(dir, `ortbus-${randomUUID()}.img`);
    try {
      await mkdir(dir, { recursive: true });
      await writeFile(path, bytes, { mode: 0o644 });
    } catch (e) {
      throw new OrtbusError(
        "bad_request",
        `cannot write the image to the gateway's spool dir ${dir} (the client must share the workers' filesystem, or send paths): ${errText(e)}`,
        { details: { spool_dir: dir, ...(typeof (e as { code?: unknown })?.code === "string" ? { errno: (e as { code: string }).code } : {}) }, cause: e },
      );
    }
    try {
      return await fn(path);
    } finally {
      await unlink(path).catch(() => {});
    }
  }
}
