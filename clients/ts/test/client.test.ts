// OrtbusClient and OrtbusAiClient against a real gateway, real workers (ORT 1.30.0 and
// 1.24.3), real NATS and the generated models: every method's shape and values, checked
// against a raw msgpack request over NATS for the same image; typed errors; failure
// behaviour (overloaded, deadline_exceeded, cancel by AbortSignal, a worker killed with
// the call in flight).

import { afterAll, beforeAll, describe, expect, setDefaultTimeout, test } from "bun:test";
import { readdirSync, readFileSync, statSync, unlinkSync, writeFileSync } from "node:fs";
import { join } from "node:path";

import { connect } from "@nats-io/transport-node";
import type { Msg, NatsConnection, Subscription } from "@nats-io/transport-node";

import {
  OrtbusAiClient,
  OrtbusClient,
  OrtbusError,
  ORTBUS_ERROR_CODES,
  decodeMsg,
  encodeMsg,
  float32FromBytes,
  isOrtbusError,
  npyBytes,
  tensorFromNpy,
  tensorValues,
} from "../index.ts";
import type { OrtbusErrorCode, TagReply } from "../index.ts";
import { COLOURS, RECT, settle, setup, sleep, teardown, until, within } from "./harness.ts";
import type { Env } from "./harness.ts";

setDefaultTimeout(30_000);

let env: Env;
let client: OrtbusClient;
let ai: OrtbusAiClient;
let raw: NatsConnection; // a plain NATS connection for direct ortbus requests and spies

beforeAll(async () => {
  env = await setup("client");
  client = await OrtbusClient.connect({ servers: env.url });
  ai = await OrtbusAiClient.connect({ servers: env.url });
  raw = await connect({ servers: env.url, name: "ortbus ts test raw" });
}, 90_000);

afterAll(async () => {
  await ai?.close();
  await client?.close();
  await raw?.close();
  await teardown(env);
}, 30_000);

// ---------------------------------------------------------------------------------------
// Direct ortbus requests: msgpack by hand over the plain connection, decoded by hand.

interface RawReply {
  error?: { code: string; message: string; details?: Record<string, unknown> };
  status?: number;
  body?: Record<string, unknown>;
}

async function direct(op: string, req: Record<string, unknown>): Promise<RawReply> {
  const m: Msg = await raw.request(`ortbus.v1.${op}`, encodeMsg(req), { timeout: 20_000 });
  const code = m.headers?.get("Nats-Service-Error-Code");
  if (code) return { status: Number(code), error: decodeMsg(m.data) };
  return { body: decodeMsg(m.data) };
}

/** Little-endian float32 from a bin, by DataView (independent of the client's decoder). */
function leFloats(b: Uint8Array): number[] {
  const dv = new DataView(b.buffer, b.byteOffset, b.byteLength);
  const out: number[] = [];
  for (let i = 0; i < b.byteLength; i += 4) out.push(dv.getFloat32(i, true));
  return out;
}

/** A spy: counts messages on a subject (a plain subscription takes nothing from the queue group). */
async function spy(subject: string): Promise<{ sub: Subscription; seen: Msg[] }> {
  const seen: Msg[] = [];
  const sub = raw.subscribe(subject, {
    callback: (_e, m) => {
      seen.push(m);
    },
  });
  await raw.flush();
  return { sub, seen };
}

async function expectCode(p: Promise<unknown>, code: OrtbusErrorCode, boundMs = 20_000): Promise<OrtbusError> {
  const r = await within(boundMs, `a call that should fail with ${code}`, settle(p));
  if (r.ok) throw new Error(`want ${code}, got a result: ${JSON.stringify(r.value)}`);
  expect(r.error).toBeInstanceOf(OrtbusError);
  const e = r.error as OrtbusError;
  if (e.code !== code) throw new Error(`want ${code}, got ${e.code}: ${e.message}`);
  expect(e.message.length).toBeGreaterThan(0);
  return e;
}

const colours = Object.keys(COLOURS);

// ---------------------------------------------------------------------------------------

