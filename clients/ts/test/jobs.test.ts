// Jobs through the TypeScript client against a real gateway whose embedded NATS server
// runs JetStream (store_dir): submit, watch to the end, read every result typed by the
// job's op, re-submit (nothing added), a clashing spec or items (conflict), unknown jobs
// (unknown_job), cancel, and a watch that goes on through a restart of the gateway (with
// its NATS server and store) on the same port.

import { afterAll, beforeAll, expect, setDefaultTimeout, test } from "bun:test";
import { join } from "node:path";

import { OrtbusClient, OrtbusError, jobFinished } from "../index.ts";
import type { JobResult, JobStatus, OrtbusErrorCode } from "../index.ts";
import { freePort, settle, setup, startGateway, teardown, until, within } from "./harness.ts";
import type { Env } from "./harness.ts";

setDefaultTimeout(60_000);

let env: Env;
let client: OrtbusClient;
let natsListen: string;
/** The fixture images, and the colour each uniform one is (the tagger names it). */
let items: string[];
let colourOf: Map<string, string>;

beforeAll(async () => {
  natsListen = `127.0.0.1:${await freePort()}`;
  env = await setup("jobs", {
    natsListen,
    edit: (c, tmp) => {
      c.storeDir = join(tmp, "jetstream");
      // The items a stopped gateway held come back within 3 s of the restart (default 30 s:
      // here they have been seen to wait for ack_wait even after a graceful stop).
      c.jobsAckWait = "3s";
      // slowjob: the slow tagger (~100 ms an item) on the slow pool, with room for a job's
      // items in its queue: jobs that last long enough to be cancelled or outlive a restart.
      c.classes.push({ name: "slowjob", priority: 2, chain: ["slow"], queueBound: 1000, timeout: "30s", maxTimeout: "60s", models: { tag: "tagger_slow" } });
      c.pools.find((p) => p.name === "slow")!.classes.push("slowjob");
    },
  });
  client = await OrtbusClient.connect({ servers: env.url, reconnectTimeWaitMs: 100 });
  items = [...Object.values(env.fixtures.colour), env.fixtures.split, env.fixtures.rect];
  colourOf = new Map(Object.entries(env.fixtures.colour).map(([name, p]) => [p, name]));
  // The gateway opens its job store in the background: unavailable until then.
  await until("the job store open", () => client.listJobs({ timeoutMs: 2_000 }), 30_000, 100);
}, 90_000);

afterAll(async () => {
  await client?.close();
  await teardown(env);
}, 30_000);

async function expectCode(p: Promise<unknown>, code: OrtbusErrorCode): Promise<OrtbusError> {
  const r = await settle(p);
  if (r.ok) throw new Error(`resolved, want ${code}: ${JSON.stringify(r.value)}`);
  expect(r.error).toBeInstanceOf(OrtbusError);
  const e = r.error as OrtbusError;
  if (e.code !== code) throw new Error(`code ${e.code} (${e.message}), want ${code}`);
  return e;
}

/** Iterates watchJob to its end; returns every status it yielded. */
async function watchAll(job: string, intervalMs = 50): Promise<JobStatus[]> {
  const seen: JobStatus[] = [];
  for await (const st of client.watchJob(job, { intervalMs })) seen.push(st);
  return seen;
}

/** Checks a watch: non-decreasing done, only its last status finished, and returns that one. */
function checkWatch(seen: JobStatus[]): JobStatus {
  expect(seen.length).toBeGreaterThan(0);
  for (let k = 1; k < seen.length; k++) {
    if (seen[k]!.done < seen[k - 1]!.done) throw new Error(`done went from ${seen[k - 1]!.done} to ${seen[k]!.done} (status ${k})`);
  }
  seen.slice(0, -1).forEach((st) => expect(jobFinished(st)).toBe(false));
  const last = seen[seen.length - 1]!;
  expect(jobFinished(last)).toBe(true);
  return last;
}

/** Every result of the job, checked: one per item, the item's path, a typed tag reply. */
async function checkTagResults(job: string, paths: string[], opts: { limit?: number } = {}): Promise<JobResult[]> {
  const all: JobResult[] = [];
  for await (const r of client.eachJobResult(job, opts)) all.push(r);
  const seen = new Array<number>(paths.length).fill(0);
  for (const r of all) {
    expect(r.i).toBeGreaterThanOrEqual(0);
    expect(r.i).toBeLessThan(paths.length);
    seen[r.i]!++;
    expect(r.path).toBe(paths[r.i]!);
    expect(r.error).toBeUndefined();
    if (r.op !== "tag" || !r.result) throw new Error(`item ${r.i}: op ${r.op}, result ${JSON.stringify(r.result)}; want a tag reply`);
    expect(typeof r.result.general).toBe("object");
    expect(Array.isArray(r.result.ips)).toBe(true);
    expect(typeof r.result.timing.total_us).toBe("number");
    const colour = colourOf.get(r.path);
    if (colour) expect(r.result.general[colour]).toBeGreaterThanOrEqual(0.9);
  }
  seen.forEach((n, i) => {
    if (n !== 1) throw new Error(`item ${i} (${paths[i]}): ${n} results, want exactly 1`);
  });
  return all;
}

