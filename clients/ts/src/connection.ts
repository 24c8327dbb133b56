// The connection of an OrtbusClient: NATS, its state (a request is not published while the
// connection is down: it waits for the reconnect, within its own timeout), and one
// request/reply on ortbus.v1.<op> (send), with gateway failover for inference (failover.ts).

import { randomUUID } from "node:crypto";

import { connect as natsConnect } from "@nats-io/transport-node";
import type { Msg, NatsConnection } from "@nats-io/transport-node";

import { errText, isOrtbusError, OrtbusError } from "./errors.ts";
import { DEFAULT_MISS_COUNT, exchange, GATEWAY_BEATS, GatewayBeats, WORK_OPS } from "./failover.ts";
import type { Link } from "./failover.ts";
import type { OrtbusClass } from "./messages.ts";
import type { CallOptions, ConnectOptions } from "./options.ts";
import { GRACE_MS, isNoResponders, RETRY_MS, SETTLE_MS, TimeoutLocal, transportError } from "./transport.ts";
import { traceOf, withTrace } from "./trace.ts";
import { API_PREFIX, decodeReply, encodeMsg } from "./wire.ts";
import type { Op, WireRequest } from "./wire.ts";

/** Connects to NATS, reconnecting forever after a loss (OrtbusClient.connect). */
export async function dial(opts: ConnectOptions): Promise<NatsConnection> {
  try {
    return await natsConnect({
      servers: opts.servers,
      name: opts.name ?? "ortbus ts client",
      maxReconnectAttempts: -1,
      reconnectTimeWait: opts.reconnectTimeWaitMs ?? 250,
      reconnectJitter: 50,
      waitOnFirstConnect: false,
      ...(opts.inboxPrefix !== undefined ? { inboxPrefix: opts.inboxPrefix } : {}),
      ...(opts.user !== undefined ? { user: opts.user } : {}),
      ...(opts.pass !== undefined ? { pass: opts.pass } : {}),
      ...(opts.tls !== undefined ? { tls: opts.tls } : {}),
    });
  } catch (e) {
    throw new OrtbusError("no_worker", `cannot connect to NATS at ${String(opts.servers)}: ${errText(e)}`, {
      details: { servers: opts.servers },
      cause: e,
    });
  }
}

/** The defaults a Connection reads at each call: its OrtbusClient's public fields. */
export interface Defaults {
  readonly class?: OrtbusClass | undefined;
  readonly pool?: string | undefined;
  readonly timeoutMs: number;
  readonly failover: boolean;
  readonly missCount: number;
}

/** The connection of one OrtbusClient: what its calls are sent on. */
export class Connection implements Link {
  readonly nc: NatsConnection;
  /** The client's defaults, read at each call (the app may change them). */
  private readonly defaults: Defaults;
  private beats: GatewayBeats | undefined;

  // Connection state, from the connection's status events: a request is not published
  // while the connection is down (nats.js would lose it, or its reply, around the
  // reconnect); it waits for the reconnect, within its own timeout.
  private connected = true;
  private reconnected: Promise<void> = Promise.resolve();
  private onReconnected: () => void = () => {};
  private lastReconnect = 0;
  // Called at every disconnect: the requests waiting (each removes its own listener). A
  // request published before a disconnect may have been lost with the server (at most
  // once), so it is sent again after the reconnect.
  readonly disconnects = new Set<() => void>();

  constructor(nc: NatsConnection, defaults: Defaults) {
    this.nc = nc;
    this.defaults = defaults;
    void this.watch();
  }

  private async watch(): Promise<void> {
    try {
      for await (const s of this.nc.status()) {
        if (s.type === "disconnect" && this.connected) {
          this.connected = false;
          this.reconnected = new Promise((res) => (this.onReconnected = res));
          for (const f of [...this.disconnects]) f();
        } else if (s.type === "reconnect") {
          this.connected = true;
          this.lastReconnect = performance.now();
          this.onReconnected();
        }
      }
    } catch {
      // the status iterator ends with the connection
    } finally {
      this.connected = true; // closed: requests fail at once with the connection's error
      this.onReconnected();
    }
  }