describe("status and health", () => {
  test("status names the allowed roots, the spool dir, pools and live workers", async () => {
    const st = await client.status();
    expect(st.allowed_roots).toEqual([env.root]);
    expect(st.spool_dir).toBe(env.spool);
    expect(st.pools.map((p) => p.name).sort()).toEqual(["bulk", "fast", "slow"]);
    for (const p of st.pools) expect(p.live).toBe(1);
    const live = st.workers.filter((w) => w.state === "ready");
    expect(live.length).toBe(3);
    for (const w of live) {
      expect(typeof w.pid).toBe("number");
      expect(w.pid).toBeGreaterThan(0);
      expect(typeof w.uptime_ms).toBe("number"); // int64 fields arrive as numbers, not bigints
      expect(typeof w.rss_bytes).toBe("number");
    }
    expect(new Set(live.map((w) => w.runtime))).toEqual(new Set(["1.30.0", "1.24.3"]));
  });

  test("health and healthCheck", async () => {
    const h = await client.health();
    expect(h).toEqual({ status: "ok", workers: 3, pools: 3 });
    expect((await direct("health", {})).body).toEqual(h as unknown as Record<string, unknown>);
    expect(await ai.healthCheck()).toBe(true);
  });
});

describe("tag", () => {
  test("each corner colour is tagged with its name; values equal a direct request", async () => {
    for (const name of colours) {
      const path = env.fixtures.colour[name]!;
      const r = await ai.tagImageByPath(path);
      expect(Object.keys(r).sort()).toEqual(["character", "general", "ips", "ips_mapping"]);
      expect(r.general[name]).toBeGreaterThanOrEqual(0.9);
      for (const other of colours) if (other !== name) expect(r.general[other] ?? 0).toBeLessThan(0.1);
      expect(r.character).toEqual({});
      expect(r.ips).toEqual([]);
      const d = await direct("tag", { path });
      expect(d.error).toBeUndefined();
      expect(r.general).toEqual(d.body!.general as Record<string, number>);
      expect(r.character).toEqual(d.body!.character as Record<string, number>);
      expect(r.ips).toEqual(d.body!.ips as string[]);
      expect(r.ips_mapping).toEqual(d.body!.ips_mapping as Record<string, string[]>);
    }
  });

  test("left-white/right-black is the character split_hero of test_franchise", async () => {
    const r = await ai.tagImageByPath(env.fixtures.split);
    expect(r.character.split_hero).toBeGreaterThanOrEqual(0.9);
    expect(r.ips).toEqual(["test_franchise"]);
    expect(r.ips_mapping).toEqual({ split_hero: ["test_franchise"] });
    const d = await direct("tag", { path: env.fixtures.split });
    expect(r.character).toEqual(d.body!.character as Record<string, number>);
  });

  test("OrtbusClient.tag: the full reply, who served it, thresholds", async () => {
    const r: TagReply = await client.tag(env.fixtures.colour.red!, { id: "tag-full-1" });
    expect(r.id).toBe("tag-full-1");
    expect(r.model).toBe("tagger");
    expect(["fast", "bulk"]).toContain(r.pool);
    expect(r.worker.length).toBeGreaterThan(0);
    expect(r.runtime).toMatch(/^1\.(30\.0|24\.3)$/);
    expect(r.ep).toBe("cpu");
    expect(r.timing.total_us).toBeGreaterThan(0);
    expect(r.rating.general).toBeGreaterThan(0);
    // A threshold above every score leaves no general tag.
    const none = await client.tag(env.fixtures.colour.red!, { thresholds: { general: 0.9999 } });
    expect(none.general).toEqual({});
  });

  test("class and pool: batch goes to the batch pool; an explicit pool is strict", async () => {
    const b = await client.tag(env.fixtures.colour.green!, { class: "batch" });
    expect(b.pool).toBe("bulk");
    expect(b.runtime).toBe("1.24.3");
    const p = await client.tag(env.fixtures.colour.green!, { pool: "bulk" });
    expect(p.pool).toBe("bulk");
    const viaAi = await ai.tagImageByPath(env.fixtures.colour.green!, { class: "batch" });
    expect(viaAi.general.green).toBeGreaterThanOrEqual(0.9);
    // A client whose default class is batch.
    const bc = await OrtbusAiClient.connect({ servers: env.url, class: "batch" });
    try {
      expect((await bc.client.tag(env.fixtures.colour.blue!)).pool).toBe("bulk");
    } finally {
      await bc.close();
    }
  });

  test("tagImage(ArrayBuffer) spools the bytes, equals tagImageByPath, leaves no file", async () => {
    const bytes = env.fixtures.bytes["magenta.png"]!;
    const ab = bytes.buffer.slice(bytes.byteOffset, bytes.byteOffset + bytes.byteLength) as ArrayBuffer;
    const r = await ai.tagImage(ab);
    expect(r).toEqual(await ai.tagImageByPath(env.fixtures.colour.magenta!));
    expect(readdirSync(env.spool)).toEqual([]);
  });

  test("tagImageOppaiOracleByPath rejects with a typed error when no oppai model exists", async () => {
    const e = await expectCode(ai.tagImageOppaiOracleByPath(env.fixtures.colour.red!), "unknown_model");
    expect(e.status).toBe(404);
    expect(e.details?.model).toBe("oppai");
  });
});

