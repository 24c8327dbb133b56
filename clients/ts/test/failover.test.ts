// Gateway failover through the TypeScript client (the Bun twin of test/failover_test.go's
// TestGatewayFailover): two gateways (gwa, gwb; failover = true) serve the same queue
// group over one NATS server with JetStream (natsembed -js); a remote pool's worker (one
// slot, the slow tagger, ~110 ms a call), started here as another host would run it,
// serves both. A client with `failover` waits until gateways() lists both, fires 16 calls
// at once (interactive and batch mixed), and gateway A is killed with -9 (its process
// group) while it holds a dispatched and a queued request. Every call must resolve with
// its correct tags: those A held are sent again by the client when A's beats stop, and
// gateway B runs them. B keeps serving afterwards.
//
// A second test, on a NATS server of its own with fake gateways (a plain connection that
// beats for them and answers for them), checks that a call's resends are spent only on
// the death of the gateway holding it: a peer flapping ten times while the holder keeps
// the call does not leave the call without a resend when the holder dies.

import { afterAll, beforeAll, expect, setDefaultTimeout, test } from "bun:test";
import { mkdirSync, writeFileSync } from "node:fs";
import { join } from "node:path";

import { encode } from "@msgpack/msgpack";
import { connect, headers as natsHeaders } from "@nats-io/transport-node";
import type { NatsConnection } from "@nats-io/transport-node";

import { OrtbusClient, OrtbusError } from "../index.ts";
import type { PoolStatus, TagReply } from "../index.ts";
import {
  cleanupTmp,
  configText,
  freePort,
  generateModels,
  settle,
  startGateway,
  startNats,
  sleep,
  startWorker,
  tempDir,
  until,
  within,
  writeFixtures,
} from "./harness.ts";
import type { Fixtures, GatewayCfg, Proc } from "./harness.ts";

setDefaultTimeout(120_000);

/** One reply, status change or event; a passing run never waits it out. */
const REPLY_BOUND_MS = 30_000;
const CALLS = 16;

let tmp: string;
let nats: Proc | undefined;
let worker: Proc | undefined;
let gwA: Proc | undefined;
let gwB: Proc | undefined;
let client: OrtbusClient | undefined;
let spy: NatsConnection | undefined;
let fixtures: Fixtures;
/** What the spy saw: tag requests sent again (Ortbus-Resend), and Ortbus-Held notices. */
const seen = { resent: 0, held: 0 };

/** The gateway's own status over its HTTP API (not through the queue group). */
async function httpStatus(g: Proc): Promise<{ pools?: PoolStatus[] }> {
  const r = await fetch(`http://${g.ready!.http}/v1/status`, { signal: AbortSignal.timeout(5_000) });
  if (!r.ok) throw new Error(`GET /v1/status of ${g.ready!.http}: ${r.status}`);
  return (await r.json()) as { pools?: PoolStatus[] };
}

/** The sum of every sample of a metric (over its labels) in /metrics text. */
function metricSum(text: string, name: string): number {
  let sum = 0;
  for (const line of text.split("\n")) {
    if (!line.startsWith(`${name}{`)) continue;
    const v = Number(line.slice(line.lastIndexOf(" ") + 1));
    if (Number.isFinite(v)) sum += v;
  }
  return sum;
}

