// Hostile replies fed straight to the client's decoders: every one is refused with an
// OrtbusError of code "internal" at once, never a hang, a RangeError, a stack overflow or
// an allocation the message's size does not justify. No gateway needed.

import { describe, expect, test } from "bun:test";

import { OrtbusError, REPLY_LIMITS, decodeJSON, decodeMsg, encodeMsg } from "../index.ts";

/** Bytes from numbers and byte arrays. */
function bytes(...parts: (number | number[] | Uint8Array)[]): Uint8Array {
  const flat: number[] = [];
  for (const p of parts) {
    if (typeof p === "number") flat.push(p);
    else flat.push(...p);
  }
  return new Uint8Array(flat);
}

/** A big-endian uint32. */
function u32(n: number): number[] {
  return [(n >>> 24) & 0xff, (n >>> 16) & 0xff, (n >>> 8) & 0xff, n & 0xff];
}

/** Decoding b rejects with an internal OrtbusError whose message says `says`. */
function refused(decode: (b: Uint8Array) => unknown, b: Uint8Array, says: RegExp): void {
  let err: unknown;
  const start = performance.now();
  try {
    decode(b);
  } catch (e) {
    err = e;
  }
  expect(err).toBeInstanceOf(OrtbusError);
  const e = err as OrtbusError;
  expect(e.code).toBe("internal");
  expect(e.status).toBe(500);
  expect(e.message).toMatch(says);
  expect(performance.now() - start).toBeLessThan(2_000);
}

describe("decodeMsg: hostile msgpack", () => {
  test("an array32 header of 0xffffffff with nothing behind it", () => {
    refused(decodeMsg, bytes(0xdd, u32(0xffffffff)), /4294967295 values .* cannot fit/);
  });

  test("a map32 header of 0xffffffff, inside a map", () => {
    refused(decodeMsg, bytes(0x81, 0xa1, 0x78, 0xdf, u32(0xffffffff), 0xc0), /cannot fit/);
  });

  test("str32 and bin32 lengths past the end", () => {
    refused(decodeMsg, bytes(0xdb, u32(0xffffffff), 0x61), /string of 4294967295 bytes/);
    refused(decodeMsg, bytes(0xc6, u32(0x7fffffff)), /bin of 2147483647 bytes/);
    refused(decodeMsg, bytes(0xc9, u32(0xfffffff0), 0x01), /ext of/);
  });

  test("an array longer than maxArrayLength, every element present", () => {
    const n = REPLY_LIMITS.maxArrayLength + 1;
    const b = new Uint8Array(5 + n).fill(0xc0);
    b.set(bytes(0xdd, u32(n)));
    refused(decodeMsg, b, /array length/i);
  });

  test("a string longer than maxStrLength", () => {
    const n = REPLY_LIMITS.maxStrLength + 1;
    const b = new Uint8Array(5 + n).fill(0x61);
    b.set(bytes(0xdb, u32(n)));
    refused(decodeMsg, b, /maxStrLength/);
  });

  test("nesting: maxDepth arrays decode, one more is refused, 100000 cannot overflow the stack", () => {
    const nest = (depth: number) => bytes(new Array(depth).fill(0x91), 0xc0);
    let v: unknown = decodeMsg(nest(REPLY_LIMITS.maxDepth));
    for (let d = 0; d < REPLY_LIMITS.maxDepth; d++) v = (v as unknown[])[0];
    expect(v).toBeNull();
    refused(decodeMsg, nest(REPLY_LIMITS.maxDepth + 1), /nested deeper than 16/);
    refused(decodeMsg, nest(100_000), /nested deeper than 16/);
  });

  test("truncated values, trailing bytes, invalid codes, nothing at all", () => {
    refused(decodeMsg, bytes(0xcb, 0x00, 0x00), /value of 8 bytes/);
    refused(decodeMsg, bytes(0x92, 0x01), /2 values at byte 1 cannot fit/);
    refused(decodeMsg, bytes(0xc0, 0xc0), /1 bytes after/);
    refused(decodeMsg, bytes(0xc1), /invalid msgpack code 0xc1/);
    refused(decodeMsg, bytes(), /value of 1 bytes/);
  });

  test("a legitimate reply still decodes", () => {
    const reply = {
      id: "r1",
      pool: "fast",
      general: { red: 0.97, blue: 0.01 },
      ips: ["test_franchise"],
      embedding: new Uint8Array(3072),
      timing: { queue_us: 12, infer_us: 3400, total_us: 3500 },
      big: 2 ** 40,
    };
    const got = decodeMsg<typeof reply>(encodeMsg(reply));
    expect(got.general).toEqual(reply.general);
    expect(got.ips).toEqual(reply.ips);
    expect(got.embedding.byteLength).toBe(3072);
    expect(got.big).toBe(2 ** 40);
  });
});

describe("decodeJSON: bounded", () => {
  const enc = (s: string) => new TextEncoder().encode(s);

  test("too deep, malformed", () => {
    refused(decodeJSON, enc("[".repeat(17) + "]".repeat(17)), /nested deeper than 16/);
    refused(decodeJSON, enc("[".repeat(1_000_000)), /nested deeper than 16/);
    refused(decodeJSON, enc('{"code":'), /malformed JSON reply/);
  });

  test("brackets inside strings do not count; a legitimate body parses", () => {
    const body = { code: "bad_request", message: "[[[[[[[[[[[[[[[[[[[ \" {{{{", details: { a: [1, [2, [3]]] } };
    expect(decodeJSON(enc(JSON.stringify(body)))).toEqual(body);
  });
});