describe("embed and compare", () => {
  test("embed: a 768-long Float32Array equal to a direct request's bin", async () => {
    for (const name of ["red", "blue", "white"]) {
      const path = env.fixtures.colour[name]!;
      const r = await client.embed(path);
      expect(r.embedding).toBeInstanceOf(Float32Array);
      expect(r.embedding.length).toBe(768);
      expect(r.dim).toBe(768);
      expect(r.model).toBe("ccip");
      const d = await direct("embed", { path });
      const bin = d.body!.embedding as Uint8Array;
      expect(bin).toBeInstanceOf(Uint8Array);
      expect(bin.byteLength).toBe(768 * 4);
      expect(Array.from(r.embedding)).toEqual(leFloats(bin));
      expect(r.embedding.every(Number.isFinite)).toBe(true);
      // The AI client's shape: {feature: number[768]}, the same values.
      const f = await ai.extractCcipFeatureByPath(path);
      expect(Object.keys(f)).toEqual(["feature"]);
      expect(Array.isArray(f.feature)).toBe(true);
      expect(f.feature).toEqual(Array.from(r.embedding));
    }
  });

  test("extractCcipFeature(ArrayBuffer) equals the by-path feature and leaves no file", async () => {
    const bytes = env.fixtures.bytes["cyan.png"]!;
    const f = await ai.extractCcipFeature(bytes.buffer.slice(bytes.byteOffset, bytes.byteOffset + bytes.byteLength) as ArrayBuffer);
    expect(f.feature).toEqual((await ai.extractCcipFeatureByPath(env.fixtures.colour.cyan!)).feature);
    expect(readdirSync(env.spool)).toEqual([]);
  });

  test("float32FromBytes copes with a bin at any byteOffset", () => {
    const vals = new Float32Array([1.5, -2, 3.25, 1e-7]);
    const backing = new Uint8Array(3 + vals.byteLength);
    backing.set(new Uint8Array(vals.buffer), 3); // offset 3: not a multiple of 4
    const view = backing.subarray(3);
    expect(Array.from(float32FromBytes(view))).toEqual(Array.from(vals));
    const buf = Buffer.from(backing.buffer, 1, backing.byteLength - 1).subarray(2); // a Buffer view
    expect(Array.from(float32FromBytes(buf))).toEqual(Array.from(vals));
  });

  test("same colour = same character; different colours are not; values equal a direct compare", async () => {
    const red = (await ai.extractCcipFeatureByPath(env.fixtures.colour.red!)).feature;
    const red2 = (await ai.extractCcipFeature(env.fixtures.bytes["red.png"]!.slice().buffer as ArrayBuffer)).feature;
    const blue = (await ai.extractCcipFeatureByPath(env.fixtures.colour.blue!)).feature;
    const same = await ai.calculateCcipDifference(red, red2);
    const diff = await ai.calculateCcipDifference(red, blue);
    expect(Object.keys(same)).toEqual(["difference"]);
    const c = await client.compare(new Float32Array(red), [new Float32Array(red2), new Float32Array(blue)]);
    expect(c.same).toEqual([true, false]);
    expect(same.difference).toBeLessThanOrEqual(c.threshold);
    expect(diff.difference).toBeGreaterThan(c.threshold);
    expect(c.differences).toEqual([same.difference, diff.difference]);
    // A direct compare with bins built by hand.
    const bin = (v: number[]) => {
      const b = new Uint8Array(4 * v.length);
      const dv = new DataView(b.buffer);
      v.forEach((x, i) => dv.setFloat32(4 * i, x, true));
      return b;
    };
    const d = await direct("compare", { feature: bin(red), candidates: [bin(red2), bin(blue)] });
    expect(d.body!.differences).toEqual(c.differences);
    expect(d.body!.threshold).toBe(c.threshold);
  });

  test("calculateCcipDistances is ONE compare request with every candidate", async () => {
    const feats: number[][] = [];
    for (const name of colours) feats.push((await ai.extractCcipFeatureByPath(env.fixtures.colour[name]!)).feature);
    const s = await spy("ortbus.v1.compare");
    const dist = await ai.calculateCcipDistances(feats[2]!, feats);
    await raw.flush();
    s.sub.unsubscribe();
    expect(s.seen.length).toBe(1);
    const sent = decodeMsg<{ feature: Uint8Array; candidates: Uint8Array[] }>(s.seen[0]!.data);
    expect(sent.feature).toBeInstanceOf(Uint8Array); // Float32Array on the wire: bin, not float64s
    expect(sent.candidates.length).toBe(feats.length);
    expect(dist.length).toBe(feats.length);
    for (let i = 0; i < feats.length; i++) {
      const one = await ai.calculateCcipDifference(feats[2]!, feats[i]!);
      expect(dist[i]).toBe(one.difference);
    }
    // The same differences as a direct compare request with every candidate.
    const bin = (v: number[]) => new Uint8Array(new Float32Array(v).buffer);
    const d = await direct("compare", { feature: bin(feats[2]!), candidates: feats.map(bin) });
    expect(d.body!.differences).toEqual(dist);
    const threshold = (await client.compare(feats[0]!, [feats[0]!])).threshold;
    dist.forEach((d, i) => (i === 2 ? expect(d).toBeLessThanOrEqual(threshold) : expect(d).toBeGreaterThan(threshold)));
    expect(await ai.calculateCcipDistances(feats[0]!, [])).toEqual([]);
  });
});

