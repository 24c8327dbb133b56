// Test harness of the Bun suite: real processes only. It writes a gateway config for the
// generated models and the fetched ONNX Runtime libraries, starts `gateway` (and, for the
// reconnect test, `natsembed`), waits for their ready lines, and writes PNG fixtures.
//
// Where things are (the Go test test/tsclient_test.go sets these; the defaults fit a
// checkout after `make build prepare`):
//   ORTBUS_REPO     the repository root (for .deps/ort-VERSION/lib/libonnxruntime.so.1)
//   ORTBUS_BIN_DIR  the directory with gateway, ortworker, natsembed and ortbus
//   ORTBUS_KEEP_TMP set to keep the temporary directories (logs) after the run
//   ORTBUS_TS_TMP   where to make them (the Go driver's; it shows their logs on failure)

import { spawn, spawnSync } from "node:child_process";
import type { ChildProcess } from "node:child_process";
import { closeSync, existsSync, mkdirSync, mkdtempSync, openSync, readFileSync, realpathSync, rmSync, writeFileSync } from "node:fs";
import { createServer } from "node:net";
import { tmpdir } from "node:os";
import { dirname, join, resolve } from "node:path";
import { createInterface } from "node:readline";
import { deflateSync } from "node:zlib";

export const REPO = resolve(process.env.ORTBUS_REPO ?? join(import.meta.dir, "..", "..", ".."));
export const BIN_DIR = resolve(process.env.ORTBUS_BIN_DIR ?? join(REPO, "bin"));

/** Bounds of waits for events; a passing run never waits them out. */
export const START_BOUND_MS = 60_000;
export const STOP_BOUND_MS = 20_000;

export function bin(name: string): string {
  const p = join(BIN_DIR, name);
  if (!existsSync(p)) throw new Error(`${p} is missing: run \`make build\` (or set ORTBUS_BIN_DIR)`);
  return p;
}

export function runtimeLib(version: string): string {
  const p = join(REPO, ".deps", `ort-${version}`, "lib", "libonnxruntime.so.1");
  if (!existsSync(p)) throw new Error(`ONNX Runtime ${version} is not at ${p}: run \`make prepare\``);
  return p;
}

/** A fresh temporary directory (symlinks resolved), removed by cleanupTmp. */
export function tempDir(prefix: string): string {
  return realpathSync(mkdtempSync(join(process.env.ORTBUS_TS_TMP ?? tmpdir(), prefix)));
}

/**
 * Removes a temporary directory, unless ORTBUS_KEEP_TMP is set or the directories live
 * under ORTBUS_TS_TMP (the Go driver's own temporary directory: it shows the logs in them
 * when the suite fails, and removes them).
 */
export function cleanupTmp(dir: string): void {
  if (process.env.ORTBUS_KEEP_TMP || process.env.ORTBUS_TS_TMP) return;
  rmSync(dir, { recursive: true, force: true });
}

/** Slow tagger's compute layers: ~4 ms each on one core, so ~100 ms a call. */
export const SLOW_LAYERS = 25;

/** Generates the project's models (and a slow tagger) into dir/models with `ortbus models gen`. */
export function generateModels(dir: string): string {
  const out = join(dir, "models");
  const r = spawnSync(bin("ortbus"), ["models", "gen", out, "-heavy", String(SLOW_LAYERS)], { encoding: "utf8" });
  if (r.status !== 0) throw new Error(`ortbus models gen: ${r.status} ${r.stderr}`);
  return out;
}

/**
 * Writes an executable wrapper that runs ortworker at a lower CPU priority (nice), for a
 * batch pool sharing the CPU with interactive pools (config: [pools.NAME] worker = ...).
 */
export function niceWorker(dir: string, niceness = 10): string {
  const p = join(dir, "ortworker-nice.sh");
  writeFileSync(p, `#!/bin/sh\nexec nice -n ${niceness} ${JSON.stringify(bin("ortworker"))} "$@"\n`, { mode: 0o755 });
  return p;
}

/** A free TCP port on loopback (for natsembed, which must restart on the same port). */
export async function freePort(): Promise<number> {
  return await new Promise((res, rej) => {
    const s = createServer();
    s.once("error", rej);
    s.listen(0, "127.0.0.1", () => {
      const a = s.address();
      const port = typeof a === "object" && a ? a.port : 0;
      s.close(() => res(port));
    });
  });
}