  /** Waits (at most ms) until the connection is up. */
  async whenConnected(ms: number): Promise<void> {
    if (this.connected || ms <= 0) return;
    let timer: ReturnType<typeof setTimeout> | undefined;
    await Promise.race([this.reconnected, new Promise<void>((res) => (timer = setTimeout(res, ms)))]);
    if (timer) clearTimeout(timer);
  }

  /** The gateways heard beating now (sorted ids), following their beats from now on. */
  gateways(): string[] {
    return this.followBeats().alive();
  }

  /** The beats followed (started on first use). */
  followBeats(): GatewayBeats {
    if (this.beats === undefined) {
      try {
        this.beats = new GatewayBeats(this.nc, this.defaults.missCount > 0 ? this.defaults.missCount : DEFAULT_MISS_COUNT);
      } catch (e) {
        throw new OrtbusError("no_worker", `cannot follow the gateways' beats (${GATEWAY_BEATS}): ${errText(e)}`, { cause: e });
      }
    }
    return this.beats;
  }

  /** Stops following the beats, then drains the connection (bounded: 5 s) and closes it. */
  async close(): Promise<void> {
    this.beats?.close();
    this.beats = undefined;
    if (this.nc.isClosed()) return;
    let timer: ReturnType<typeof setTimeout> | undefined;
    try {
      await Promise.race([
        this.nc.drain(),
        new Promise<void>((_, rej) => {
          timer = setTimeout(() => rej(new Error("drain timed out")), 5_000);
        }),
      ]);
    } catch {
      await this.nc.close().catch(() => {});
    } finally {
      if (timer) clearTimeout(timer);
    }
  }

  /** Sends an inference request of op, filling id, class, pool, model and timeout. */
  request<T>(op: Op, req: WireRequest, opts: CallOptions): Promise<T> {
    const id = opts.id ?? randomUUID();
    const full: WireRequest = { ...req, id };
    const cls = opts.class ?? this.defaults.class;
    if (cls !== undefined) full.class = cls;
    const pool = opts.pool ?? this.defaults.pool;
    if (pool !== undefined) full.pool = pool;
    if (opts.model !== undefined) full.model = opts.model;
    if (opts.cache !== undefined) full.cache = opts.cache;
    full.timeout_ms = Math.max(1, Math.ceil(opts.timeoutMs ?? this.defaults.timeoutMs));
    return this.send<T>(op, full, id, { ...opts, timeoutMs: full.timeout_ms });
  }

