// Leases (codec/lease.go): memory of a device held for a process ortbus does not run (an
// LLM server, a game), counted in the device's memory admission until released or
// expired. OrtbusClient's acquireLease, renewLease and releaseLease call these; and
// pauses of a class on demand (gateway/pause.go): pauseClass, resumeClass.

import type { Lease, OrtbusClass, Pause } from "./messages.ts";
import type { CallOptions } from "./options.ts";
import type { Sender } from "./requests.ts";

/** How a lease is acquired (codec.LeaseRequest): its class, ttl and holder's name; `gate`
 * and `reclaim` as `ortbus lease --gate` and `--on-pressure` ask for them, and the holder's
 * `pid` and `host`, whose measured use a pressed lease is shrunk to. `waitMs` (1 to
 * MAX_LEASE_WAIT_MS): when the budget cannot hold the lease now, the gateway keeps the
 * acquire waiting that long and grants it on the event that makes room (a release, a
 * reclaimable lease shrunk, ...; gateway/leasewait.go); one request, never asked again.
 * A wait that runs out rejects "overloaded" with `details.waited_ms`. */
export type LeaseOptions = {
  class?: OrtbusClass;
  ttlMs?: number;
  holder?: string;
  gate?: boolean;
  reclaim?: boolean;
  pid?: number;
  host?: string;
  waitMs?: number;
};

/** The longest wait of an acquire (codec.MaxLeaseWaitMS): five minutes. */
export const MAX_LEASE_WAIT_MS = 300_000;

/** The time a waiting acquire leaves its answer to arrive after the wait it asks for. */
const LEASE_WAIT_MARGIN_MS = 5_000;

export function acquireLease(
  c: Sender,
  device: string,
  bytes: number,
  o: LeaseOptions & Pick<CallOptions, "timeoutMs" | "signal">,
): Promise<Lease> {
  const req: Record<string, unknown> = { action: "acquire", device, bytes };
  if (o.class !== undefined) req.class = o.class;
  if (o.ttlMs !== undefined) req.ttl_ms = o.ttlMs;
  if (o.holder !== undefined) req.holder = o.holder;
  if (o.gate) req.gate = true;
  if (o.reclaim) req.reclaim = true;
  if (o.pid !== undefined) req.pid = o.pid;
  if (o.host !== undefined) req.host = o.host;
  let opts = o;
  if (o.waitMs !== undefined && o.waitMs > 0) {
    req.wait_ms = Math.min(Math.ceil(o.waitMs), MAX_LEASE_WAIT_MS);
    // The call outlives the wait (unless the caller bounds it: then the wait is cut to fit).
    if (o.timeoutMs === undefined) opts = { ...o, timeoutMs: (req.wait_ms as number) + LEASE_WAIT_MARGIN_MS };
    else req.wait_ms = Math.max(0, Math.min(req.wait_ms as number, o.timeoutMs - LEASE_WAIT_MARGIN_MS));
    if (req.wait_ms === 0) delete req.wait_ms;
  }
  return c.send<Lease>("lease", req, undefined, opts);
}

export function renewLease(c: Sender, lease: string, o: { ttlMs?: number } & Pick<CallOptions, "timeoutMs" | "signal">): Promise<Lease> {
  const req: Record<string, unknown> = { action: "renew", lease };
  if (o.ttlMs !== undefined) req.ttl_ms = o.ttlMs;
  return c.send<Lease>("lease", req, undefined, o);
}

export function releaseLease(c: Sender, lease: string, opts: Pick<CallOptions, "timeoutMs" | "signal">): Promise<Lease> {
  return c.send<Lease>("lease", { action: "release", lease }, undefined, opts);
}

export function pauseClass(
  c: Sender,
  cls: OrtbusClass,
  forMs: number,
  o: { device?: string } & Pick<CallOptions, "timeoutMs" | "signal">,
): Promise<Pause> {
  const req: Record<string, unknown> = { action: "pause", class: cls, for_ms: forMs };
  if (o.device !== undefined) req.device = o.device;
  return c.send<Pause>("pause", req, undefined, o);
}

export function resumeClass(c: Sender, cls: OrtbusClass, o: { device?: string } & Pick<CallOptions, "timeoutMs" | "signal">): Promise<Pause> {
  const req: Record<string, unknown> = { action: "resume", class: cls };
  if (o.device !== undefined) req.device = o.device;
  return c.send<Pause>("pause", req, undefined, o);
}