// ---------------------------------------------------------------------------------------
// Config

export interface PoolCfg {
  name: string;
  version: string; // ORT version from .deps
  classes: string[];
  models: string[];
  workers?: number;
  slots?: number;
  maxBatch?: number;
  maxDelay?: string;
  env?: Record<string, string>;
  worker?: string; // ortworker binary (or a wrapper) for this pool
  /** false: a remote pool, its workers started by the test (startWorker), known by their beats. */
  local?: boolean;
}

export interface ClassCfg {
  name: string;
  priority: number;
  chain: string[];
  queueBound?: number;
  timeout?: string;
  maxTimeout?: string;
  models?: Record<string, string>;
}

export interface GatewayCfg {
  /** External NATS URL; unset = embedded (listening on any free port). */
  natsUrl?: string;
  root: string; // allowed root
  spool: string; // spool dir (inside root)
  models: string; // generated models dir
  pools: PoolCfg[];
  classes: ClassCfg[];
  /** The embedded server's JetStream store directory (the job API needs JetStream). */
  storeDir?: string;
  /** [cache] enabled (needs storeDir). */
  cache?: boolean;
  /** [jobs] ack_wait: how soon JetStream gives a job item held by a gone gateway to another. */
  jobsAckWait?: string;
  /**
   * Heartbeats missed in a row that mark a worker dead, at 100 ms each. Default 10 (1 s):
   * on a loaded 2-core machine a busy or idle worker's beats have been seen ~1 s apart,
   * and a local worker's death is seen at once by its supervisor anyway (process exit).
   */
  missCount?: number;
  /** [health] heartbeat_interval (default "100ms"): workers' and gateways' beats. */
  heartbeatInterval?: string;
  /** [gateway] id (default: host-pid). */
  gatewayId?: string;
  /** [gateway] failover: keep accepted requests and answers in ortbus_answers (JetStream). */
  failover?: boolean;
  /** [devices.NAME]: a declared capacity (e.g. "1GiB") and safe fraction, for leases. */
  devices?: Record<string, { capacity: string; safeFraction?: number }>;
}

const q = (s: string) => JSON.stringify(s);
const list = (a: string[]) => `[${a.map(q).join(", ")}]`;

export function configText(c: GatewayCfg): string {
  const lines: string[] = [];
  if (c.natsUrl) lines.push("[nats]", `url = ${q(c.natsUrl)}`, "");
  else lines.push("[nats]", "embedded = true", `listen = "127.0.0.1:0"`, ...(c.storeDir ? [`store_dir = ${q(c.storeDir)}`] : []), "");
  // The suite kills workers on purpose (three deaths in a few seconds): a crash loop is
  // 10 deaths here, so those kills never stop a pool's restarts.
  lines.push("[gateway]", `shutdown_grace = "3s"`, `restart_backoff_min = "50ms"`, "crash_loop_count = 10");
  if (c.gatewayId) lines.push(`id = ${q(c.gatewayId)}`);
  if (c.failover) lines.push("failover = true");
  lines.push("");
  lines.push("[health]", `heartbeat_interval = ${q(c.heartbeatInterval ?? "100ms")}`, `miss_count = ${c.missCount ?? 10}`, "");
  if (c.jobsAckWait) lines.push("[jobs]", `ack_wait = ${q(c.jobsAckWait)}`, "");
  if (c.cache) lines.push("[cache]", "enabled = true", "");
  for (const [name, d] of Object.entries(c.devices ?? {})) {
    lines.push(`[devices.${q(name)}]`, `capacity = ${q(d.capacity)}`, ...(d.safeFraction ? [`safe_fraction = ${d.safeFraction}`] : []), "");
  }
  // The app writes cut-outs next to its images: its root is an output root too.
  lines.push("[security]", `allowed_roots = [${q(c.root)}]`, `output_roots = [${q(c.root)}]`, `spool_dir = ${q(c.spool)}`, "");
  for (const cl of c.classes) {
    lines.push(`[classes.${cl.name}]`, `priority = ${cl.priority}`, `chain = ${list(cl.chain)}`);
    if (cl.queueBound) lines.push(`queue_bound = ${cl.queueBound}`);
    if (cl.timeout) lines.push(`timeout = ${q(cl.timeout)}`);
    if (cl.maxTimeout) lines.push(`max_timeout = ${q(cl.maxTimeout)}`);
    if (cl.models) {
      lines.push("", `[classes.${cl.name}.models]`);
      for (const [op, m] of Object.entries(cl.models)) lines.push(`${op} = ${q(m)}`);
    }
    lines.push("");
  }
  for (const p of c.pools) {
    lines.push(
      `[pools.${p.name}]`,
      `runtime = ${q(runtimeLib(p.version))}`,
      `ep = "cpu"`,
      `device = "cpu"`,
      `threads = 1`,
      `workers = ${p.workers ?? 1}`,
      `slots = ${p.slots ?? 1}`,
      `classes = ${list(p.classes)}`,
      `models = ${list(p.models)}`,
    );
    if (p.maxBatch) lines.push(`max_batch = ${p.maxBatch}`);
    if (p.maxDelay) lines.push(`max_delay = ${q(p.maxDelay)}`);
    if (p.env) lines.push(`env = { ${Object.entries(p.env).map(([k, v]) => `${k} = ${q(v)}`).join(", ")} }`);
    if (p.worker) lines.push(`worker = ${q(p.worker)}`);
    if (p.local === false) lines.push("local = false");
    lines.push("");
  }
  const m = c.models;
  const models: [string, string, string][] = [
    ["tagger", "tagger-pixai", join(m, "tagger")],
    ["tagger_slow", "tagger-pixai", join(m, "tagger-heavy")],
    ["ccip", "ccip", join(m, "ccip")],
    ["detector", "detect", join(m, "detector")],
    ["segmenter", "segment", join(m, "isnetis")],
    ["tiny", "raw", join(m, "tiny")],
  ];
  for (const [name, kind, dir] of models) lines.push(`[models.${name}]`, `kind = ${q(kind)}`, `dir = ${q(dir)}`, "");
  return lines.join("\n");
}