test("a job of the fixture images: watched to done, one typed result per item, paged", async () => {
  const sub = await client.submitJob({ job: "ts-fixtures", op: "tag", items });
  expect(sub).toEqual({ job: "ts-fixtures", total: items.length });

  const t0 = performance.now();
  const seen = await within(60_000, "watchJob of ts-fixtures", watchAll("ts-fixtures"));
  const last = checkWatch(seen);
  console.log(`jobs: ${items.length} items done in ${(performance.now() - t0).toFixed(0)} ms, ${seen.length} statuses watched`);
  expect(last.state).toBe("done");
  expect(last.job).toBe("ts-fixtures");
  expect(last.op).toBe("tag");
  expect(last.class).toBe("batch");
  expect(last.total).toBe(items.length);
  expect(last.done).toBe(items.length);
  expect(last.failed).toBe(0);
  expect(last.finished_unix_ms).toBeGreaterThanOrEqual(last.started_unix_ms);

  // All of them through the iterator, 3 a page; then the pages by hand.
  const all = await checkTagResults("ts-fixtures", items, { limit: 3 });
  expect(all.every((r) => r.op === "tag" && r.result?.pool === "bulk")).toBe(true);
  const first = await client.jobResults("ts-fixtures", { limit: 3 });
  expect(first.job).toBe("ts-fixtures");
  expect(first.op).toBe("tag");
  expect(first.results.length).toBe(3);
  expect(first.more).toBe(true);
  expect(first.results.map((r) => r.seq)).toEqual(all.slice(0, 3).map((r) => r.seq));
  const rest = await client.jobResults("ts-fixtures", { from: first.next });
  expect(rest.more).toBe(false);
  expect(rest.results.map((r) => r.i)).toEqual(all.slice(3).map((r) => r.i));

  const list = await client.listJobs();
  expect(list.jobs.map((j) => j.job)).toContain("ts-fixtures");
  expect(list.jobs.find((j) => j.job === "ts-fixtures")?.state).toBe("done");
});

test("the same submit again adds nothing; another spec or items under the same id is conflict", async () => {
  const again = await client.submitJob({ job: "ts-fixtures", op: "tag", items });
  expect(again).toEqual({ job: "ts-fixtures", total: items.length });
  const st = await client.jobStatus("ts-fixtures");
  expect(st.state).toBe("done");
  expect(st.done).toBe(items.length);
  expect(st.failed).toBe(0);
  await checkTagResults("ts-fixtures", items);

  const e = await expectCode(client.submitJob({ job: "ts-fixtures", op: "tag", items: items.slice(0, 3) }), "conflict");
  expect(e.status).toBe(409);
  await expectCode(client.submitJob({ job: "ts-fixtures", op: "embed", items }), "conflict");
  // The same count of other items: conflict, never this job's results.
  await expectCode(client.submitJob({ job: "ts-fixtures", op: "tag", items: [...items].reverse() }), "conflict");
  expect((await client.jobStatus("ts-fixtures")).done).toBe(items.length);
});

test("unknown jobs are unknown_job; bad submits and ids are refused, typed", async () => {
  const e = await expectCode(client.jobStatus("ts-no-such-job"), "unknown_job");
  expect(e.status).toBe(404);
  expect(e.details?.job).toBe("ts-no-such-job");
  await expectCode(client.cancelJob("ts-no-such-job"), "unknown_job");
  await expectCode(client.jobResults("ts-no-such-job"), "unknown_job");
  await expectCode(client.jobStatus("a.b"), "bad_request");
  await expectCode(client.submitJob({ op: "tag" }), "bad_request"); // neither items nor dir
  await expectCode(client.submitJob({ op: "compare" as "tag", items }), "bad_request");
  await expectCode(client.submitJob({ op: "tag", model: "nope", items }), "unknown_model");
  await expectCode(client.submitJob({ op: "tag", dir: { path: join(env.root, "nope") } }), "file_not_found");
  // A watch of an unknown job ends at once with that error (it is not transient).
  const r = await within(10_000, "watch of an unknown job", settle(watchAll("ts-no-such-job")));
  expect(r.ok).toBe(false);
  expect(((r as { error: unknown }).error as OrtbusError).code).toBe("unknown_job");
});

