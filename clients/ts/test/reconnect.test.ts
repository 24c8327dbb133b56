// The client on an external NATS server (natsembed): no gateway -> no_worker at once; a
// responder that never answers -> the client's own bounded timeout; the NATS server killed
// and restarted on the same port -> the client, the gateway and the workers reconnect and
// the next calls succeed, and a call made during the outage settles (never hangs).

import { afterAll, beforeAll, expect, setDefaultTimeout, test } from "bun:test";

import { connect } from "@nats-io/transport-node";
import type { NatsConnection } from "@nats-io/transport-node";

import { OrtbusAiClient, OrtbusClient, OrtbusError } from "../index.ts";
import { cleanupTmp, freePort, settle, setup, startNats, teardown, tempDir, until, within } from "./harness.ts";
import type { Env, Proc } from "./harness.ts";

setDefaultTimeout(60_000);

let port: number;
let url: string;
let natsDir: string;
let nats: Proc;
let env: Env | undefined;
let client: OrtbusClient;

beforeAll(async () => {
  port = await freePort();
  natsDir = tempDir("ortbus-ts-nats-");
  nats = await startNats(port, `${natsDir}/natsembed.log`);
  const restartedAt = performance.now();
  url = `nats://127.0.0.1:${port}`;
  client = await OrtbusClient.connect({ servers: url, reconnectTimeWaitMs: 100 });
}, 60_000);

afterAll(async () => {
  await client?.close();
  await teardown(env);
  await nats?.stop();
  if (natsDir) cleanupTmp(natsDir);
}, 30_000);

test("connecting to a NATS server that is not there rejects with a typed error", async () => {
  const closed = await freePort();
  const r = await within(10_000, "connect to a closed port", settle(OrtbusClient.connect({ servers: `nats://127.0.0.1:${closed}` })));
  expect(r.ok).toBe(false);
  expect((r as { error: unknown }).error).toBeInstanceOf(OrtbusError);
  expect(((r as { error: unknown }).error as OrtbusError).code).toBe("no_worker");
});

test("no gateway on the bus -> no_worker at once", async () => {
  const t0 = performance.now();
  const r = await settle(client.tag("/nowhere/x.png"));
  expect(r.ok).toBe(false);
  const e = (r as { error: unknown }).error as OrtbusError;
  expect(e).toBeInstanceOf(OrtbusError);
  expect(e.code).toBe("no_worker");
  expect(performance.now() - t0).toBeLessThan(1_000);
  const ai = new OrtbusAiClient(client);
  expect(await ai.healthCheck()).toBe(false);
});

test("a responder that never answers -> deadline_exceeded from the client after timeout + grace", async () => {
  const nc: NatsConnection = await connect({ servers: url });
  try {
    nc.subscribe("ortbus.v1.tag", { callback: () => {} }); // takes the request, never replies
    await nc.flush();
    const t0 = performance.now();
    const r = await within(10_000, "a call nobody answers", settle(client.tag("/nowhere/x.png", { timeoutMs: 200 })));
    const ms = performance.now() - t0;
    expect(r.ok).toBe(false);
    const e = (r as { error: unknown }).error as OrtbusError;
    expect(e.code).toBe("deadline_exceeded");
    expect(e.details?.client_timeout_ms).toBe(2_200);
    expect(ms).toBeGreaterThanOrEqual(2_100);
    expect(ms).toBeLessThan(4_000);
  } finally {
    await nc.close();
  }
});

test("NATS killed and restarted on the same port: the next calls succeed", async () => {
  env = await setup("reconnect", { natsUrl: url });
  const ai = new OrtbusAiClient(client);
  const red = env.fixtures.colour.red!;
  expect((await ai.tagImageByPath(red)).general.red).toBeGreaterThanOrEqual(0.9);
  expect(await ai.healthCheck()).toBe(true);

  // Watch the client's connection events.
  const events: string[] = [];
  (async () => {
    for await (const s of client.nc.status()) events.push(s.type);
  })().catch(() => {});

  nats.kill9();
  await nats.waitExit();
  // A call made while the server is down waits for the reconnect (within its timeout)...
  const during = settle(ai.tagImageByPath(red, { timeoutMs: 10_000 }));
  // ...and one whose timeout runs out first fails, typed, by its bound: never a hang.
  const down = await within(300 + 2_000 + 3_000, "a call while NATS is down", settle(ai.tagImageByPath(red, { timeoutMs: 300 })));
  if (down.ok) throw new Error("a call succeeded while NATS was down");
  expect(down.error).toBeInstanceOf(OrtbusError);
  expect((down.error as OrtbusError).code).toBe("deadline_exceeded");
  nats = await startNats(port, `${natsDir}/natsembed.log`);
  const restartedAt = performance.now();

  // The client, the gateway and the workers reconnect; then every call succeeds.
  const r = await within(10_000 + 2_000 + 3_000, "the call made during the outage", during);
  const answeredMs = performance.now() - restartedAt;
  await until("a healthy gateway after the NATS restart", async () => (await client.health({ timeoutMs: 1_000 })).status === "ok", 30_000, 50);
  const healthyMs = performance.now() - restartedAt;
  console.log(
    `reconnect test: the call made during the outage: ${r.ok ? "ok" : (r.error as OrtbusError).code}, answered ${answeredMs.toFixed(0)} ms ` +
      `after the restart; healthy ${healthyMs.toFixed(0)} ms after it; client events: ${[...new Set(events)].join(",")}`,
  );
  if (!r.ok) throw new Error(`the call made during the outage failed: ${String(r.error)}`);
  expect(r.value.general.red).toBeGreaterThanOrEqual(0.9);
  expect(events).toContain("reconnect");
  for (let i = 0; i < 10; i++) {
    expect((await ai.tagImageByPath(red)).general.red).toBeGreaterThanOrEqual(0.9);
  }
  expect((await ai.extractCcipFeatureByPath(red)).feature.length).toBe(768);
  expect((await ai.tagImageByPath(red, { class: "batch" })).general.red).toBeGreaterThanOrEqual(0.9);
  expect((await ai.detectPersons(env.fixtures.rect))[0]?.label).toBe("person");
});
