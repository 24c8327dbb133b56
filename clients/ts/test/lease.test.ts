// Memory leases through the TypeScript client against a real gateway whose cpu device has
// a declared capacity (1 GiB × 0.5): a lease over the budget is refused with the figures,
// a smaller one is granted, shows in status without its id, is renewed, and released; one
// with waitMs waits in the gateway and is granted when room is made.

import { afterAll, beforeAll, expect, setDefaultTimeout, test } from "bun:test";

import { MAX_LEASE_WAIT_MS, OrtbusClient, OrtbusError } from "../index.ts";
import { settle, setup, teardown, until } from "./harness.ts";
import type { Env } from "./harness.ts";

setDefaultTimeout(30_000);

let env: Env;
let client: OrtbusClient;

beforeAll(async () => {
  env = await setup("lease", {
    edit: (c) => {
      c.devices = { cpu: { capacity: "1GiB", safeFraction: 0.5 } };
    },
  });
  client = await OrtbusClient.connect({ servers: env.url });
}, 90_000);

afterAll(async () => {
  await client?.close();
  await teardown(env);
}, 30_000);

const MiB = 1 << 20;

test("a lease over the budget is refused overloaded, naming device, sum and budget", async () => {
  const r = await settle(client.acquireLease("cpu", 600 * MiB, { class: "interactive", ttlMs: 5_000, holder: "llm" }));
  expect(r.ok).toBe(false);
  const e = (r as { error: unknown }).error as OrtbusError;
  expect(e).toBeInstanceOf(OrtbusError);
  expect(e.code).toBe("overloaded");
  expect(e.details?.device).toBe("cpu");
  expect(e.details?.budget_bytes).toBe(512 * MiB);
  expect(Number(e.details?.sum_bytes)).toBeGreaterThan(512 * MiB);
});

test("a lease is granted, shown in status without its id, renewed and released", async () => {
  const l = await client.acquireLease("cpu", 64 * MiB, { class: "interactive", ttlMs: 5_000, holder: "llm" });
  expect(l.lease).toBeTruthy();
  expect(l.bytes).toBe(64 * MiB);
  const cpu = (await client.status()).devices.find((d) => d.device === "cpu")!;
  expect(cpu.leased_bytes).toBe(64 * MiB);
  expect(cpu.leases?.length).toBe(1);
  expect(cpu.leases?.[0]?.holder).toBe("llm");
  expect(cpu.leases?.[0]?.lease).toBeUndefined();
  const renewed = await client.renewLease(l.lease!, { ttlMs: 10_000 });
  expect(renewed.expires_unix_ms).toBeGreaterThan(l.expires_unix_ms);
  const released = await client.releaseLease(l.lease!);
  expect(released.released).toBe(true);
  const after = (await client.status()).devices.find((d) => d.device === "cpu")!;
  expect(after.leased_bytes ?? 0).toBe(0);
  const again = await settle(client.renewLease(l.lease!));
  expect(again.ok).toBe(false);
  expect(((again as { error: unknown }).error as OrtbusError).code).toBe("bad_request");
});

test("a gated, reclaimable lease says so and names its gateway, whose gate of the device status lists", async () => {
  const l = await client.acquireLease("cpu", 16 * MiB, { class: "interactive", ttlMs: 5_000, holder: "llm", gate: true, reclaim: true, pid: process.pid });
  try {
    expect(l.gate).toBe(true);
    expect(l.reclaim).toBe(true);
    expect(l.gateway).toBeTruthy();
    // The gateway decides its gates on a tick: the device's appears within one.
    const g = await until("the cpu gate in status", async () => (await client.status()).gates?.find((x) => x.device === "cpu"));
    expect(g.class).toBe("urgent");
    expect(g.tenants).toBe(1);
  } finally {
    await client.releaseLease(l.lease!);
  }
});

// A batch lease of all the cpu's free budget but 100 MiB (its workers hold the rest).
async function hogAllBut100MiB() {
  const free = (await client.status()).devices.find((d) => d.device === "cpu")!.free_bytes;
  expect(free).toBeGreaterThan(200 * MiB);
  return client.acquireLease("cpu", free - 100 * MiB, { class: "batch", ttlMs: 30_000, holder: "hog" });
}

test("an acquire with waitMs waits in the gateway and is granted when room is made", async () => {
  const hog = await hogAllBut100MiB();
  let settled = false;
  const waiting = client.acquireLease("cpu", 200 * MiB, { class: "urgent", ttlMs: 30_000, holder: "waiter", waitMs: 60_000 });
  waiting.then(
    () => (settled = true),
    () => (settled = true),
  );
  try {
    // Not granted while the hog holds the room (its status lists the hog alone).
    const cpu = (await client.status()).devices.find((d) => d.device === "cpu")!;
    expect(cpu.leases?.map((l) => l.holder)).toEqual(["hog"]);
    expect(settled).toBe(false);
  } finally {
    await client.releaseLease(hog.lease!);
  }
  const l = await waiting;
  expect(l.holder).toBe("waiter");
  expect(l.bytes).toBe(200 * MiB);
  await client.releaseLease(l.lease!);
});

test("a wait that runs out rejects overloaded with waited_ms", async () => {
  const hog = await hogAllBut100MiB();
  try {
    const r = await settle(client.acquireLease("cpu", 200 * MiB, { class: "urgent", waitMs: 50 }));
    expect(r.ok).toBe(false);
    const e = (r as { error: unknown }).error as OrtbusError;
    expect(e.code).toBe("overloaded");
    expect(Number(e.details?.waited_ms)).toBeGreaterThanOrEqual(50);
    expect(MAX_LEASE_WAIT_MS).toBe(300_000);
  } finally {
    await client.releaseLease(hog.lease!);
  }
});