/** The standard pools and classes of the suite (the shape of deploy/local.toml plus a slow pool). */
export function standardConfig(base: { natsUrl?: string; root: string; spool: string; models: string }): GatewayCfg {
  const c: GatewayCfg = {
    ...base,
    pools: [
      // fast: ORT 1.30.0, urgent + interactive, every model.
      { name: "fast", version: "1.30.0", classes: ["urgent", "interactive"], models: ["tagger", "ccip", "detector", "segmenter", "tiny"] },
      // bulk: ORT 1.24.3, interactive + batch, dynamic batching of the batch class.
      { name: "bulk", version: "1.24.3", classes: ["interactive", "batch"], models: ["tagger", "ccip"], maxBatch: 8, maxDelay: "5ms" },
      // slow: one worker with the slow tagger, for queueing, deadline, cancel and kill tests.
      { name: "slow", version: "1.30.0", classes: ["interactive", "slowq"], models: ["tagger_slow"] },
    ],
    classes: [
      { name: "urgent", priority: 0, chain: ["fast"], timeout: "2s", maxTimeout: "5s" },
      {
        name: "interactive",
        priority: 1,
        chain: ["fast", "bulk"],
        timeout: "10s",
        maxTimeout: "60s",
        models: { tag: "tagger", embed: "ccip", compare: "ccip", detect: "detector", segment: "segmenter", infer: "tiny" },
      },
      { name: "batch", priority: 2, chain: ["bulk"], timeout: "5m", maxTimeout: "1h", models: { tag: "tagger", embed: "ccip", compare: "ccip" } },
      // slowq: a tiny queue in front of the slow pool (overloaded at once when full).
      { name: "slowq", priority: 1, chain: ["slow"], queueBound: 2, timeout: "30s", maxTimeout: "60s", models: { tag: "tagger_slow" } },
    ],
  };
  if (base.natsUrl === undefined) delete c.natsUrl;
  return c;
}

// ---------------------------------------------------------------------------------------
// Processes

export interface Ready {
  event: string;
  nats_url: string;
  http?: string;
}

/**
 * Every child still running: killed when this process exits (under `bun test`, run it
 * with --no-orphans, which kills every descendant on exit even where "exit" hooks do not
 * run; the Go driver also kills the suite's whole process group).
 */
const running = new Set<Proc>();
process.once("exit", () => {
  for (const p of running) p.kill9();
});

/** A child process that printed a JSON ready line on stdout. */
export class Proc {
  readonly child: ChildProcess;
  readonly logPath: string;
  readonly name: string;
  ready?: Ready;
  /** Whether the process leads a process group of its own (kill9 kills the group). */
  readonly group: boolean;
  private exitedP: Promise<number | null>;
  private done = false;

