// OrtbusAiClient: the app's IAiClient (its in-process AI client's interface) on top of
// OrtbusClient.

import { randomUUID } from "node:crypto";
import { mkdir, readFile, unlink, writeFile } from "node:fs/promises";
import { join } from "node:path";

import { OrtbusClient } from "./client.ts";
import { errText, OrtbusError } from "./errors.ts";
import type { CallOptions, ConnectOptions, DetectOptions, SegmentOptions } from "./options.ts";

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
