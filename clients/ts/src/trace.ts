// Trace context: every call carries the W3C trace context of its caller in the NATS
// headers `traceparent` and `tracestate`, so that an app's trace goes on through ortbus
// (the gateway's and the workers' spans, where they export them, are children of the
// caller's span). It is the call's own `traceparent` option when given, else the active
// span of @opentelemetry/api when the app uses it (an optional peer dependency: without
// it, or without an active span, a call carries none). The client only propagates: it
// starts no span and needs no SDK.

import { headers as natsHeaders } from "@nats-io/transport-node";
import type { MsgHdrs } from "@nats-io/transport-node";

/** The trace context of one call, as its headers carry it. */
export interface TraceHeaders {
  traceparent: string;
  tracestate?: string;
}

/** What of @opentelemetry/api this file uses (typed here: the package is optional). */
interface OtelApi {
  context: { active(): unknown };
  trace: { getSpanContext(ctx: unknown): OtelSpanContext | undefined };
}
interface OtelSpanContext {
  traceId: string;
  spanId: string;
  traceFlags: number;
  traceState?: { serialize(): string };
}

// The gateway's bounds (docs/PROTOCOL.md, Trace context): a value past them, or one that
// is not printable ASCII (which a NATS header cannot carry), is not sent.
const MAX_TRACEPARENT = 256;
const MAX_TRACESTATE = 512;

// @opentelemetry/api, once: null when the app does not have it. A variable specifier,
// so that neither tsc nor a bundler requires the optional package.
const OTEL_API = "@opentelemetry/api";
let otel: OtelApi | null = null;
try {
  otel = (await import(OTEL_API)) as OtelApi;
} catch {
  otel = null;
}

/** Whether @opentelemetry/api was found (the active span is then propagated). */
export function otelFound(): boolean {
  return otel !== null;
}

const printable = /^[\x20-\x7e]*$/;

function fits(v: string | undefined, max: number): v is string {
  return v !== undefined && v !== "" && v.length <= max && printable.test(v);
}

/**
 * The trace context of a call made now with opts: its explicit traceparent (and
 * tracestate), else the active span's; undefined when there is none.
 */
export function traceOf(opts: { traceparent?: string; tracestate?: string }): TraceHeaders | undefined {
  if (opts.traceparent !== undefined) {
    if (!fits(opts.traceparent, MAX_TRACEPARENT)) return undefined;
    return fits(opts.tracestate, MAX_TRACESTATE) ? { traceparent: opts.traceparent, tracestate: opts.tracestate } : { traceparent: opts.traceparent };
  }
  if (otel === null) return undefined;
  const sc = otel.trace.getSpanContext(otel.context.active());
  if (!sc || !/^[0-9a-f]{32}$/.test(sc.traceId) || !/^[0-9a-f]{16}$/.test(sc.spanId) || /^0+$/.test(sc.traceId) || /^0+$/.test(sc.spanId)) {
    return undefined;
  }
  const flags = (sc.traceFlags & 0x03).toString(16).padStart(2, "0");
  const t: TraceHeaders = { traceparent: `00-${sc.traceId}-${sc.spanId}-${flags}` };
  const state = sc.traceState?.serialize();
  if (fits(state, MAX_TRACESTATE)) t.tracestate = state;
  return t;
}

/** h (made when undefined and t is set) with t's headers set; h as it was without t. */
export function withTrace(h: MsgHdrs | undefined, t: TraceHeaders | undefined): MsgHdrs | undefined {
  if (t === undefined) return h;
  const out = h ?? natsHeaders();
  out.set("traceparent", t.traceparent);
  if (t.tracestate !== undefined) out.set("tracestate", t.tracestate);
  return out;
}