beforeAll(async () => {
  tmp = tempDir("ortbus-ts-failover-");
  const port = await freePort();
  nats = await startNats(port, join(tmp, "natsembed.log"), ["-js", "-sd", join(tmp, "jetstream")]);
  const url = `nats://127.0.0.1:${port}`;
  const root = join(tmp, "images");
  const spool = join(root, "spool");
  mkdirSync(spool, { recursive: true });
  const models = generateModels(tmp);
  fixtures = writeFixtures(root);
  const write = (id: string) => {
    const c: GatewayCfg = {
      natsUrl: url,
      root,
      spool,
      models,
      gatewayId: id,
      failover: true,
      // Gateways beat every 200 ms; a peer is dead after 5 silent intervals (the client
      // judges with its own missCount, 3 by default, so it asks B before B judges A dead
      // and hears Held: the notice path runs too). Workers are judged the same way.
      heartbeatInterval: "200ms",
      missCount: 5,
      pools: [{ name: "fo", version: "1.30.0", classes: ["interactive", "batch"], models: ["tagger_slow"], slots: 1, local: false }],
      classes: [
        { name: "interactive", priority: 1, chain: ["fo"], timeout: "30s", maxTimeout: "60s" },
        { name: "batch", priority: 2, chain: ["fo"], timeout: "30s", maxTimeout: "60s" },
      ],
    };
    const p = join(tmp, `${id}.toml`);
    writeFileSync(p, configText(c));
    return p;
  };
  const cfgA = write("gwa");
  const cfgB = write("gwb");
  worker = await startWorker(cfgA, "fo", join(tmp, "worker-fo.log")); // as another host would run it
  // A leads a process group of its own: the kill takes it and anything it started.
  gwA = await startGateway(cfgA, join(tmp, "gwa", "gateway.log"), "127.0.0.1:0", { group: true });
  gwB = await startGateway(cfgB, join(tmp, "gwb", "gateway.log"));
  for (const g of [gwA, gwB]) {
    await until(
      `gateway ${g.ready!.http} seeing the remote worker live`,
      async () => ((await httpStatus(g)).pools ?? []).some((p) => p.name === "fo" && p.live === 1),
      REPLY_BOUND_MS,
      50,
    );
  }
  // A plain subscriber (no queue group: it takes nothing from the gateways) that counts
  // the client's resends and the gateways' notices on the client's replies.
  spy = await connect({ servers: url });
  spy.subscribe("ortbus.v1.tag", {
    callback: (_, m) => {
      if (m.headers?.get("Ortbus-Resend")) seen.resent++;
    },
  });
  spy.subscribe("_INBOX.>", {
    callback: (_, m) => {
      if (m.headers?.get("Ortbus-Held")) seen.held++;
    },
  });
  await spy.flush();
  client = await OrtbusClient.connect({ servers: url, failover: true, reconnectTimeWaitMs: 100 });
  await until("the client hearing both gateways", async () => JSON.stringify(client!.gateways()) === JSON.stringify(["gwa", "gwb"]), REPLY_BOUND_MS, 20);
}, 120_000);

afterAll(async () => {
  await client?.close();
  await spy?.close();
  for (const p of [gwA, gwB, worker, nats]) await p?.stop();
  if (tmp) cleanupTmp(tmp);
}, 60_000);

test("gateway A killed -9 while it holds requests: every call gets its one correct answer", async () => {
  const c = client!;
  const blue = fixtures.colour.blue!;
  // Fire the calls at once; with one slow worker slot each gateway soon holds one request
  // dispatched and others queued.
  const t0 = performance.now();
  const calls = Array.from({ length: CALLS }, (_, i) =>
    settle(c.tag(blue, { id: `fo-${String(i).padStart(2, "0")}`, model: "tagger_slow", timeoutMs: 60_000, ...(i % 2 === 1 ? { class: "batch" } : {}) })),
  );
  // A holds requests when it has one in flight and one queued.
  let inflight = 0;
  let queued = 0;
  await until(
    "gateway A holding a dispatched and a queued request",
    async () => {
      const r = await fetch(`http://${gwA!.ready!.http}/metrics`, { signal: AbortSignal.timeout(5_000) });
      const m = await r.text();
      inflight = metricSum(m, "ortbus_inflight");
      queued = metricSum(m, "ortbus_queued");
      return inflight >= 1 && queued >= 1;
    },
    REPLY_BOUND_MS,
    5,
  );
  gwA!.kill9();
  await gwA!.waitExit();
  const killedAt = performance.now();
  console.log(`failover test: killed gateway A holding ${inflight + queued} requests (${inflight} dispatched) of ${CALLS} sent, ${(killedAt - t0).toFixed(0)} ms after sending`);

  const results = await within(60_000 + 2_000 + 5_000, "the calls", Promise.all(calls));
  const failed: string[] = [];
  results.forEach((r, i) => {
    if (!r.ok) failed.push(`call ${i}: ${r.error instanceof OrtbusError ? `${r.error.code}: ${r.error.message}` : String(r.error)}`);
    else if (!((r.value as TagReply).general.blue! >= 0.9)) failed.push(`call ${i}: wrong tags ${JSON.stringify(r.value.general)}`);
  });
  const last = Math.max(...results.map((r) => r.ms));
  console.log(
    `failover test: all ${CALLS} calls settled ${(t0 + last - killedAt).toFixed(0)} ms after the kill; failures: ${failed.length}; ` +
      `resends ${seen.resent}, notices (Ortbus-Held) ${seen.held}`,
  );
  expect(failed).toEqual([]);
  // The requests A held were answered only because the client sent them again.
  expect(seen.resent).toBeGreaterThan(0);
  expect(c.gateways()).toEqual(["gwb"]);

  // B keeps serving. A's requests were answered by B (A is dead): the proof that the
  // resends worked is that every call above succeeded although A held some.
  const after = await within(REPLY_BOUND_MS, "a call after the failover", c.tag(blue, { model: "tagger_slow", timeoutMs: REPLY_BOUND_MS }));
  expect(after.general.blue).toBeGreaterThanOrEqual(0.9);
});

