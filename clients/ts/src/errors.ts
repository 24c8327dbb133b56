// Errors: the stable error codes of the contract (codec.Codes), their HTTP-like status, and
// OrtbusError, the one error type every call rejects with.

/** Every stable error code of the ortbus contract; clients switch on these. */
export const ORTBUS_ERROR_CODES = [
  "bad_request",
  "unknown_op",
  "unknown_model",
  "unknown_pool",
  "unknown_job",
  "file_not_found",
  "forbidden_path",
  "unsupported_image",
  "image_too_large",
  "runtime_missing",
  "provider_unavailable",
  "no_worker",
  "overloaded",
  "deadline_exceeded",
  "cancelled",
  "worker_lost",
  "poison_input",
  "reply_too_large",
  "unavailable",
  "internal",
  "conflict",
  "model_unavailable",
] as const;

/** A stable ortbus error code. */
export type OrtbusErrorCode = (typeof ORTBUS_ERROR_CODES)[number];

/** The codes in ORTBUS_ERROR_CODES, for checking a code that came over the wire. */
export const KNOWN_CODES: ReadonlySet<string> = new Set(ORTBUS_ERROR_CODES);

/** HTTP-like status of each code, as the gateway sends it in Nats-Service-Error-Code. */
export function statusOf(code: OrtbusErrorCode): number {
  switch (code) {
    case "bad_request":
    case "unsupported_image":
      return 400;
    case "forbidden_path":
      return 403;
    case "unknown_op":
    case "unknown_model":
    case "unknown_pool":
    case "unknown_job":
    case "file_not_found":
      return 404;
    case "conflict":
      return 409;
    case "image_too_large":
      return 413;
    case "poison_input":
      return 422;
    case "overloaded":
      return 429;
    case "cancelled":
      return 499;
    case "runtime_missing":
    case "provider_unavailable":
    case "no_worker":
    case "worker_lost":
    case "unavailable":
    case "model_unavailable":
      return 503;
    case "deadline_exceeded":
      return 504;
    default:
      return 500;
  }
}

/**
 * The one error type every OrtbusClient / OrtbusAiClient call rejects with. `code` is a
 * stable contract code; `details` is what the gateway attached (pool, worker, paths
 * searched, ...); `status` is the HTTP-like number of the reply header (or of the code,
 * for errors the client itself raises: a local timeout, an abort, no gateway).
 */
export class OrtbusError extends Error {
  readonly code: OrtbusErrorCode;
  readonly details?: Record<string, unknown>;
  readonly status?: number;
  /** The request id the error belongs to, when there was one. */
  readonly requestId?: string;

  constructor(
    code: OrtbusErrorCode,
    message: string,
    opts: { details?: Record<string, unknown>; status?: number; requestId?: string; cause?: unknown } = {},
  ) {
    super(message, opts.cause === undefined ? undefined : { cause: opts.cause });
    this.name = "OrtbusError";
    this.code = code;
    if (opts.details !== undefined) this.details = opts.details;
    this.status = opts.status ?? statusOf(code);
    if (opts.requestId !== undefined) this.requestId = opts.requestId;
  }
}

/** Reports whether e is an OrtbusError (with the given code, if one is named). */
export function isOrtbusError(e: unknown, code?: OrtbusErrorCode): e is OrtbusError {
  return e instanceof OrtbusError && (code === undefined || e.code === code);
}

/** The message of e (an Error's), or e as a string. */
export function errText(e: unknown): string {
  return e instanceof Error ? e.message : String(e);
}
