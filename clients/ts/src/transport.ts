// The transport's timing and failures: how long a call waits, and how a nats.js request
// failure becomes an OrtbusError.

import { errText, OrtbusError } from "./errors.ts";
import { API_PREFIX } from "./wire.ts";
import type { Op } from "./wire.ts";

/** Default timeout of every request, in milliseconds. */
export const DEFAULT_TIMEOUT_MS = 30_000;
/** How much longer than a request's timeout the client waits for the gateway's own answer. */
export const GRACE_MS = 2_000;

/**
 * After a reconnect, a request that finds no subscriber (the gateway has not resubscribed
 * yet) is tried again every RETRY_MS for this long, within its own timeout.
 */
export const SETTLE_MS = 5_000;
export const RETRY_MS = 100;

/** The client's own wait ran out before a request could be sent. */
export class TimeoutLocal extends Error {
  constructor() {
    super("timeout waiting for the connection");
    this.name = "TimeoutError";
  }
}

/** Reports whether e says that nobody subscribes to the request's subject. */
export function isNoResponders(e: unknown): boolean {
  const name = e instanceof Error ? e.name : "";
  const cause = e instanceof Error ? (e as Error & { cause?: unknown }).cause : undefined;
  const causeName = cause instanceof Error ? cause.name : "";
  return (
    name === "NoRespondersError" ||
    causeName === "NoRespondersError" ||
    (typeof (e as { isNoResponders?: () => boolean })?.isNoResponders === "function" &&
      (e as { isNoResponders: () => boolean }).isNoResponders()) ||
    /no responders/i.test(errText(e))
  );
}

/** Maps a nats.js request failure to an OrtbusError. */
export function transportError(
  op: Op,
  e: unknown,
  timeoutMs: number,
  withId: (o: { details?: Record<string, unknown>; status?: number; cause?: unknown }) => object,
): OrtbusError {
  if (e instanceof OrtbusError) return e;
  const name = e instanceof Error ? e.name : "";
  const msg = errText(e);
  const cause = e instanceof Error ? (e as Error & { cause?: unknown }).cause : undefined;
  const causeName = cause instanceof Error ? cause.name : "";
  if (isNoResponders(e)) {
    return new OrtbusError("no_worker", `no ortbus gateway is answering ${API_PREFIX}.${op}`, withId({ cause: e }));
  }
  if (name === "TimeoutError" || causeName === "TimeoutError" || /timeout/i.test(msg)) {
    return new OrtbusError(
      "deadline_exceeded",
      `no answer to ${op} within ${timeoutMs + GRACE_MS} ms (timeout ${timeoutMs} ms + ${GRACE_MS} ms grace)`,
      withId({ details: { client_timeout_ms: timeoutMs + GRACE_MS }, cause: e }),
    );
  }
  return new OrtbusError("internal", `${op} request failed: ${msg}`, withId({ details: { transport: name || "error" }, cause: e }));
}
