// Gateway failover (the Go client's client/failover.go; the gateway's side is
// gateway/failover.go): the client follows the gateways' beats on ortbus.gw.*.hb, and when
// a gateway stops beating while a call waits, it sends the call's request again, same
// body and id, with the header Ortbus-Resend. Whichever gateway takes the resend runs it,
// answers it from what the answers bucket kept, or answers the notice Ortbus-Held (empty
// body) when a live gateway still holds it: the call then goes on waiting, every request
// it sent still outstanding (the holder answers on the first one's reply subject). The
// call takes the first reply that is not a notice. A call knows its holder once a notice
// names it: from then on only that gateway's death sends it again (a peer that flaps or
// crash-loops does not spend its resends); before, any gateway's death does.

import { headers as natsHeaders } from "@nats-io/transport-node";
import type { Msg, MsgHdrs, NatsConnection, RequestOptions, Subscription } from "@nats-io/transport-node";

import { withTrace } from "./trace.ts";
import type { TraceHeaders } from "./trace.ts";
import { isNoResponders, RETRY_MS, TimeoutLocal } from "./transport.ts";
import { decodeMsg } from "./wire.ts";
import type { Op } from "./wire.ts";

/** Header of a request sent again after a gateway died. */
const HEADER_RESEND = "Ortbus-Resend";
/** Header of a gateway's notice that a live gateway (its value) holds the request. */
const HEADER_HELD = "Ortbus-Held";
/** Beat intervals of silence that make a gateway dead, by default. */
export const DEFAULT_MISS_COUNT = 3;
/** At most this many resends of one call. */
const MAX_RESENDS = 8;
/** How often silent gateways are judged. */
const JUDGE_EVERY_MS = 20;
/** The subject of every gateway's beats. */
export const GATEWAY_BEATS = "ortbus.gw.*.hb";
/** The ops that are inference work: queued, answered later, sent again after a gateway died. */
export const WORK_OPS: ReadonlySet<Op> = new Set<Op>(["tag", "embed", "compare", "detect", "segment", "infer"]);

/** A gateway's beat (codec.GatewayBeat). */
interface GatewayBeat {
  gateway?: unknown;
  seq?: unknown;
  interval_ms?: unknown;
}

/** The gateways heard beating, judged dead after missCount of their intervals of silence. */
export class GatewayBeats {
  /** Each gateway heard: its last beat, interval, whether judged dead, and how many times it was. */
  private readonly peers = new Map<string, { seen: number; interval: number; dead: boolean; deaths: number }>();
  /** Called (each once a tick, however many died in it) when a gateway is judged dead. */
  private readonly onDeath = new Set<() => void>();
  private readonly sub: Subscription;
  private readonly timer: ReturnType<typeof setInterval>;

  constructor(
    nc: NatsConnection,
    private readonly missCount: number,
  ) {
    this.sub = nc.subscribe(GATEWAY_BEATS, {
      callback: (err, m) => {
        if (err === null) this.hear(m);
      },
    });
    this.timer = setInterval(() => this.judge(), JUDGE_EVERY_MS);
    (this.timer as { unref?: () => void }).unref?.();
  }

  private hear(m: Msg): void {
    const t = m.subject.split(".");
    const id = t[2];
    if (t.length !== 4 || t[0] !== "ortbus" || t[1] !== "gw" || t[3] !== "hb" || !id) return;
    let b: GatewayBeat;
    try {
      b = decodeMsg<GatewayBeat>(m.data);
    } catch {
      return;
    }
    const iv = b?.interval_ms;
    if (b?.gateway !== id || typeof iv !== "number" || !(iv > 0) || iv > 3_600_000) return;
    let p = this.peers.get(id);
    if (p === undefined) {
      if (this.peers.size >= 256) return;
      p = { seen: 0, interval: 0, dead: false, deaths: 0 };
      this.peers.set(id, p);
    }
    p.seen = performance.now();
    p.interval = iv;
    p.dead = false;
  }

  private judge(): void {
    const now = performance.now();
    let died = false;
    for (const [id, p] of this.peers) {
      if (p.dead) {
        if (now - p.seen > 3_600_000) this.peers.delete(id);
      } else if (now - p.seen > this.missCount * p.interval) {
        p.dead = true;
        p.deaths++;
        died = true;
      }
    }
    if (died) for (const f of [...this.onDeath]) f();
  }

  /** The gateways heard beating and not judged dead, sorted. */
  alive(): string[] {
    return [...this.peers].filter(([, p]) => !p.dead).map(([id]) => id).sort();
  }

  /**
   * Whether gateway id is judged dead, its beat interval in milliseconds, and how many
   * times it was judged dead.
   */
  /** Reports whether this client has heard gateway id beat. */
  knows(id: string): boolean {
    return this.peers.has(id);
  }

  isDead(id: string): [boolean, number, number] {
    const p = this.peers.get(id);
    return p === undefined ? [false, 0, 0] : [p.dead, p.interval, p.deaths];
  }

  /** Calls f whenever gateways are judged dead, until the returned function is called. */
  deaths(f: () => void): () => void {
    this.onDeath.add(f);
    return () => this.onDeath.delete(f);
  }

