// Wire encoding and decoding: what travels on the bus and how it is read. Requests are
// msgpack maps sent to `ortbus.v1.<op>`; replies are msgpack (or JSON) maps, decoded within
// REPLY_LIMITS; an error reply carries the headers Nats-Service-Error-Code /
// Nats-Service-Error and a body {code, message, details}.

import { Decoder, Encoder } from "@msgpack/msgpack";
import type { Msg } from "@nats-io/transport-node";

import { errText, KNOWN_CODES, OrtbusError } from "./errors.ts";
import type { OrtbusErrorCode } from "./errors.ts";
import type { Tensor } from "./messages.ts";

/**
 * A copy of b's bytes in a fresh ArrayBuffer (byteOffset 0). Not b.slice(): a Node/Bun
 * Buffer's slice is a view into the same memory, and what msgpack decodes from a NATS
 * message is such a view into the whole message.
 */
export function copyBytes(b: Uint8Array): Uint8Array {
  const out = new Uint8Array(b.byteLength);
  out.set(b);
  return out;
}

/**
 * Bounds on what a reply may hold, sized to what replies legitimately carry (a tensor or
 * an embedding as bin, tag maps, status lists). A reply over any of them is refused
 * before it is built, with an OrtbusError of code `internal`: a gateway never sends one,
 * so it is a broken or hostile peer, never the caller's mistake.
 */
export const REPLY_LIMITS = {
  /** Longest msgpack str (and map key), in bytes. */
  maxStrLength: 1 << 20,
  /** Longest msgpack bin (an infer output tensor), in bytes. */
  maxBinLength: 64 << 20,
  /** Most elements of one array, and entries of one map. */
  maxArrayLength: 1_000_000,
  maxMapLength: 1_000_000,
  /** Longest msgpack ext (replies have none), in bytes. */
  maxExtLength: 1 << 20,
  /** Deepest nesting of arrays and maps (a status reply is 5 deep; the gateway's own bound is 16). */
  maxDepth: 16,
  /** Largest reply body of any encoding, in bytes (a JSON body is refused above it before parsing). */
  maxBytes: 128 << 20,
} as const;

// Go's codec writes small ints compactly; a true int64/uint64 decodes as a JS number
// (never a bigint), exact up to 2^53.
const decoder = new Decoder({
  useBigInt64: false,
  maxStrLength: REPLY_LIMITS.maxStrLength,
  maxBinLength: REPLY_LIMITS.maxBinLength,
  maxArrayLength: REPLY_LIMITS.maxArrayLength,
  maxMapLength: REPLY_LIMITS.maxMapLength,
  maxExtLength: REPLY_LIMITS.maxExtLength,
});
const encoder = new Encoder({ ignoreUndefined: true, useBigInt64: false });

/** msgpack-encodes v (undefined fields are left out). */
export function encodeMsg(v: unknown): Uint8Array {
  return encoder.encode(v);
}

/**
 * msgpack-decodes b; int64 values come back as numbers. b is walked first (no allocation):
 * every length must fit in the bytes that follow it, nesting is at most
 * REPLY_LIMITS.maxDepth, and no bytes may trail the value; then the decoder applies the
 * other REPLY_LIMITS. Anything else throws an OrtbusError of code `internal`, never a
 * RangeError, a hang or an allocation the message's size cannot justify.
 */
export function decodeMsg<T = unknown>(b: Uint8Array): T {
  try {
    if (b.byteLength > REPLY_LIMITS.maxBytes) throw new Error(`${b.byteLength} bytes, over the ${REPLY_LIMITS.maxBytes}-byte bound`);
    checkMsgpack(b);
    return decoder.decode(b) as T;
  } catch (e) {
    if (e instanceof OrtbusError) throw e;
    throw new OrtbusError("internal", `malformed msgpack reply: ${errText(e)}`, { cause: e });
  }
}

/**
 * JSON-parses a reply body (a reply to a request sent as JSON) within REPLY_LIMITS:
 * maxBytes before parsing, maxDepth brackets deep. Failures are OrtbusError `internal`.
 */
