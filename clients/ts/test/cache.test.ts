// The result cache through the TypeScript client, against a real gateway with JetStream
// (store_dir) and `[cache] enabled`: a second tag of the same bytes is answered from the
// cache (timing.cached), `cache: false` bypasses it, and an incremental job over images
// already tagged answers them from it (status cached).

import { afterAll, beforeAll, expect, setDefaultTimeout, test } from "bun:test";
import { join } from "node:path";

import { OrtbusClient } from "../index.ts";
import { setup, teardown, until } from "./harness.ts";
import type { Env } from "./harness.ts";

setDefaultTimeout(60_000);

let env: Env;
let client: OrtbusClient;

beforeAll(async () => {
  env = await setup("cache", {
    edit: (c, tmp) => {
      c.storeDir = join(tmp, "jetstream");
      c.cache = true;
    },
  });
  client = await OrtbusClient.connect({ servers: env.url });
}, 90_000);

afterAll(async () => {
  await client?.close();
  await teardown(env);
}, 30_000);

test("a second tag of the same bytes comes from the cache; cache: false bypasses it", async () => {
  const red = env.fixtures.colour.red!;
  const first = await client.tag(red);
  expect(first.timing.cached ?? false).toBe(false);
  // The answer is stored after it is delivered: a later call finds it.
  const hit = await until("a cached tag", async () => {
    const r = await client.tag(red);
    return r.timing.cached ? r : undefined;
  });
  expect(hit.general).toEqual(first.general);
  expect(hit.timing.infer_us).toBe(0);
  const bypass = await client.tag(red, { cache: false });
  expect(bypass.timing.cached ?? false).toBe(false);
  expect(bypass.general).toEqual(first.general);
});

test("an incremental job answers the images already tagged from the cache", async () => {
  const red = env.fixtures.colour.red!;
  await until("red cached", async () => (await client.tag(red)).timing.cached === true);
  const sub = await client.submitJob({ op: "tag", items: [red], incremental: true });
  const st = await until("the incremental job done", async () => {
    const s = await client.jobStatus(sub.job);
    return s.state === "done" ? s : undefined;
  });
  expect(st.cached).toBe(1);
  expect(st.computed).toBe(0);
});