  constructor(name: string, cmd: string, args: string[], logPath: string, opts: { group?: boolean } = {}) {
    this.name = name;
    this.logPath = logPath;
    this.group = opts.group ?? false;
    mkdirSync(dirname(logPath), { recursive: true });
    const fd = openSync(logPath, "a");
    this.child = spawn(cmd, args, { stdio: ["ignore", "pipe", fd], detached: this.group });
    closeSync(fd);
    running.add(this);
    this.exitedP = new Promise((res) => {
      this.child.once("exit", (code, sig) => {
        this.done = true;
        running.delete(this);
        res(code ?? (sig ? -1 : null));
      });
    });
  }

  get pid(): number {
    return this.child.pid ?? -1;
  }

  get alive(): boolean {
    return !this.done;
  }

  log(): string {
    try {
      return readFileSync(this.logPath, "utf8");
    } catch {
      return "";
    }
  }

  /** Waits for the first stdout line that is JSON with event "ready". */
  async waitReady(boundMs = START_BOUND_MS): Promise<Ready> {
    const rl = createInterface({ input: this.child.stdout! });
    let timer: ReturnType<typeof setTimeout> | undefined;
    try {
      const r = await Promise.race([
        new Promise<Ready>((res) => {
          rl.on("line", (line) => {
            try {
              const v = JSON.parse(line) as Ready;
              if (v.event === "ready") res(v);
            } catch {
              // not JSON: ignore
            }
          });
        }),
        this.exitedP.then((code) => {
          throw new Error(`${this.name} exited (${code}) before its ready line; log:\n${this.log()}`);
        }),
        new Promise<never>((_, rej) => {
          timer = setTimeout(() => rej(new Error(`${this.name}: no ready line within ${boundMs} ms; log:\n${this.log()}`)), boundMs);
        }),
      ]);
      this.ready = r;
      // Keep draining stdout so that the child never blocks on a full pipe.
      this.child.stdout!.resume();
      return r;
    } finally {
      if (timer) clearTimeout(timer);
    }
  }

  /** Resolves with the exit code when the process ends, or rejects after boundMs. */
  async waitExit(boundMs = STOP_BOUND_MS): Promise<number | null> {
    let timer: ReturnType<typeof setTimeout> | undefined;
    try {
      return await Promise.race([
        this.exitedP,
        new Promise<never>((_, rej) => {
          timer = setTimeout(() => rej(new Error(`${this.name} did not exit within ${boundMs} ms`)), boundMs);
        }),
      ]);
    } finally {
      if (timer) clearTimeout(timer);
    }
  }

  /** SIGKILL to the process, or to its whole process group when it leads one. */
  kill9(): void {
    if (!this.alive) return; // (once reaped, its pid may be another's)
    try {
      if (this.group) process.kill(-this.pid, "SIGKILL");
      else this.child.kill("SIGKILL");
    } catch {
      // already gone
    }
  }

  /** SIGTERM (a gateway drains its workers), SIGKILL after the bound. */
  async stop(): Promise<void> {
    if (!this.alive) return;
    this.child.kill("SIGTERM");
    try {
      await this.waitExit(STOP_BOUND_MS);
    } catch {
      this.child.kill("SIGKILL");
      await this.exitedP;
    }
  }
}

/**
 * Starts `gateway -config cfgPath` on free ports (its embedded NATS server on natsListen,
 * for a gateway restarted on the same address) and waits for its ready line.
 */
export async function startGateway(cfgPath: string, logPath: string, natsListen = "127.0.0.1:0", opts: { group?: boolean } = {}): Promise<Proc> {
  const g = new Proc(
    "gateway",
    bin("gateway"),
    ["-config", cfgPath, "-nats-listen", natsListen, "-http-listen", "127.0.0.1:0", "-worker", bin("ortworker")],
    logPath,
    opts,
  );
  try {
    await g.waitReady();
  } catch (e) {
    g.kill9();
    throw e;
  }
  return g;
}

