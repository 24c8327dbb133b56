// The tensor helpers for every element type: bytes (what msgpack sends), values back,
// and .npy both ways (bfloat16, which NumPy has no dtype for, refused). No gateway needed.

import { describe, expect, test } from "bun:test";

import { OrtbusError, npyBytes, tensorBytes, tensorFromNpy, tensorValues } from "../index.ts";
import type { TensorType } from "../src/messages.ts";

const cases: [TensorType, number[], number[]][] = [
  // type, values in, little-endian bytes expected
  ["float16", [1, -2.5, 0.1, 70000, 2 ** -24, 0], [0x00, 0x3c, 0x00, 0xc1, 0x66, 0x2e, 0x00, 0x7c, 0x01, 0x00, 0x00, 0x00]],
  ["bfloat16", [1, -2.5, 0.1, 1.00390625], [0x80, 0x3f, 0x20, 0xc0, 0xcd, 0x3d, 0x80, 0x3f]],
  ["int8", [-128, 127, -1], [0x80, 0x7f, 0xff]],
  ["int16", [-32768, 32767, 1000], [0x00, 0x80, 0xff, 0x7f, 0xe8, 0x03]],
  ["uint16", [65535, 1], [0xff, 0xff, 0x01, 0x00]],
  ["uint32", [4294967295, 3], [0xff, 0xff, 0xff, 0xff, 0x03, 0, 0, 0]],
  ["uint64", [2 ** 53, 1], [0, 0, 0, 0, 0, 0, 0x20, 0, 1, 0, 0, 0, 0, 0, 0, 0]],
];

describe("tensor types", () => {
  for (const [type, values, want] of cases) {
    test(type, () => {
      const t = tensorBytes({ type, shape: [values.length], data: values });
      expect(Array.from(t.data)).toEqual(want);
      const back = Array.from(tensorValues(t) as ArrayLike<number>);
      if (type === "float16") expect(back).toEqual([1, -2.5, 0.0999755859375, Infinity, 2 ** -24, 0]);
      else if (type === "bfloat16") expect(back).toEqual([1, -2.5, 0.10009765625, 1]);
      else expect(back).toEqual(values);
      if (type === "bfloat16") {
        expect(() => npyBytes({ type, shape: [values.length], data: values })).toThrow(OrtbusError);
        return;
      }
      const f = tensorFromNpy(npyBytes({ type, shape: [values.length], data: values }));
      expect(f.type).toBe(type);
      expect(f.shape).toEqual([values.length]);
      expect(Array.from(f.data)).toEqual(want);
    });
  }
});