test("a flapping peer does not spend a held call's resends: the holder's death still sends it again", async () => {
  const port = await freePort();
  const own = await startNats(port, join(tmp, "natsembed-flap.log"));
  const url = `nats://127.0.0.1:${port}`;
  const fake = await connect({ servers: url });
  // Beats every 50 ms, judged dead after 4 missed (200 ms): a loaded machine delays a
  // timer by tens of ms, which with 10 ms beats could judge fx dead too (a resend more).
  const c = await OrtbusClient.connect({ servers: url, failover: true, missCount: 4 });
  // fx holds the call; fy flaps (beats, falls silent until judged dead, beats again).
  const alive = { fx: true, fy: true };
  let seq = 0;
  const beats = setInterval(() => {
    for (const id of ["fx", "fy"] as const) {
      if (alive[id]) fake.publish(`ortbus.gw.${id}.hb`, encode({ gateway: id, seq: ++seq, interval_ms: 50 }));
    }
  }, 50);
  let resends = 0;
  try {
    // The fake gateways' API: the first send is held by fx and never answered here; a
    // resend is answered "Ortbus-Held: fx" while fx beats, and with the result once it
    // is dead (as a gateway that runs a request whose holder died would).
    fake.subscribe("ortbus.v1.tag", {
      queue: "ortbus-gateway",
      callback: (_, m) => {
        if (!m.headers?.get("Ortbus-Resend")) return;
        resends++;
        if (alive.fx) {
          const h = natsHeaders();
          h.set("Ortbus-Held", "fx");
          m.respond(new Uint8Array(), { headers: h });
        } else {
          m.respond(encode({ general: { blue: 0.99 }, pool: "fake", worker: "fake-0" }));
        }
      },
    });
    await fake.flush();
    await until("the client hearing fx and fy", async () => JSON.stringify(c.gateways()) === JSON.stringify(["fx", "fy"]), REPLY_BOUND_MS, 10);
    const call = settle(c.tag("/srv/flap.png", { id: "flap-1", timeoutMs: 20_000 }));
    await sleep(50); // the first send is out, held by fx
    for (let i = 0; i < 10; i++) {
      alive.fy = false;
      await until(`fy judged dead (${i + 1})`, async () => !c.gateways().includes("fy"), REPLY_BOUND_MS, 5);
      alive.fy = true;
      await until(`fy beating again (${i + 1})`, async () => c.gateways().includes("fy"), REPLY_BOUND_MS, 5);
    }
    alive.fx = false;
    const t0 = performance.now();
    const r = await within(REPLY_BOUND_MS, "the held call", call);
    if (!r.ok) throw r.error;
    expect(r.value.general.blue).toBeGreaterThanOrEqual(0.9);
    console.log(`flap test: answered ${(performance.now() - t0).toFixed(0)} ms after fx stopped beating; resends ${resends}`);
    // One resend for fy's first death (the holder not known yet: its notice names fx),
    // none for the nine others, one for fx's death.
    expect(resends).toBeLessThanOrEqual(3);
  } finally {
    clearInterval(beats);
    await c.close();
    await fake.close();
    await own.stop();
  }
});