describe("detect, segment, infer, cancel", () => {
  test("detect: the red rectangle is a person, at its pixel box", async () => {
    const r = await client.detect(env.fixtures.rect);
    expect(r.boxes.length).toBe(1);
    const b = r.boxes[0]!;
    expect(b.label).toBe("person");
    expect(b.score).toBeGreaterThan(0.9);
    for (const k of ["x1", "y1", "x2", "y2"] as const) expect(Math.abs(b[k] - RECT[k])).toBeLessThanOrEqual(1);
    const persons = await ai.detectPersons(env.fixtures.rect);
    expect(persons).toEqual([{ bbox: { x1: b.x1, y1: b.y1, x2: b.x2, y2: b.y2 }, label: "person", score: b.score }]);
    const d = await direct("detect", { path: env.fixtures.rect });
    expect(d.body!.boxes).toEqual(r.boxes);
    expect(await ai.detectPersons(env.fixtures.colour.white!)).toEqual([]);
  });

  test("segment / removeBackground: an RGBA PNG file of the image's size", async () => {
    const r = await client.segment(env.fixtures.rect);
    expect(r.width).toBe(RECT.w);
    expect(r.height).toBe(RECT.h);
    expect(r.out_path.startsWith(env.spool + "/")).toBe(true);
    const png = readFileSync(r.out_path);
    expect(Array.from(png.subarray(0, 8))).toEqual([0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a]);
    expect(png.readUInt32BE(16)).toBe(RECT.w);
    expect(png[25]).toBe(6); // colour type RGBA
    unlinkSync(r.out_path);
    const out = join(env.root, "cutout.png");
    expect(await ai.removeBackground(env.fixtures.rect, out)).toBe(out);
    expect(statSync(out).size).toBeGreaterThan(0);
    // The same PNG as a direct segment request writes.
    const directOut = join(env.root, "cutout-direct.png");
    const d = await direct("segment", { path: env.fixtures.rect, out_path: directOut });
    expect(d.body!.out_path).toBe(directOut);
    expect(readFileSync(out).equals(readFileSync(directOut))).toBe(true);
    const before = new Set(readdirSync(env.spool));
    const bytes = await ai.removeBackgroundToBuffer(env.fixtures.rect);
    expect(Array.from(bytes.subarray(1, 4))).toEqual([0x50, 0x4e, 0x47]);
    expect(readdirSync(env.spool).filter((f) => !before.has(f))).toEqual([]); // its spool file is gone
    await expectCode(ai.removeBackground(env.fixtures.rect, "/tmp/elsewhere.png"), "forbidden_path");
  });

  test("infer: the tiny raw model computes 2x+1", async () => {
    const r = await client.infer({ x: { type: "float32", shape: [2, 4], data: new Float32Array([1, 2, 3, 4, -1, 0, 0.5, 10]) } }, { model: "tiny" });
    const y = r.outputs.y!;
    expect(y.type).toBe("float32");
    expect(y.shape).toEqual([2, 4]);
    expect(Array.from(tensorValues(y) as Float32Array)).toEqual([3, 5, 7, 9, -1, 1, 2, 21]);
    await expectCode(client.infer({ x: { type: "int32", shape: [1, 4], data: [1, 2, 3, 4] } }, { model: "tiny" }), "bad_request");
  });

  test("infer by path: a .npy input in the root, the output written as a .npy in the spool", async () => {
    const x = { type: "float32" as const, shape: [2, 4], data: new Float32Array([1, 2, 3, 4, -1, 0, 0.5, 10]) };
    const xPath = join(env.root, "x.npy");
    writeFileSync(xPath, npyBytes(x));
    expect(tensorFromNpy(readFileSync(xPath))).toEqual({ type: "float32", shape: [2, 4], data: new Uint8Array(new Float32Array([1, 2, 3, 4, -1, 0, 0.5, 10]).buffer) });
    const yPath = join(env.spool, "y-by-path.npy");
    const r = await client.infer({}, { model: "tiny", inputPaths: { x: xPath }, outputPaths: { y: yPath } });
    expect(r.output_paths).toEqual({ y: yPath });
    expect(r.outputs).toEqual({});
    const y = tensorFromNpy(readFileSync(yPath));
    expect(y.shape).toEqual([2, 4]);
    expect(Array.from(tensorValues(y) as Float32Array)).toEqual([3, 5, 7, 9, -1, 1, 2, 21]);
    unlinkSync(yPath);
    // Inline output from a by-path input; an output over an existing file is refused.
    const inline = await client.infer({}, { model: "tiny", inputPaths: { x: xPath } });
    expect(Array.from(tensorValues(inline.outputs.y!) as Float32Array)).toEqual([3, 5, 7, 9, -1, 1, 2, 21]);
    await expectCode(client.infer({}, { model: "tiny", inputPaths: { x: xPath }, outputPaths: { y: xPath } }), "forbidden_path");
    await expectCode(client.infer({}, { model: "tiny", inputPaths: { x: "/etc/passwd" } }), "forbidden_path");
    expect(() => tensorFromNpy(new Uint8Array([1, 2, 3]))).toThrow(OrtbusError);
  });

  test("cancel of an unknown id answers found=false", async () => {
    expect(await client.cancel("no-such-request")).toEqual({ id: "no-such-request", found: false });
  });
});