test("an embed job: each result's embedding is a Float32Array; a directory job with a glob", async () => {
  const paths = [env.fixtures.colour.red!, env.fixtures.colour.blue!];
  const sub = await client.submitJob({ op: "embed", items: paths });
  expect(sub.total).toBe(2);
  expect(sub.job.length).toBeGreaterThan(0); // the client's own id
  const last = checkWatch(await within(60_000, "watch of an embed job", watchAll(sub.job)));
  expect(last.done).toBe(2);
  const all: JobResult[] = [];
  for await (const r of client.eachJobResult(sub.job)) all.push(r);
  expect(all.length).toBe(2);
  for (const r of all) {
    if (r.op !== "embed" || !r.result) throw new Error(`want an embed reply, got op ${r.op}`);
    expect(r.result.embedding).toBeInstanceOf(Float32Array);
    expect(r.result.embedding.length).toBe(768);
    expect(r.result.dim).toBe(768);
    expect(r.path).toBe(paths[r.i]!);
  }

  const dir = await client.submitJob({ op: "tag", dir: { path: env.root, glob: "r*.png" } }); // red.png, rect.png
  expect(dir.total).toBe(2);
  expect(checkWatch(await within(60_000, "watch of a dir job", watchAll(dir.job))).done).toBe(2);
});

test("pauseJob and resumeJob: paused, then every item runs once", async () => {
  const many = Array.from({ length: 2 }, () => items).flat(); // 20 items at ~100 ms each
  const sub = await client.submitJob({ job: "ts-pause", op: "tag", class: "slowjob", items: many });
  const st = await client.pauseJob("ts-pause");
  expect(st.state).toBe("paused");
  expect(st.paused_unix_ms).toBeGreaterThan(0);
  expect((await client.jobStatus("ts-pause")).state).toBe("paused");
  await expectCode(client.pauseJob("ts-no-such-job"), "unknown_job");
  expect((await client.resumeJob("ts-pause")).state).toBe("running");
  const last = checkWatch(await within(60_000, "watch of a resumed job", watchAll(sub.job)));
  expect(last.done).toBe(many.length);
  const seen = new Set<number>();
  for await (const r of client.eachJobResult(sub.job)) seen.add(r.i);
  expect(seen.size).toBe(many.length);
});

test("cancelJob on a long job: state cancelled, the rest never runs", async () => {
  const many = Array.from({ length: 20 }, () => items).flat(); // 200 items at ~100 ms each
  const sub = await client.submitJob({ job: "ts-cancel", op: "tag", class: "slowjob", items: many });
  expect(sub.total).toBe(many.length);
  await until("two items of ts-cancel done", async () => (await client.jobStatus("ts-cancel")).done >= 2, 30_000, 50);
  const st = await client.cancelJob("ts-cancel");
  expect(st.state).toBe("cancelled");
  expect(st.finished_unix_ms).toBeGreaterThan(0);
  expect(st.done + st.failed).toBeLessThan(many.length);
  // A watch of a cancelled job yields that one status and ends.
  const seen = await within(10_000, "watch of a cancelled job", watchAll("ts-cancel"));
  expect(seen.length).toBe(1);
  expect(seen[0]!.state).toBe("cancelled");
  // Cancelling again answers the same; a re-submit of a cancelled job is refused.
  expect((await client.cancelJob("ts-cancel")).state).toBe("cancelled");
  await expectCode(client.submitJob({ job: "ts-cancel", op: "tag", class: "slowjob", items: many }), "cancelled");
  const later = await client.jobStatus("ts-cancel");
  expect(later.state).toBe("cancelled");
  expect(later.done + later.failed).toBeLessThan(many.length);
});

test("watchJob goes on through a restart of the gateway (and its NATS server and store)", async () => {
  const many = Array.from({ length: 4 }, () => items).flat(); // 40 items at ~100 ms each
  await client.submitJob({ job: "ts-restart", op: "tag", class: "slowjob", items: many });
  const seen: JobStatus[] = [];
  const watch = (async () => {
    for await (const st of client.watchJob("ts-restart", { intervalMs: 50 })) seen.push(st);
  })();
  watch.catch(() => {});
  await until("five items of ts-restart done", async () => (seen.at(-1)?.done ?? 0) >= 5, 30_000, 20);

  await env.gateway.stop();
  const atStop = seen.length;
  const doneAtStop = seen.at(-1)!.done;
  expect(doneAtStop).toBeLessThan(many.length);
  env.gateway = await startGateway(env.cfgPath, join(env.tmp, "gateway.log"), natsListen);
  const t0 = performance.now();
  await within(90_000, "the watch across the restart", watch);
  const last = checkWatch(seen);
  console.log(
    `jobs: restart at ${doneAtStop}/${many.length} done; watch ended ${(performance.now() - t0).toFixed(0)} ms after the restart, ` +
      `${seen.length - atStop} statuses after it; redelivered ${last.redelivered}`,
  );
  expect(seen.length).toBeGreaterThan(atStop);
  expect(last.state).toBe("done");
  expect(last.done).toBe(many.length);
  expect(last.failed).toBe(0);
  await checkTagResults("ts-restart", many);
}, 120_000);
