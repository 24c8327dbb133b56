// Options of connect and of every call.

import type { OrtbusClass } from "./messages.ts";

/** Options of OrtbusClient.connect and OrtbusAiClient.connect. */
export interface ConnectOptions {
  /** NATS server URL(s), e.g. "nats://127.0.0.1:4222". */
  servers: string | string[];
  /** Default class of every request (the gateway's default, interactive, when unset). */
  class?: OrtbusClass;
  /** Default pool (strict: the request goes there or fails). */
  pool?: string;
  /**
   * Default timeout of every request in milliseconds (default 30000). It is sent as the
   * request's `timeout_ms` (the gateway caps it by the class's max_timeout and answers
   * deadline_exceeded), and bounds the wait in the client too (timeout + 2 s grace), so
   * no call waits forever even when no gateway answers.
   */
  timeoutMs?: number;
  /** NATS connection name (default "ortbus ts client"). */
  name?: string;
  /** Milliseconds between reconnect attempts (default 250); reconnects never give up. */
  reconnectTimeWaitMs?: number;
  /**
   * Prefix of the reply subjects (default nats.js's "_INBOX"). A server that lets each user
   * subscribe only to its own inboxes needs it: deploy/cluster's user `client` gets its
   * replies on `_INBOX_client.>` only, so connect with `inboxPrefix: "_INBOX_client"`.
   */
  inboxPrefix?: string;
  /** NATS user and password (keep the password in the environment, never in source). */
  user?: string;
  pass?: string | undefined;
  /** TLS to the server: the CA to trust (`caFile`), a client certificate for mutual TLS. */
  tls?: { caFile?: string; certFile?: string; keyFile?: string };
  /**
   * Gateway failover (default false): follow the gateways' beats (`ortbus.gw.*.hb`) and,
   * when the gateway holding a waiting inference call dies, send its request again (same
   * id, header `Ortbus-Resend`); the call takes the first answer that is not a notice.
   * Its holder is known once a notice named it; until then any gateway's death counts.
   * Without failover a call whose gateway dies ends only at its timeoutMs.
   * Call `gateways()` at start and wait until it lists the gateways you expect: a gateway
   * that dies before the client heard it is never judged dead.
   */
  failover?: boolean;
  /** Beat intervals of silence that make a gateway dead, with failover (default 3). */
  missCount?: number;
}

/** Per-call options of every OrtbusClient method. */
export interface CallOptions {
  class?: OrtbusClass;
  pool?: string;
  timeoutMs?: number;
  /** Aborting sends ortbus.v1.cancel for the request and rejects with code "cancelled". */
  signal?: AbortSignal;
  /** Model name (default: the class's default model for the op). */
  model?: string;
  /** Request id (default: a random UUID); what `cancel(id)` names. */
  id?: string;
  /**
   * false: the gateway's result cache (`[cache] enabled`) neither answers this call nor
   * keeps its answer. Default: the cache serves tag, embed and detect when it is on.
   */
  cache?: boolean;
  /**
   * The W3C trace context the call carries (headers `traceparent`, `tracestate`), in
   * place of the active span of @opentelemetry/api, which it carries by default when the
   * app uses that package. A malformed one is ignored by the gateway (a new trace starts).
   */
  traceparent?: string;
  tracestate?: string;
}

export interface TagOptions extends CallOptions {
  thresholds?: { general?: number; character?: number };
}

export interface DetectOptions extends CallOptions {
  conf?: number;
  iou?: number;
}

export interface SegmentOptions extends CallOptions {
  /** Where to write the PNG (inside the allowed roots); default: the gateway's spool dir. */
  outPath?: string;
}

export interface InferOptions extends CallOptions {
  /** Output names wanted (all when unset). */
  outputs?: string[];
  /**
   * Inputs read by the workers from NumPy .npy files (npyBytes writes one), by input name:
   * absolute paths under the allowed roots, for tensors too big for the bus.
   */
  inputPaths?: Record<string, string>;
  /** Write every wanted output as a new file <outputDir>/<name>.npy (under spool_dir or output_roots). */
  outputDir?: string;
  /** Write the named outputs as new .npy files at these paths (not with outputDir). */
  outputPaths?: Record<string, string>;
}