/** Starts `natsembed -p port` (with extra nats-server flags: `-js -sd DIR`) and waits for its ready line. */
export async function startNats(port: number, logPath: string, extraArgs: string[] = []): Promise<Proc> {
  const n = new Proc("natsembed", bin("natsembed"), ["-a", "127.0.0.1", "-p", String(port), ...extraArgs], logPath);
  try {
    await n.waitReady();
  } catch (e) {
    n.kill9();
    throw e;
  }
  return n;
}

/**
 * Starts `ortworker -config cfgPath -pool pool -id <pool>-w`, as another host runs a
 * remote pool's worker (local = false; it takes NATS from the config), and waits for its
 * ready line.
 */
export async function startWorker(cfgPath: string, pool: string, logPath: string): Promise<Proc> {
  const w = new Proc(`worker ${pool}-w`, bin("ortworker"), ["-config", cfgPath, "-pool", pool, "-id", `${pool}-w`], logPath);
  try {
    await w.waitReady();
  } catch (e) {
    w.kill9();
    throw e;
  }
  return w;
}

/** A running gateway with its directories: what each test file's beforeAll sets up. */
export interface Env {
  tmp: string;
  root: string;
  spool: string;
  models: string;
  cfgPath: string;
  gateway: Proc;
  url: string;
  fixtures: Fixtures;
}

/** Makes the directories, models, config and fixtures, and starts a gateway. */
/** Stops what setup started (if it started) and removes its temporary directory. */
export async function teardown(env: Env | undefined): Promise<void> {
  if (!env) return;
  await env.gateway.stop();
  cleanupTmp(env.tmp);
}

export async function setup(
  prefix: string,
  opts: { natsUrl?: string; natsListen?: string; edit?: (c: GatewayCfg, tmp: string) => void } = {},
): Promise<Env> {
  const tmp = tempDir(`ortbus-ts-${prefix}-`);
  const root = join(tmp, "images");
  const spool = join(root, "spool");
  mkdirSync(spool, { recursive: true });
  const models = generateModels(tmp);
  const base: { natsUrl?: string; root: string; spool: string; models: string } = { root, spool, models };
  if (opts.natsUrl) base.natsUrl = opts.natsUrl;
  const cfg = standardConfig(base);
  opts.edit?.(cfg, tmp);
  const cfgPath = join(tmp, "gateway.toml");
  writeFileSync(cfgPath, configText(cfg));
  const fixtures = writeFixtures(root);
  const gateway = await startGateway(cfgPath, join(tmp, "gateway.log"), opts.natsListen);
  return { tmp, root, spool, models, cfgPath, gateway, url: opts.natsUrl ?? gateway.ready!.nats_url, fixtures };
}

// ---------------------------------------------------------------------------------------
// PNG fixtures (a tiny encoder: 8-bit RGB, filter 0, zlib from node:zlib)

const CRC_TABLE = (() => {
  const t = new Uint32Array(256);
  for (let n = 0; n < 256; n++) {
    let c = n;
    for (let k = 0; k < 8; k++) c = c & 1 ? 0xedb88320 ^ (c >>> 1) : c >>> 1;
    t[n] = c >>> 0;
  }
  return t;
})();

function crc32(buf: Uint8Array): number {
  let c = 0xffffffff;
  for (let i = 0; i < buf.length; i++) c = CRC_TABLE[(c ^ buf[i]!) & 0xff]! ^ (c >>> 8);
  return (c ^ 0xffffffff) >>> 0;
}

function chunk(type: string, data: Uint8Array): Uint8Array {
  const out = new Uint8Array(12 + data.length);
  const dv = new DataView(out.buffer);
  dv.setUint32(0, data.length);
  for (let i = 0; i < 4; i++) out[4 + i] = type.charCodeAt(i);
  out.set(data, 8);
  dv.setUint32(8 + data.length, crc32(out.subarray(4, 8 + data.length)));
  return out;
}

export type RGB = [number, number, number];

/** Encodes a w×h RGB image whose pixel (x, y) is px(x, y) as PNG. */
export function encodePNG(w: number, h: number, px: (x: number, y: number) => RGB): Uint8Array {
  const raw = new Uint8Array(h * (1 + 3 * w));
  for (let y = 0; y < h; y++) {
    const row = y * (1 + 3 * w);
    raw[row] = 0; // filter: none
    for (let x = 0; x < w; x++) {
      const [r, g, b] = px(x, y);
      raw.set([r, g, b], row + 1 + 3 * x);
    }
  }
  const ihdr = new Uint8Array(13);
  const dv = new DataView(ihdr.buffer);
  dv.setUint32(0, w);
  dv.setUint32(4, h);
  ihdr.set([8, 2, 0, 0, 0], 8); // bit depth 8, colour type RGB, deflate, filter 0, no interlace
  const parts = [
    new Uint8Array([0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a]),
    chunk("IHDR", ihdr),
    chunk("IDAT", new Uint8Array(deflateSync(raw))),
    chunk("IEND", new Uint8Array(0)),
  ];
  const out = new Uint8Array(parts.reduce((n, p) => n + p.length, 0));
  let o = 0;
  for (const p of parts) {
    out.set(p, o);
    o += p.length;
  }
  return out;
}

