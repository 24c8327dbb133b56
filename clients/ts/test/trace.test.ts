// Trace context through the TypeScript client: every call carries the caller's W3C trace
// context in its NATS headers — the call's `traceparent` option, else the active span of
// @opentelemetry/api — or none; with failover too. A real NATS server (natsembed), and a
// responder in this test in the gateway's place that records the headers it gets.

import { afterAll, beforeAll, expect, setDefaultTimeout, test } from "bun:test";
import { AsyncLocalStorage } from "node:async_hooks";

import { connect } from "@nats-io/transport-node";
import type { MsgHdrs, NatsConnection } from "@nats-io/transport-node";
import { context, ROOT_CONTEXT, trace, TraceFlags } from "@opentelemetry/api";
import type { Context, ContextManager } from "@opentelemetry/api";

import { OrtbusClient, encodeMsg } from "../index.ts";
import { otelFound } from "../src/trace.ts";
import { cleanupTmp, freePort, startNats, tempDir } from "./harness.ts";
import type { Proc } from "./harness.ts";

setDefaultTimeout(60_000);

/** A context manager on AsyncLocalStorage (what an app's OpenTelemetry SDK registers). */
class StorageContextManager implements ContextManager {
  private readonly store = new AsyncLocalStorage<Context>();
  active(): Context {
    return this.store.getStore() ?? ROOT_CONTEXT;
  }
  with<A extends unknown[], F extends (...args: A) => ReturnType<F>>(ctx: Context, fn: F, thisArg?: ThisParameterType<F>, ...args: A): ReturnType<F> {
    return this.store.run(ctx, () => fn.call(thisArg, ...args));
  }
  bind<T>(_ctx: Context, target: T): T {
    return target;
  }
  enable(): this {
    return this;
  }
  disable(): this {
    return this;
  }
}

let nats: Proc;
let dir: string;
let url: string;
let responder: NatsConnection;
const seen: (MsgHdrs | undefined)[] = [];

beforeAll(async () => {
  context.setGlobalContextManager(new StorageContextManager());
  const port = await freePort();
  dir = tempDir("ortbus-ts-trace-");
  nats = await startNats(port, `${dir}/natsembed.log`);
  url = `nats://127.0.0.1:${port}`;
  responder = await connect({ servers: url });
  // In the gateway's place: answers every tag with an empty result, noting its headers.
  responder.subscribe("ortbus.v1.tag", {
    callback: (_err, m) => {
      seen.push(m.headers);
      m.respond(encodeMsg({ id: "x", general: {}, character: {}, rating: {}, ips: [] }));
    },
  });
  await responder.flush();
}, 60_000);

afterAll(async () => {
  context.disable();
  await responder?.close();
  await nats?.stop();
  if (dir) cleanupTmp(dir);
}, 30_000);

const TRACE = "4bf92f3577b34da6a3ce929d0e0e4736";
const SPAN = "00f067aa0ba902b7";

/** The headers of one tag sent by a client (failover or not) in fn's context. */
async function headersOf(failover: boolean, call: (c: OrtbusClient) => Promise<unknown>): Promise<MsgHdrs | undefined> {
  const c = await OrtbusClient.connect({ servers: url, failover });
  try {
    const before = seen.length;
    await call(c);
    expect(seen.length).toBe(before + 1);
    return seen[before];
  } finally {
    await c.close();
  }
}

for (const failover of [false, true]) {
  test(`a call carries the active span, an explicit traceparent, or nothing (failover ${failover})`, async () => {
    expect(otelFound()).toBe(true);
    const span = trace.wrapSpanContext({ traceId: TRACE, spanId: SPAN, traceFlags: TraceFlags.SAMPLED });
    const active = await headersOf(failover, (c) => context.with(trace.setSpan(context.active(), span), () => c.tag("/srv/a.png")));
    expect(active?.get("traceparent")).toBe(`00-${TRACE}-${SPAN}-01`);

    const explicit = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00";
    const given = await headersOf(failover, (c) =>
      context.with(trace.setSpan(context.active(), span), () => c.tag("/srv/a.png", { traceparent: explicit, tracestate: "k=v" })),
    );
    expect(given?.get("traceparent")).toBe(explicit);
    expect(given?.get("tracestate")).toBe("k=v");

    const none = await headersOf(failover, (c) => c.tag("/srv/a.png"));
    expect(none?.get("traceparent") ?? "").toBe("");

    // What a NATS header cannot carry, or past the gateway's bound, is not sent.
    const long = await headersOf(failover, (c) => c.tag("/srv/a.png", { traceparent: `00-${TRACE}-${SPAN}-01-${"f".repeat(4096)}` }));
    expect(long?.get("traceparent") ?? "").toBe("");
  });
}
