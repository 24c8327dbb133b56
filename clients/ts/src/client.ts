// OrtbusClient: the ortbus API over NATS, one method per op. Its connection (state,
// send, failover) is connection.ts; each method builds its request in requests.ts,
// leases.ts or jobs.ts.

import type { NatsConnection } from "@nats-io/transport-node";

import { Connection, dial } from "./connection.ts";
import { DEFAULT_MISS_COUNT } from "./failover.ts";
import * as jobs from "./jobs.ts";
import type {
  JobListReply,
  JobResult,
  JobResultsOptions,
  JobResultsPage,
  JobStatus,
  JobSubmitReply,
  JobSubmitRequest,
  WatchJobOptions,
} from "./jobs.ts";
import * as leases from "./leases.ts";
import type { LeaseOptions } from "./leases.ts";
import type {
  CancelReply,
  CompareReply,
  DetectReply,
  EmbedReply,
  HealthReply,
  InferReply,
  Lease,
  OrtbusClass,
  Pause,
  SegmentReply,
  StatusReply,
  TagReply,
} from "./messages.ts";
import type { CallOptions, ConnectOptions, DetectOptions, InferOptions, SegmentOptions, TagOptions } from "./options.ts";
import * as requests from "./requests.ts";
import type { FloatVector, TensorInput } from "./tensors.ts";
import { DEFAULT_TIMEOUT_MS } from "./transport.ts";

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
  /** What the calls are sent on; it reads the defaults above at each call. */
  private readonly conn: Connection;

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
    this.conn = new Connection(nc, this);
  }

  /** Connects to NATS (reconnecting forever after a loss) and returns a client. */
  static async connect(opts: ConnectOptions): Promise<OrtbusClient> {
    const nc = await dial(opts);
    const d: { class?: OrtbusClass; pool?: string; timeoutMs?: number; failover?: boolean; missCount?: number } = {};
    if (opts.class !== undefined) d.class = opts.class;
    if (opts.pool !== undefined) d.pool = opts.pool;
    if (opts.timeoutMs !== undefined) d.timeoutMs = opts.timeoutMs;
    if (opts.failover !== undefined) d.failover = opts.failover;
    if (opts.missCount !== undefined) d.missCount = opts.missCount;
    const c = new OrtbusClient(nc, d);
    if (c.failover) c.conn.followBeats(); // hear the gateways from the start
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
    return this.conn.gateways();
  }

  /**
   * Drains the connection (replies already on their way are still delivered) and closes
   * it; bounded: after 5 s (say, while the server is unreachable) it just closes.
   */
  close(): Promise<void> {
    return this.conn.close();
  }

  /** Tags the image at path (absolute, inside the gateway's allowed roots). */
  tag(path: string, opts: TagOptions = {}): Promise<TagReply> {
    return requests.tag(this.conn, path, opts);
  }

  /** The embedding (e.g. CCIP feature) of the image at path, as a Float32Array. */
  embed(path: string, opts: CallOptions = {}): Promise<EmbedReply> {
    return requests.embed(this.conn, path, opts);
  }

  /** Differences of one feature to each candidate, in one request (N = 1: pairwise). */
  compare(feature: FloatVector, candidates: FloatVector[], opts: CallOptions = {}): Promise<CompareReply> {
    return requests.compare(this.conn, feature, candidates, opts);
  }

  /** Boxes found in the image at path. */
  detect(path: string, opts: DetectOptions = {}): Promise<DetectReply> {
    return requests.detect(this.conn, path, opts);
  }

  /** Writes the image's cut-out (RGBA PNG) and returns where. */
  segment(path: string, opts: SegmentOptions = {}): Promise<SegmentReply> {
    return requests.segment(this.conn, path, opts);
  }

  /**
   * Runs a raw model on named tensors: inline, or by path (opts.inputPaths); the outputs
   * come back inline, or as .npy files (opts.outputDir, opts.outputPaths; read them with
   * tensorFromNpy) named in the reply's output_paths.
   */
  infer(inputs: Record<string, TensorInput>, opts: InferOptions = {}): Promise<InferReply> {
    return requests.infer(this.conn, inputs, opts);
  }

  /** Cancels a request by id: dropped if queued, stopped if running. */
  cancel(id: string, opts: Pick<CallOptions, "timeoutMs" | "signal"> = {}): Promise<CancelReply> {
    return requests.cancel(this.conn, id, opts);
  }

  /** The system as the answering gateway sees it (pools, workers, classes, spool_dir). */
  status(opts: Pick<CallOptions, "timeoutMs" | "signal"> = {}): Promise<StatusReply> {
    return requests.status(this.conn, opts);
  }

  /** The answering gateway's health. */
  health(opts: Pick<CallOptions, "timeoutMs" | "signal"> = {}): Promise<HealthReply> {
    return requests.health(this.conn, opts);
  }

  // -------------------------------------------------------------------------------------
  // Leases: device memory held for a process ortbus does not run (an LLM server, a game),
  // counted in the device's memory admission until released or expired.

  /**
   * Acquires `bytes` of `device`'s memory budget. Rejects with code "overloaded" (details:
   * device, sum_bytes, budget_bytes) when the budget cannot hold it; with `waitMs`, the
   * gateway keeps the acquire waiting up to that long and grants it as soon as room is
   * made. An urgent or interactive lease holds batch work on the device to one unit while
   * it lives.
   */
  acquireLease(
    device: string,
    bytes: number,
    o: LeaseOptions & Pick<CallOptions, "timeoutMs" | "signal"> = {},
  ): Promise<Lease> {
    return leases.acquireLease(this.conn, device, bytes, o);
  }

  /** Extends a lease by `ttlMs` (default: the gateway's) from now. */
  renewLease(lease: string, o: { ttlMs?: number } & Pick<CallOptions, "timeoutMs" | "signal"> = {}): Promise<Lease> {
    return leases.renewLease(this.conn, lease, o);
  }

  /** Gives a lease's memory back. */
  releaseLease(lease: string, opts: Pick<CallOptions, "timeoutMs" | "signal"> = {}): Promise<Lease> {
    return leases.releaseLease(this.conn, lease, opts);
  }

  /**
   * Pauses a class (batch, while a voice session or a security event lasts) on `device`
   * or every device for `forMs` (1 s to 1 h: it ends on its own): its queued work waits,
   * what runs finishes, jobs take no new items. Pausing again extends this client's own.
   */
  pauseClass(cls: OrtbusClass, forMs: number, o: { device?: string } & Pick<CallOptions, "timeoutMs" | "signal"> = {}): Promise<Pause> {
    return leases.pauseClass(this.conn, cls, forMs, o);
  }

  /** Ends this client's own pause of a class (others' pauses go on). */
  resumeClass(cls: OrtbusClass, o: { device?: string } & Pick<CallOptions, "timeoutMs" | "signal"> = {}): Promise<Pause> {
    return leases.resumeClass(this.conn, cls, o);
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
    return jobs.submitJob(this.conn, req, opts);
  }

  /** A job's counts and state; an unknown (or expired) job rejects with code "unknown_job". */
  jobStatus(job: string, opts: Pick<CallOptions, "timeoutMs" | "signal"> = {}): Promise<JobStatus> {
    return jobs.jobStatus(this.conn, job, opts);
  }

  /**
   * Cancels a job: its waiting items are removed and its running ones stopped; what it
   * has done stays readable. Answers its status (state "cancelled").
   */
  cancelJob(job: string, opts: Pick<CallOptions, "timeoutMs" | "signal"> = {}): Promise<JobStatus> {
    return jobs.cancelJob(this.conn, job, opts);
  }

  /**
   * Pauses a job until resumeJob (a voice session or a security event started): its
   * running items finish, no other starts. Answers its status (state "paused").
   */
  pauseJob(job: string, opts: Pick<CallOptions, "timeoutMs" | "signal"> = {}): Promise<JobStatus> {
    return jobs.pauseJob(this.conn, job, true, opts);
  }

  /** Lets a paused job's items run again. Answers its status (state "running"). */
  resumeJob(job: string, opts: Pick<CallOptions, "timeoutMs" | "signal"> = {}): Promise<JobStatus> {
    return jobs.pauseJob(this.conn, job, false, opts);
  }

  /** The jobs still kept, newest first. */
  listJobs(opts: Pick<CallOptions, "timeoutMs" | "signal"> = {}): Promise<JobListReply> {
    return jobs.listJobs(this.conn, opts);
  }

  /**
   * One page of a job's results from `from` (0: the first), each `result` typed by the
   * job's op (a TagReply for tag, an EmbedReply with a Float32Array for embed, ...).
   */
  jobResults(job: string, opts: JobResultsOptions = {}): Promise<JobResultsPage> {
    return jobs.jobResults(this.conn, job, opts);
  }

  /**
   * Every result the job has recorded so far, in the order they were recorded, page by
   * page (`limit` a page), from `from`:
   *
   *   for await (const r of c.eachJobResult(job)) if (r.op === "tag" && r.result) use(r.result.general);
   */
  eachJobResult(job: string, opts: JobResultsOptions = {}): AsyncGenerator<JobResult, void, undefined> {
    return jobs.eachJobResult((o) => this.jobResults(job, o), opts);
  }

  /**
   * The job's status every `intervalMs` (default 1000), each one yielded, until the job is
   * finished: the last status yielded is the one whose state is "done" or "cancelled".
   * Errors that say the gateway is briefly gone (`no_worker`, `unavailable`, `overloaded`,
   * `deadline_exceeded`: a gateway restarting, the job store not open yet, NATS down) are
   * retried, since a job outlives gateways; any other error ends the watch by rejecting.
   * Aborting `signal` ends it with code "cancelled" (the job goes on; cancelJob stops it).
   */
  watchJob(job: string, opts: WatchJobOptions = {}): AsyncGenerator<JobStatus, JobStatus, undefined> {
    return jobs.watchJob((o) => this.jobStatus(job, o), job, opts);
  }
}