  /**
   * One request/reply on ortbus.v1.<op>. The wait is bounded by timeoutMs + grace; on an
   * abort or a local timeout the request is cancelled on the gateway (fire and forget).
   */
  send<T>(op: Op, body: object, id: string | undefined, opts: Pick<CallOptions, "timeoutMs" | "signal" | "traceparent" | "tracestate">): Promise<T> {
    const subject = `${API_PREFIX}.${op}`;
    // Taken now, in the caller's context (trace.ts).
    const trace = traceOf(opts);
    const timeoutMs = Math.max(1, opts.timeoutMs ?? this.defaults.timeoutMs);
    const signal = opts.signal;
    const withId = (o: { details?: Record<string, unknown>; status?: number; cause?: unknown }) =>
      id === undefined ? o : { ...o, requestId: id };
    if (signal?.aborted) {
      return Promise.reject(new OrtbusError("cancelled", `${op} aborted before it was sent`, withId({ cause: signal.reason })));
    }
    let data: Uint8Array;
    try {
      data = encodeMsg(body);
    } catch (e) {
      return Promise.reject(new OrtbusError("bad_request", `encode ${op} request: ${errText(e)}`, withId({ cause: e })));
    }
    const failover = this.defaults.failover && WORK_OPS.has(op);
    return new Promise<T>((resolve, reject) => {
      let settled = false;
      // Ends a failover exchange still waiting (an abort).
      let stopExchange: (() => void) | undefined;
      const finish = (fn: () => void) => {
        if (settled) return;
        settled = true;
        signal?.removeEventListener("abort", onAbort);
        stopExchange?.();
        fn();
      };
      const onAbort = () => {
        finish(() => {
          if (id !== undefined && op !== "cancel") this.publishCancel(id);
          reject(new OrtbusError("cancelled", `${op} ${id ?? ""} aborted by the caller`.trim(), withId({ cause: signal?.reason })));
        });
      };
      signal?.addEventListener("abort", onAbort, { once: true });
      const deadline = performance.now() + timeoutMs + GRACE_MS;
      const resendable = op !== "cancel";
      const settling = () => this.lastReconnect > 0 && performance.now() - this.lastReconnect < SETTLE_MS;
      const attempt = async (): Promise<T> => {
        for (;;) {
          await this.whenConnected(deadline - performance.now());
          const left = Math.ceil(deadline - performance.now());
          if (left <= 0) throw new TimeoutLocal();
          let msg: Msg;
          try {
            if (failover) {
              // Sent again, within the exchange, when a gateway dies or the connection drops.
              msg = await exchange(this, subject, data, deadline, (stop) => (stopExchange = stop), trace);
            } else if (!resendable) {
              msg = await this.nc.request(subject, data, { timeout: left });
            } else {
              // Told of the next disconnect through a listener the request removes once
              // settled: a reaction left on a shared promise would keep every reply alive
              // until the next disconnect.
              let onLost: () => void = () => {};
              const lost = new Promise<null>((res) => (onLost = () => res(null)));
              this.disconnects.add(onLost);
              const headers = withTrace(undefined, trace);
              const req = this.nc.request(subject, data, headers ? { timeout: left, headers } : { timeout: left });
              let got: Msg | null;
              try {
                got = await Promise.race([req, lost]);
              } finally {
                this.disconnects.delete(onLost);
              }
              if (got === null) {
                // The connection went down with the request out: it (or its reply) may be
                // gone with the server. Inference is idempotent: send it again once
                // reconnected.
                req.catch(() => {});
                if (settled) throw new TimeoutLocal();
                continue;
              }
              msg = got;
            }
          } catch (e) {
            // Nobody subscribed just after a reconnect: the gateway is still resubscribing.
            if (!settled && settling() && isNoResponders(e) && deadline - performance.now() > RETRY_MS) {
              await new Promise((r) => setTimeout(r, RETRY_MS));
              continue;
            }
            throw e;
          }
          try {
            return decodeReply<T>(op, msg, id);
          } catch (e) {
            // Just after a reconnect the gateway may be back before the workers are: its
            // no_worker then means "not yet"; the request never ran, so it is sent again.
            if (!settled && resendable && settling() && isOrtbusError(e, "no_worker") && deadline - performance.now() > RETRY_MS) {
              await new Promise((r) => setTimeout(r, RETRY_MS));
              continue;
            }
            throw e;
          }
        }
      };
      attempt().then(
        (v) => finish(() => resolve(v)),
        (e) =>
          finish(() => {
            const err = transportError(op, e, timeoutMs, withId);
            if (err.code === "deadline_exceeded" && id !== undefined && op !== "cancel") this.publishCancel(id);
            reject(err);
          }),
      );
    });
  }

  private publishCancel(id: string): void {
    try {
      // Sent as a request on this connection (its answer is not awaited): the gateway
      // honours a cancel only when its reply subject is under the inbox of the connection
      // that sent the request.
      if (!this.nc.isClosed()) {
        this.nc.request(`${API_PREFIX}.cancel`, encodeMsg({ id }), { timeout: 5000 }).catch(() => {});
      }
    } catch {
      // The connection is gone: nothing runs for a client that cannot reach the bus.
    }
  }
}