describe("typed errors", () => {
  test("the stable code union", () => {
    expect(ORTBUS_ERROR_CODES.length).toBe(22);
    const e = new OrtbusError("overloaded", "x");
    expect(e).toBeInstanceOf(Error);
    expect(e.status).toBe(429);
    expect(isOrtbusError(e, "overloaded")).toBe(true);
  });

  test("missing file -> file_not_found", async () => {
    const e = await expectCode(ai.tagImageByPath(join(env.root, "missing.png")), "file_not_found");
    expect(e.status).toBe(404);
    expect(e.details?.path).toBe(join(env.root, "missing.png"));
    await expectCode(ai.extractCcipFeatureByPath(join(env.root, "missing.png")), "file_not_found");
  });

  test("a path outside the allowed roots -> forbidden_path", async () => {
    const e = await expectCode(ai.tagImageByPath("/etc/hostname"), "forbidden_path");
    expect(e.status).toBe(403);
    await expectCode(ai.detectPersons(join(env.root, "..", "gateway.toml")), "forbidden_path");
  });

  test("unknown model / pool, bad class, not an image", async () => {
    expect((await expectCode(client.tag(env.fixtures.colour.red!, { model: "nope" }), "unknown_model")).details?.model).toBe("nope");
    await expectCode(client.tag(env.fixtures.colour.red!, { pool: "nope" }), "unknown_pool");
    await expectCode(client.tag(env.fixtures.colour.red!, { class: "nope" }), "bad_request");
    const before = readdirSync(env.spool).sort();
    const bad = await expectCode(ai.tagImage(new TextEncoder().encode("not an image").buffer as ArrayBuffer), "unsupported_image");
    expect(bad.status).toBe(400);
    expect(readdirSync(env.spool).sort()).toEqual(before); // the spooled file is removed on failure too
  });

  test("overloaded: a class with queue_bound 2 in front of a slow worker", async () => {
    const calls = Array.from({ length: 10 }, () => settle(client.tag(env.fixtures.colour.red!, { class: "slowq" })));
    const rs = await within(30_000, "10 slowq calls", Promise.all(calls));
    const codes = rs.map((r) => (r.ok ? "ok" : (r.error as OrtbusError).code));
    const over = rs.flatMap((r) => (!r.ok && isOrtbusError(r.error, "overloaded") ? [{ error: r.error, ms: r.ms }] : []));
    // Two queued (and one running, if the gateway dispatched the first before the third
    // arrived: the ten come at once, so it may not have): at least two answered, the rest
    // refused at once.
    expect(codes.filter((c) => c === "ok").length).toBeGreaterThanOrEqual(2);
    expect(over.length).toBeGreaterThanOrEqual(5);
    expect(codes.every((c) => c === "ok" || c === "overloaded")).toBe(true);
    for (const r of over) {
      expect(r.error.status).toBe(429);
      expect(r.ms).toBeLessThan(1_000); // refused at once, not after waiting
    }
  });

  test("deadline_exceeded: a tiny timeout behind a queue, answered by the gateway", async () => {
    const busy = Array.from({ length: 3 }, () => settle(client.tag(env.fixtures.colour.red!, { pool: "slow", model: "tagger_slow" })));
    await sleep(20);
    const e = await expectCode(client.tag(env.fixtures.colour.red!, { pool: "slow", model: "tagger_slow", timeoutMs: 60 }), "deadline_exceeded", 5_000);
    expect(e.status).toBe(504);
    expect(e.details?.client_timeout_ms).toBeUndefined(); // the gateway's answer, not the client's own timeout
    for (const r of await Promise.all(busy)) expect(r.ok).toBe(true);
  });

  test("AbortSignal: cancel while queued -> cancelled at once, and the gateway is told", async () => {
    const cancels = await spy("ortbus.v1.cancel");
    const busy = Array.from({ length: 3 }, () => settle(client.tag(env.fixtures.colour.red!, { pool: "slow", model: "tagger_slow" })));
    const ac = new AbortController();
    const p = settle(client.tag(env.fixtures.colour.red!, { pool: "slow", model: "tagger_slow", signal: ac.signal, id: "abort-me" }));
    await sleep(30);
    ac.abort();
    const r = await within(1_000, "the aborted call", p);
    if (r.ok) throw new Error("the aborted call succeeded");
    const e = r.error as OrtbusError;
    expect(e).toBeInstanceOf(OrtbusError);
    expect(e.code).toBe("cancelled");
    expect(e.status).toBe(499);
    expect(e.requestId).toBe("abort-me");
    await until("the cancel message on ortbus.v1.cancel", async () => cancels.seen.some((m) => decodeMsg<{ id: string }>(m.data).id === "abort-me"), 5_000);
    cancels.sub.unsubscribe();
    for (const b of await Promise.all(busy)) expect(b.ok).toBe(true);
    // The gateway dropped it: it is no longer known.
    expect((await client.cancel("abort-me")).found).toBe(false);
    // An already-aborted signal rejects without sending anything.
    await expectCode(client.tag(env.fixtures.colour.red!, { signal: AbortSignal.abort() }), "cancelled", 100);
    // Abort of a running call: rejected at once; the next call works.
    const ac2 = new AbortController();
    const running = settle(client.tag(env.fixtures.colour.red!, { pool: "slow", model: "tagger_slow", signal: ac2.signal }));
    await sleep(40);
    ac2.abort();
    const rr = await within(1_000, "the aborted running call", running);
    expect(!rr.ok && isOrtbusError(rr.error, "cancelled")).toBe(true);
    expect((await client.tag(env.fixtures.colour.red!, { pool: "slow", model: "tagger_slow" })).general.red).toBeGreaterThan(0.9);
  });

  test("worker_lost: kill -9 the worker holding the call -> worker_lost or success by retry, never a hang", async () => {
    const st = await client.status();
    const w = st.workers.find((x) => x.pool === "slow" && x.state === "ready")!;
    expect(w).toBeDefined();
    const id = "kill-holder-1";
    // The worker claims an item the moment it takes it (ortbus.claim.<gateway>): kill it then.
    let killedAt = 0;
    const claimed = new Promise<void>((res) => {
      const sub = raw.subscribe("ortbus.claim.>", {
        callback: (_e, m) => {
          const c = decodeMsg<{ id: string; worker: string; state: string }>(m.data);
          if (c.id === id && c.state === "taken" && killedAt === 0) {
            expect(c.worker).toBe(w.worker);
            process.kill(w.pid, "SIGKILL");
            killedAt = performance.now();
            sub.unsubscribe();
            res();
          }
        },
      });
    });
    await raw.flush();
    const p = settle(client.tag(env.fixtures.colour.red!, { pool: "slow", model: "tagger_slow", id }));
    await within(5_000, "the slow worker's claim of the call", claimed);
    // The supervisor sees the exit at once (a silent remote worker: 10 heartbeats, 1 s);
    // a retry waits for the restarted worker. 15 s only bounds a failure.
    const r = await within(15_000, "the call held by the killed worker", p);
    const after = performance.now() - killedAt;
    const outcome = r.ok ? `ok by retry (worker ${r.value.worker})` : (r.error as OrtbusError).code;
    console.log(`worker_lost test: ${outcome}, answered ${after.toFixed(0)} ms after the kill`);
    if (r.ok) {
      expect(r.value.general.red).toBeGreaterThan(0.9);
    } else {
      const e = r.error as OrtbusError;
      expect(e).toBeInstanceOf(OrtbusError);
      expect(e.code).toBe("worker_lost");
      expect(e.status).toBe(503);
      expect(e.details?.worker).toBe(w.worker);
      expect(after).toBeLessThan(1_000); // the exit is seen at once, before the heartbeat bound (10 x 100 ms)
    }
    // The pool serves again (the supervisor restarted the worker).
    await until("the slow pool to serve again", async () => (await client.status()).pools.find((x) => x.name === "slow")?.live === 1, 20_000, 50);
    expect((await client.tag(env.fixtures.colour.red!, { pool: "slow", model: "tagger_slow" })).general.red).toBeGreaterThan(0.9);
  });
  test("the holders of a call die twice -> poison_input, not retried again, never a hang", async () => {
    const id = "kill-holder-twice";
    const kills: string[] = [];
    const sub = raw.subscribe("ortbus.claim.>", {
      callback: (_e, m) => {
        const c = decodeMsg<{ id: string; worker: string; state: string; attempt?: number }>(m.data);
        if (c.id !== id || c.state !== "taken" || kills.includes(c.worker)) return;
        kills.push(c.worker);
        // The holder's pid from its heartbeat (it is live: the gateway routed to it).
        void client.status().then((st) => {
          const w = st.workers.find((x) => x.worker === c.worker && x.state === "ready");
          if (w) process.kill(w.pid, "SIGKILL");
        });
      },
    });
    await raw.flush();
    try {
      const r = await within(20_000, "a call whose holders die twice", settle(client.tag(env.fixtures.colour.red!, { pool: "slow", model: "tagger_slow", id })));
      console.log(`poison test: holders killed: ${kills.join(", ")}; outcome ${r.ok ? "ok" : (r.error as OrtbusError).code} after ${r.ms.toFixed(0)} ms`);
      if (r.ok) throw new Error(`want poison_input, got a result after killing ${kills.join(", ")}`);
      const e = r.error as OrtbusError;
      expect(e).toBeInstanceOf(OrtbusError);
      expect(e.code).toBe("poison_input");
      expect(e.status).toBe(422);
      expect(kills.length).toBe(2);
    } finally {
      sub.unsubscribe();
    }
    await until("the slow pool to serve again", async () => (await client.status()).pools.find((x) => x.name === "slow")?.live === 1, 20_000, 50);
    expect((await client.tag(env.fixtures.colour.red!, { pool: "slow", model: "tagger_slow" })).general.red).toBeGreaterThan(0.9);
  });
});