export function decodeJSON<T = unknown>(b: Uint8Array): T {
  try {
    if (b.byteLength > REPLY_LIMITS.maxBytes) throw new Error(`${b.byteLength} bytes, over the ${REPLY_LIMITS.maxBytes}-byte bound`);
    let depth = 0;
    let inStr = false;
    for (let i = 0; i < b.length; i++) {
      const c = b[i]!;
      if (inStr) {
        if (c === 0x5c) i++; // backslash: skip the escaped byte
        else if (c === 0x22) inStr = false;
        continue;
      }
      if (c === 0x22) inStr = true;
      else if (c === 0x5b || c === 0x7b) {
        if (++depth > REPLY_LIMITS.maxDepth) throw new Error(`nested deeper than ${REPLY_LIMITS.maxDepth} at byte ${i}`);
      } else if (c === 0x5d || c === 0x7d) depth--;
    }
    return JSON.parse(new TextDecoder().decode(b)) as T;
  } catch (e) {
    throw new OrtbusError("internal", `malformed JSON reply: ${errText(e)}`, { cause: e });
  }
}

/**
 * Walks one msgpack value filling b exactly, iteratively (no recursion, no allocation but
 * a stack of at most maxDepth counters), and throws when a length header claims more
 * than the bytes left, nesting passes REPLY_LIMITS.maxDepth, or bytes trail the value.
 */
function checkMsgpack(b: Uint8Array): void {
  const dv = new DataView(b.buffer, b.byteOffset, b.byteLength);
  const end = b.byteLength;
  let i = 0;
  const need = (n: number, what: string) => {
    if (n > end - i) throw new Error(`${what} of ${n} bytes at byte ${i} is more than the ${end - i} bytes left`);
  };
  // Values still to read at each open level; the top level holds one value.
  const todo: number[] = [1];
  while (todo.length > 0) {
    const left = todo[todo.length - 1]!;
    if (left === 0) {
      todo.pop();
      continue;
    }
    todo[todo.length - 1] = left - 1;
    need(1, "value");
    const c = b[i++]!;
    let items = -1; // values of an array or map header
    if (c <= 0x7f || c >= 0xe0 || c === 0xc0 || c === 0xc2 || c === 0xc3) {
      continue; // fixint, nil, bool
    } else if (c >= 0xa0 && c <= 0xbf) {
      need(c & 0x1f, "string"); // fixstr
      i += c & 0x1f;
    } else if (c >= 0x90 && c <= 0x9f) {
      items = c & 0x0f; // fixarray
    } else if (c >= 0x80 && c <= 0x8f) {
      items = 2 * (c & 0x0f); // fixmap
    } else if (MSGPACK_FIXED[c] !== undefined) {
      need(MSGPACK_FIXED[c], "value");
      i += MSGPACK_FIXED[c];
    } else if (MSGPACK_SIZED[c] !== undefined) {
      const [size, extra, kind] = MSGPACK_SIZED[c];
      need(size, "length");
      const n = size === 1 ? dv.getUint8(i) : size === 2 ? dv.getUint16(i) : dv.getUint32(i);
      i += size;
      if (kind === "array") items = n;
      else if (kind === "map") items = 2 * n;
      else {
        need(extra + n, kind);
        i += extra + n;
      }
    } else {
      throw new Error(`invalid msgpack code 0x${c.toString(16)} at byte ${i - 1}`);
    }
    if (items >= 0) {
      // Each value takes at least one byte.
      if (items > end - i) throw new Error(`${items} values at byte ${i} cannot fit in the ${end - i} bytes left`);
      if (todo.length > REPLY_LIMITS.maxDepth) throw new Error(`nested deeper than ${REPLY_LIMITS.maxDepth} at byte ${i}`);
      todo.push(items);
    }
  }
  if (i !== end) throw new Error(`${end - i} bytes after the reply's value`);
}

/** msgpack codes of fixed size: the bytes after the code (numbers, fixext). */
const MSGPACK_FIXED: Readonly<Record<number, number>> = {
  0xcc: 1, 0xd0: 1, 0xcd: 2, 0xd1: 2, 0xce: 4, 0xd2: 4, 0xca: 4, 0xcf: 8, 0xd3: 8, 0xcb: 8, // uint, int, float
  0xd4: 2, 0xd5: 3, 0xd6: 5, 0xd7: 9, 0xd8: 17, // fixext 1/2/4/8/16: type byte + data
};