export const COLOURS: Record<string, RGB> = {
  black: [0, 0, 0],
  white: [255, 255, 255],
  red: [255, 0, 0],
  green: [0, 255, 0],
  blue: [0, 0, 255],
  yellow: [255, 255, 0],
  cyan: [0, 255, 255],
  magenta: [255, 0, 255],
};

/** The red rectangle of the detect fixture: columns and rows RECT.x1..x2-1, y1..y2-1. */
export const RECT = { w: 128, h: 96, x1: 32, y1: 20, x2: 96, y2: 70 };

export interface Fixtures {
  colour: Record<string, string>; // colour name -> uniform 64x64 PNG
  split: string; // left white, right black
  rect: string; // red rectangle on white
  bytes: Record<string, Uint8Array>; // the PNG bytes by file name
}

export function writeFixtures(root: string): Fixtures {
  const f: Fixtures = { colour: {}, split: "", rect: "", bytes: {} };
  const write = (name: string, png: Uint8Array) => {
    const p = join(root, name);
    writeFileSync(p, png);
    f.bytes[name] = png;
    return p;
  };
  for (const [name, rgb] of Object.entries(COLOURS)) f.colour[name] = write(`${name}.png`, encodePNG(64, 64, () => rgb));
  f.split = write("split.png", encodePNG(96, 64, (x) => (x < 48 ? COLOURS.white! : COLOURS.black!)));
  f.rect = write(
    "rect.png",
    encodePNG(RECT.w, RECT.h, (x, y) => (x >= RECT.x1 && x < RECT.x2 && y >= RECT.y1 && y < RECT.y2 ? COLOURS.red! : COLOURS.white!)),
  );
  return f;
}

// ---------------------------------------------------------------------------------------
// Small utilities

export function median(xs: number[]): number {
  const s = [...xs].sort((a, b) => a - b);
  const m = s.length >> 1;
  return s.length % 2 ? s[m]! : (s[m - 1]! + s[m]!) / 2;
}

export function percentile(xs: number[], p: number): number {
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.min(s.length - 1, Math.max(0, Math.ceil((p / 100) * s.length) - 1))]!;
}

/** Rejects with a clear message if p has not settled within ms (the "never hangs" bound). */
export async function within<T>(ms: number, what: string, p: Promise<T>): Promise<T> {
  let timer: ReturnType<typeof setTimeout> | undefined;
  try {
    return await Promise.race([
      p,
      new Promise<never>((_, rej) => {
        timer = setTimeout(() => rej(new Error(`${what}: not settled within ${ms} ms (hang)`)), ms);
      }),
    ]);
  } finally {
    if (timer) clearTimeout(timer);
  }
}

/** Settles p into {ok, value} or {ok: false, error} without throwing. */
export async function settle<T>(p: Promise<T>): Promise<{ ok: true; value: T; ms: number } | { ok: false; error: unknown; ms: number }> {
  const t0 = performance.now();
  try {
    const value = await p;
    return { ok: true, value, ms: performance.now() - t0 };
  } catch (error) {
    return { ok: false, error, ms: performance.now() - t0 };
  }
}

export const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

/** Polls fn every `every` ms until it returns a truthy value, or throws after boundMs. */
export async function until<T>(what: string, fn: () => Promise<T | undefined | null | false>, boundMs = 20_000, every = 20): Promise<T> {
  const deadline = Date.now() + boundMs;
  let last: unknown;
  for (;;) {
    try {
      const v = await fn();
      if (v) return v;
    } catch (e) {
      last = e;
    }
    if (Date.now() > deadline) throw new Error(`${what}: not within ${boundMs} ms${last ? ` (last error: ${String(last)})` : ""}`);
    await sleep(every);
  }
}
