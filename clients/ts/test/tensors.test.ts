// The tensor helpers for every element type: bytes (what msgpack sends), values back,
// and .npy both ways (bfloat16 as ml_dtypes' '<V2'). No gateway needed.

import { describe, expect, test } from "bun:test";

import { OrtbusError, decodeMsg, encodeMsg, npyBytes, tensorBytes, tensorFromNpy, tensorValues } from "../index.ts";
import type { NumericTensorType } from "../src/messages.ts";

const cases: [NumericTensorType, number[], number[]][] = [
  // type, values in, little-endian bytes expected
  ["float16", [1, -2.5, 0.1, 70000, 2 ** -24, 0], [0x00, 0x3c, 0x00, 0xc1, 0x66, 0x2e, 0x00, 0x7c, 0x01, 0x00, 0x00, 0x00]],
  ["bfloat16", [1, -2.5, 0.1, 1.00390625], [0x80, 0x3f, 0x20, 0xc0, 0xcd, 0x3d, 0x80, 0x3f]],
  ["int8", [-128, 127, -1], [0x80, 0x7f, 0xff]],
  ["int16", [-32768, 32767, 1000], [0x00, 0x80, 0xff, 0x7f, 0xe8, 0x03]],
  ["uint16", [65535, 1], [0xff, 0xff, 0x01, 0x00]],
  ["uint32", [4294967295, 3], [0xff, 0xff, 0xff, 0xff, 0x03, 0, 0, 0]],
  ["uint64", [2 ** 53, 1], [0, 0, 0, 0, 0, 0, 0x20, 0, 1, 0, 0, 0, 0, 0, 0, 0]],
];

describe("bfloat16 in .npy", () => {
  // A version 1.0 file of one element with this descr, as np.save lays it out.
  const npyWith = (descr: string, data: number[]) => {
    let h = `{'descr': '${descr}', 'fortran_order': False, 'shape': (1,), }`;
    h += " ".repeat((64 - ((10 + h.length + 1) % 64)) % 64) + "\n";
    return new Uint8Array([0x93, 0x4e, 0x55, 0x4d, 0x50, 0x59, 1, 0, h.length, 0, ...new TextEncoder().encode(h), ...data]);
  };
  test("written as '<V2'; read as '<V2', '|V2' and 'bfloat16'; other voids refused", () => {
    const b = npyBytes({ type: "bfloat16", shape: [1], data: [1] });
    expect(Array.from(b)).toEqual(Array.from(npyWith("<V2", [0x80, 0x3f])));
    for (const descr of ["<V2", "|V2", "bfloat16"]) {
      const f = tensorFromNpy(npyWith(descr, [0x80, 0x3f]));
      expect(f.type).toBe("bfloat16");
      expect(Array.from(f.data as Uint8Array)).toEqual([0x80, 0x3f]);
    }
    expect(() => tensorFromNpy(npyWith("<V4", [0, 0, 0, 0]))).toThrow(OrtbusError);
  });
});

describe("tensor types", () => {
  for (const [type, values, want] of cases) {
    test(type, () => {
      const t = tensorBytes({ type, shape: [values.length], data: values });
      expect(Array.from(t.data)).toEqual(want);
      const back = Array.from(tensorValues(t) as ArrayLike<number>);
      if (type === "float16") expect(back).toEqual([1, -2.5, 0.0999755859375, Infinity, 2 ** -24, 0]);
      else if (type === "bfloat16") expect(back).toEqual([1, -2.5, 0.10009765625, 1]);
      else expect(back).toEqual(values);
      const f = tensorFromNpy(npyBytes({ type, shape: [values.length], data: values }));
      expect(f.type).toBe(type);
      expect(f.shape).toEqual([values.length]);
      expect(f.type === "string" ? f.data : Array.from(f.data)).toEqual(want);
    });
  }
});

// Strings: an array of str on the wire; NumPy's '<U{n}' (UTF-32LE, NUL-padded) in files.
describe("string tensors", () => {
  const strs = ["ab", "c", "", "é😀"];

  test("infer encoding", () => {
    const t = tensorBytes({ type: "string", shape: [2, 2], data: strs });
    expect(t).toEqual({ type: "string", shape: [2, 2], data: strs });
    expect(tensorValues(t)).toEqual(strs);
    const wire = decodeMsg<{ type: string; data: unknown }>(encodeMsg(t));
    expect(wire.data).toEqual(strs); // msgpack array of str
    expect(() => tensorBytes({ type: "string", shape: [3], data: strs })).toThrow(OrtbusError);
    expect(() => tensorBytes({ type: "string", shape: [1], data: ["\ud800"] })).toThrow(OrtbusError);
    expect(() => tensorBytes({ type: "string", shape: [1], data: [1] as unknown as string[] })).toThrow(OrtbusError);
  });

  test(".npy both ways, as np.save writes them", () => {
    const b = npyBytes({ type: "string", shape: [2, 2], data: strs });
    const header = new TextDecoder("latin1").decode(b.subarray(10, 10 + (b[8]! | (b[9]! << 8))));
    expect(header.startsWith("{'descr': '<U2', 'fortran_order': False, 'shape': (2, 2), }")).toBe(true);
    const body = Array.from(b.subarray(b.byteLength - 32));
    const u32 = (...cs: number[]) => cs.flatMap((c) => [c & 0xff, (c >> 8) & 0xff, (c >> 16) & 0xff, c >>> 24]);
    expect(body).toEqual(u32(0x61, 0x62, 0x63, 0, 0, 0, 0xe9, 0x1f600));
    expect(tensorFromNpy(b)).toEqual({ type: "string", shape: [2, 2], data: strs });
    expect(() => npyBytes({ type: "string", shape: [1], data: ["a\u0000"] })).toThrow(OrtbusError);
  });

  test("hostile '<U' files are refused", () => {
    const file = (descr: string, shape: string, data: number[]) => {
      let h = `{'descr': '${descr}', 'fortran_order': False, 'shape': ${shape}, }`;
      h += " ".repeat((64 - ((10 + h.length + 1) % 64)) % 64) + "\n";
      return new Uint8Array([0x93, 0x4e, 0x55, 0x4d, 0x50, 0x59, 1, 0, h.length & 0xff, h.length >> 8, ...Array.from(h, (c) => c.charCodeAt(0)), ...data]);
    };
    for (const [descr, shape, data] of [
      ["<U0", "(0,)", []],
      ["<U67108865", "(1,)", []],
      ["<U99999999999999999999", "(1,)", []],
      ["<U67108864", "(268435456,)", [0x61, 0, 0, 0]],
      ["<U1", "(2,)", [0x61, 0, 0, 0]],
      ["<U1", "(1,)", [0, 0, 0x11, 0]], // over U+10FFFF
      ["<U1", "(1,)", [0, 0xd8, 0, 0]], // a surrogate
      [">U1", "(1,)", [0, 0, 0, 0x61]],
    ] as [string, string, number[]][]) {
      expect(() => tensorFromNpy(file(descr, shape, data))).toThrow(OrtbusError);
    }
  });
});