/** msgpack codes with a length: its size in bytes, bytes before the data, and the kind. */
const MSGPACK_SIZED: Readonly<Record<number, readonly [1 | 2 | 4, number, "string" | "bin" | "ext" | "array" | "map"]>> = {
  0xd9: [1, 0, "string"], 0xda: [2, 0, "string"], 0xdb: [4, 0, "string"],
  0xc4: [1, 0, "bin"], 0xc5: [2, 0, "bin"], 0xc6: [4, 0, "bin"],
  0xc7: [1, 1, "ext"], 0xc8: [2, 1, "ext"], 0xc9: [4, 1, "ext"], // type byte + data
  0xdc: [2, 0, "array"], 0xdd: [4, 0, "array"],
  0xde: [2, 0, "map"], 0xdf: [4, 0, "map"],
};

/** Subject prefix of the client API. */
export const API_PREFIX = "ortbus.v1";

/** The client API's ops. */
export type Op =
  | "tag"
  | "embed"
  | "compare"
  | "detect"
  | "segment"
  | "infer"
  | "cancel"
  | "status"
  | "health"
  | "lease"
  | "pause"
  | "job.submit"
  | "job.status"
  | "job.cancel"
  | "job.pause"
  | "job.resume"
  | "job.list"
  | "job.results";

const HEADER_ERROR_CODE = "Nats-Service-Error-Code";
const HEADER_ERROR = "Nats-Service-Error";

/** Wire request fields (codec.Request), snake_case. */
export interface WireRequest {
  id?: string;
  model?: string;
  path?: string;
  class?: string;
  pool?: string;
  timeout_ms?: number;
  thresholds?: { general?: number; character?: number };
  conf?: number;
  iou?: number;
  out_path?: string;
  feature?: Uint8Array;
  candidates?: Uint8Array[];
  inputs?: Record<string, Tensor>;
  outputs?: string[];
  input_paths?: Record<string, string>;
  output_dir?: string;
  output_paths?: Record<string, string>;
  cache?: boolean;
}

/** Reads a reply: an error reply (micro headers) becomes an OrtbusError. */
export function decodeReply<T>(op: Op, msg: Msg, id: string | undefined): T {
  const h = msg.headers;
  const codeHeader = h?.get(HEADER_ERROR_CODE) ?? "";
  if (codeHeader !== "") {
    const status = Number.parseInt(codeHeader, 10);
    const text = h?.get(HEADER_ERROR) ?? "";
    let body: { code?: unknown; message?: unknown; details?: unknown } | undefined;
    if (msg.data.length > 0) {
      try {
        body = decodeBody(msg);
      } catch {
        body = undefined;
      }
    }
    const o: { details?: Record<string, unknown>; status?: number; requestId?: string } = {};
    if (Number.isFinite(status)) o.status = status;
    if (id !== undefined) o.requestId = id;
    if (body && typeof body.code === "string" && KNOWN_CODES.has(body.code)) {
      if (body.details && typeof body.details === "object") o.details = body.details as Record<string, unknown>;
      return throwErr(new OrtbusError(body.code as OrtbusErrorCode, String(body.message ?? text), o));
    }
    o.details = { status, ...(body && typeof body.code === "string" ? { original_code: body.code } : {}) };
    return throwErr(new OrtbusError("internal", text || `${op} failed with status ${codeHeader}`, o));
  }
  try {
    return decodeBody<T>(msg);
  } catch (e) {
    throw new OrtbusError("internal", `decode ${op} reply: ${errText(e)}`, id === undefined ? { cause: e } : { cause: e, requestId: id });
  }
}

/** A reply body within REPLY_LIMITS: msgpack, or JSON when the reply says so. */
function decodeBody<T = unknown>(msg: Msg): T {
  const ct = msg.headers?.get("Content-Type") ?? "";
  return ct.split(";")[0]!.trim().toLowerCase() === "application/json" ? decodeJSON<T>(msg.data) : decodeMsg<T>(msg.data);
}

function throwErr(e: OrtbusError): never {
  throw e;
}
