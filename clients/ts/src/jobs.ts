// Jobs (codec/jobs.go): one op over many image paths, kept in JetStream by the gateways
// (the gateway's NATS server needs JetStream; without it every job call rejects with code
// "unavailable"). OrtbusClient's job methods call the functions of the same names.

import { randomUUID } from "node:crypto";

import { isOrtbusError, KNOWN_CODES, OrtbusError } from "./errors.ts";
import type { OrtbusErrorCode } from "./errors.ts";
import type { Box, DetectReply, EmbedReply, OrtbusClass, SegmentReply, TagReply } from "./messages.ts";
import type { CallOptions } from "./options.ts";
import { normTag } from "./requests.ts";
import type { Sender } from "./requests.ts";
import { float32FromBytes } from "./tensors.ts";

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
  /** false: the gateway's result cache is neither read nor written for the items. */
  cache?: boolean;
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
  /**
   * Answer each item whose answer the gateway's result cache holds (the same bytes, model
   * revision, op and options) from the cache, and run the rest: a rescan of a library
   * computes only what changed. Needs `[cache] enabled` on the gateway.
   */
  incremental?: boolean;
  /** Run outside the gateway's quiet hours (`[jobs] windows`) too. */
  anytime?: boolean;
}

export interface JobSubmitReply {
  job: string;
  /** The number of items. */
  total: number;
}

/** "running", then "done" (every item answered), "cancelled", or "failed" (its results
 * could not be stored: `error` says why). */
export type JobState = "running" | "paused" | "done" | "cancelled" | "failed" | (string & {});

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
  /** When a paused job (state "paused") was paused. */
  paused_unix_ms?: number;
  finished_unix_ms?: number;
  /** Why a failed job failed. */
  error?: { code: string; message: string; details?: Record<string, unknown> };
  /** Items answered from the result cache, and by running: cached + computed = done + failed. */
  cached: number;
  computed: number;
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
    /** The result came from the result cache (an incremental job). */
    cached?: boolean;
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

export function submitJob(c: Sender, req: JobSubmitRequest, opts: Pick<CallOptions, "timeoutMs" | "signal">): Promise<JobSubmitReply> {
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
    if (o.cache !== undefined) w.cache = o.cache;
    wire.options = w;
  }
  if (req.incremental) wire.incremental = true;
  if (req.anytime) wire.anytime = true;
  return c.send<JobSubmitReply>("job.submit", wire, undefined, opts);
}

export function jobStatus(c: Sender, job: string, opts: Pick<CallOptions, "timeoutMs" | "signal">): Promise<JobStatus> {
  return c.send<JobStatus>("job.status", { job }, undefined, opts).then(normJobStatus);
}

export function cancelJob(c: Sender, job: string, opts: Pick<CallOptions, "timeoutMs" | "signal">): Promise<JobStatus> {
  return c.send<JobStatus>("job.cancel", { job }, undefined, opts).then(normJobStatus);
}

/** Pauses a job (pause true: job.pause) or resumes it (job.resume). */
export function pauseJob(c: Sender, job: string, pause: boolean, opts: Pick<CallOptions, "timeoutMs" | "signal">): Promise<JobStatus> {
  return c.send<JobStatus>(pause ? "job.pause" : "job.resume", { job }, undefined, opts).then(normJobStatus);
}

export async function listJobs(c: Sender, opts: Pick<CallOptions, "timeoutMs" | "signal">): Promise<JobListReply> {
  const r = await c.send<JobListReply>("job.list", {}, undefined, opts);
  return { jobs: (r.jobs ?? []).map(normJobStatus) };
}

export async function jobResults(c: Sender, job: string, opts: JobResultsOptions): Promise<JobResultsPage> {
  const req: Record<string, unknown> = { job };
  if (opts.from !== undefined && opts.from > 0) req.from = opts.from;
  if (opts.limit !== undefined && opts.limit > 0) req.limit = Math.floor(opts.limit);
  const r = await c.send<WireJobResults>("job.results", req, undefined, opts);
  const op = r.op as JobOp;
  return {
    job: r.job,
    op,
    results: (r.results ?? []).map((x) => jobResult(op, x)),
    next: Number(r.next ?? 0),
    more: r.more === true,
  };
}

/** Every result from opts.from on, page by page: page(opts) is one job.results request. */
export async function* eachJobResult(
  page: (opts: JobResultsOptions) => Promise<JobResultsPage>,
  opts: JobResultsOptions,
): AsyncGenerator<JobResult, void, undefined> {
  let from = opts.from ?? 0;
  for (;;) {
    const p = await page({ ...opts, from });
    yield* p.results;
    if (!p.more || p.next <= from) return; // (a page that moves nothing would loop)
    from = p.next;
  }
}

/** The job's status (status(opts) is one job.status request) until it is finished. */
export async function* watchJob(
  status: (opts: Pick<CallOptions, "timeoutMs" | "signal">) => Promise<JobStatus>,
  job: string,
  opts: WatchJobOptions,
): AsyncGenerator<JobStatus, JobStatus, undefined> {
  const interval = Math.max(1, opts.intervalMs ?? 1_000);
  const timeoutMs = opts.timeoutMs ?? Math.max(interval, 5_000);
  const signal = opts.signal;
  for (;;) {
    if (signal?.aborted) throw new OrtbusError("cancelled", `watch of job ${job} aborted by the caller`, { cause: signal.reason });
    let st: JobStatus | undefined;
    try {
      st = await status(signal ? { timeoutMs, signal } : { timeoutMs });
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
  results?: { seq?: number; i?: number; path?: string; result?: unknown; error?: { code?: unknown; message?: unknown; details?: unknown }; cached?: boolean }[];
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
    cached: n(st.cached),
    computed: n(st.computed),
  };
}

/** One wire result, its reply typed (and normalised) as the op's call would return it. */
function jobResult(op: JobOp, x: NonNullable<WireJobResults["results"]>[number]): JobResult {
  const out = { op, seq: Number(x.seq ?? 0), i: Number(x.i ?? 0), path: String(x.path ?? "") } as JobResult;
  if (x.cached === true) out.cached = true;
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