  close(): void {
    clearInterval(this.timer);
    this.onDeath.clear();
    try {
      this.sub.unsubscribe();
    } catch {
      // the connection is closed
    }
  }
}

/** What exchange needs of the connection it sends on. */
export interface Link {
  readonly nc: NatsConnection;
  /** The beats followed (started on first use). */
  followBeats(): GatewayBeats;
  /** Called at every disconnect: exchange adds its resend while it waits. */
  readonly disconnects: Set<() => void>;
  /** Waits (at most ms) until the connection is up. */
  whenConnected(ms: number): Promise<void>;
}

/**
 * One call's request/reply with failover (see the top of this file): sends data to
 * subject, and sends it again with the header Ortbus-Resend (at most MAX_RESENDS times)
 * when a gateway is judged dead, once reconnected after the connection dropped, after
 * one beat interval when a notice names a gateway this client judged dead, and shortly
 * after a resend found no gateway while another send is still out. Every send stays out
 * until the end. Resolves with the first reply that is not a notice; rejects with the
 * last send's error when nothing is out or due any more, or with TimeoutLocal at
 * deadline (or when onStop's function is called).
 */
export function exchange(
  link: Link,
  subject: string,
  data: Uint8Array,
  deadline: number,
  onStop: (stop: () => void) => void,
  trace?: TraceHeaders,
): Promise<Msg> {
  const beats = link.followBeats();
  return new Promise<Msg>((resolve, reject) => {
    let done = false;
    let waiting = 0; // sends still out
    let resends = 0;
    let retry: ReturnType<typeof setTimeout> | undefined; // a resend due later
    // The gateway the last notice named as holding the call (undefined: not known), and
    // its deaths then: the death of another gateway does not send again.
    let holder: string | undefined;
    let holderDeaths = 0;
    const end = (fn: () => void) => {
      if (done) return;
      done = true;
      clearTimeout(timer);
      if (retry !== undefined) clearTimeout(retry);
      offDeaths();
      link.disconnects.delete(resend);
      fn();
    };
    const timer = setTimeout(() => end(() => reject(new TimeoutLocal())), Math.max(0, deadline - performance.now()));
    onStop(() => end(() => reject(new TimeoutLocal())));
    const onReply = (m: Msg) => {
      waiting--;
      if (done) return;
      const held = m.headers?.get(HEADER_HELD) ?? "";
      if (held === "") {
        end(() => resolve(m));
        return;
      }
      // A live gateway holds it: wait for its answer. One this client already judged
      // dead while the answering gateway did not yet: ask again after one of its beats.
      const [dead, interval, deaths] = beats.isDead(held);
      if (beats.knows(held)) {
        // Only a holder this client hears beat is one whose death it will see: pinned
        // then; else any gateway's death still sends again.
        holder = held;
        holderDeaths = deaths;
      }
      if (dead) later(interval);
    };
    const onError = (e: unknown) => {
      waiting--;
      if (done) return;
      if (isNoResponders(e) && waiting > 0) {
        later(RETRY_MS); // no gateway right now (they are restarting): ask again shortly
      } else if (waiting === 0 && retry === undefined) {
        end(() => reject(e));
      }
    };
    // Publishes one send, already counted in waiting.
    const sendOnce = (resend: boolean) => {
      const left = Math.ceil(deadline - performance.now());
      if (left <= 0) {
        onError(new TimeoutLocal());
        return;
      }
      const o: RequestOptions = { timeout: left };
      let h: MsgHdrs | undefined;
      if (resend) {
        h = natsHeaders();
        h.set(HEADER_RESEND, "1");
      }
      h = withTrace(h, trace); // every send carries the call's trace context (trace.ts)
      if (h) o.headers = h;
      let p: Promise<Msg>;
      try {
        p = link.nc.request(subject, data, o);
      } catch (e) {
        p = Promise.reject(e);
      }
      p.then(onReply, onError);
    };
    const resend = () => {
      if (done || resends >= MAX_RESENDS) return;
      resends++;
      waiting++;
      // Not published while the connection is down (nats.js could lose it around the
      // reconnect): sent once reconnected.
      void link.whenConnected(deadline - performance.now()).then(() => {
        if (!done) sendOnce(true);
      });
    };
    const later = (ms: number) => {
      if (retry !== undefined) clearTimeout(retry);
      retry = setTimeout(() => {
        retry = undefined;
        resend();
      }, ms);
    };
    // Gateways were judged dead: sent again when the holder is among them, or not known.
    const onDeaths = () => {
      if (done) return;
      if (holder !== undefined && beats.isDead(holder)[2] === holderDeaths) return; // another one died
      holder = undefined; // the resend's answer names who holds it now
      resend();
    };
    const offDeaths = beats.deaths(onDeaths);
    // The connection went down with the sends out: they (or their replies) may be gone
    // with the server. Sent again once reconnected; a gateway that still holds the
    // request answers that resend with a notice, and its answer comes to the first send.
    link.disconnects.add(resend);
    waiting++;
    sendOnce(false);
  });
}
