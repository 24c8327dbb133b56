// Tensors and float vectors: what infer, embed and compare send and return, encoded as
// little-endian bytes; NumPy .npy files for infer's inputPaths and output files.

import { OrtbusError } from "./errors.ts";
import type { NumericTensor, NumericTensorType, StringTensor, Tensor, TensorType } from "./messages.ts";
import { copyBytes } from "./wire.ts";

const LITTLE_ENDIAN = new Uint8Array(new Uint16Array([1]).buffer)[0] === 1;

/** A float vector as a client may pass it. */
export type FloatVector = Float32Array | Float64Array | ArrayLike<number>;

/**
 * A tensor as a client may pass it to infer: raw bytes or a typed array of its type; for
 * type "string", its strings (well-formed: no lone surrogate).
 */
export interface TensorInput {
  type: TensorType;
  shape: number[];
  data: Uint8Array | Float32Array | Float64Array | Int32Array | BigInt64Array | ArrayLike<number> | ArrayLike<boolean> | ArrayLike<string>;
}

/** Little-endian float32 bytes of a vector (what msgpack sends as bin). */
export function float32Bytes(v: FloatVector): Uint8Array {
  if (v instanceof Float32Array && LITTLE_ENDIAN) {
    // A copy of exactly the view's bytes, whatever its offset in its buffer.
    return copyBytes(new Uint8Array(v.buffer, v.byteOffset, v.byteLength));
  }
  const out = new Uint8Array(4 * v.length);
  const dv = new DataView(out.buffer);
  for (let i = 0; i < v.length; i++) dv.setFloat32(4 * i, Number(v[i]), true);
  return out;
}

/**
 * A Float32Array from little-endian float32 bytes. The bytes are copied first: a msgpack
 * bin arrives as a view into the message whose byteOffset need not be a multiple of 4.
 * A number array (a JSON reply, a Go []float32) is accepted too.
 */
export function float32FromBytes(raw: unknown): Float32Array {
  if (raw == null) return new Float32Array(0);
  if (Array.isArray(raw)) return Float32Array.from(raw as number[]);
  if (!(raw instanceof Uint8Array)) {
    throw new OrtbusError("internal", `float vector: want bin or number array, got ${typeof raw}`);
  }
  if (raw.byteLength % 4 !== 0) {
    throw new OrtbusError("internal", `float32 bin of ${raw.byteLength} bytes is not a multiple of 4`);
  }
  const n = raw.byteLength / 4;
  if (LITTLE_ENDIAN) {
    const copy = copyBytes(raw); // own buffer, byteOffset 0
    return new Float32Array(copy.buffer, 0, n);
  }
  const out = new Float32Array(n);
  const dv = new DataView(raw.buffer, raw.byteOffset, raw.byteLength);
  for (let i = 0; i < n; i++) out[i] = dv.getFloat32(4 * i, true);
  return out;
}

const ELEM_SIZE: Record<NumericTensorType, number> = {
  float32: 4, float64: 8, float16: 2, bfloat16: 2,
  int64: 8, int32: 4, int16: 2, int8: 1,
  uint64: 8, uint32: 4, uint16: 2, uint8: 1, bool: 1,
};

const F32 = new Float32Array(1);
const U32 = new Uint32Array(F32.buffer);

/** The bits of the IEEE 754 half-precision float nearest to v (round to nearest even). */
export function float16Bits(v: number): number {
  F32[0] = v;
  const x = U32[0]!;
  const sign = (x >>> 16) & 0x8000;
  const exp = (x >>> 23) & 0xff;
  let mant = x & 0x7fffff;
  if (exp === 0xff) return sign | 0x7c00 | (mant ? 0x200 : 0); // Inf, NaN
  const e = exp - 127 + 15;
  if (e >= 0x1f) return sign | 0x7c00; // overflow: Inf
  if (e <= 0) {
    if (e < -10) return sign; // underflow: ±0
    mant |= 0x800000;
    const shift = 14 - e;
    const half = 1 << (shift - 1);
    const rest = mant & ((1 << shift) - 1);
    let m = mant >>> shift;
    if (rest > half || (rest === half && m & 1)) m++;
    return sign | m;
  }
  let h = (e << 10) | (mant >>> 13);
  const rest = mant & 0x1fff;
  if (rest > 0x1000 || (rest === 0x1000 && h & 1)) h++; // may carry into the exponent: right
  return sign | h;
}

/** The value of a float16's bits. */
export function float16Value(b: number): number {
  const sign = b & 0x8000 ? -1 : 1;
  const exp = (b >>> 10) & 0x1f;
  const mant = b & 0x3ff;
  if (exp === 0) return sign * mant * 2 ** -24;
  if (exp === 0x1f) return mant ? NaN : sign * Infinity;
  return sign * (1 + mant / 1024) * 2 ** (exp - 15);
}

/** The bits of the bfloat16 nearest to v (the top 16 bits of a float32, round to nearest even). */
export function bfloat16Bits(v: number): number {
  F32[0] = v;
  const x = U32[0]!;
  if (Number.isNaN(v)) return (x >>> 16) | 0x40;
  return ((x + 0x7fff + ((x >>> 16) & 1)) >>> 16) & 0xffff;
}

/** The value of a bfloat16's bits. */
export function bfloat16Value(b: number): number {
  U32[0] = (b & 0xffff) << 16;
  return F32[0]!;
}

/** A UTF-16 surrogate without its other half (what String.prototype.isWellFormed finds). */
const LONE_SURROGATE = /[\uD800-\uDBFF](?![\uDC00-\uDFFF])|(?<![\uD800-\uDBFF])[\uDC00-\uDFFF]/;

/** The element count of a shape. */
function elements(shape: number[]): number {
  return shape.reduce((a, d) => a * d, 1);
}

/**
 * A string tensor for infer: its elements as strings, each well-formed UTF-16 (a lone
 * surrogate has no UTF-8: the server would refuse the message), as many as the shape says.
 */
function stringTensor(t: TensorInput): StringTensor {
  const shape = t.shape.map((d) => Number(d));
  const d = t.data as ArrayLike<unknown>;
  const data: string[] = [];
  for (let i = 0; i < d.length; i++) {
    const v = d[i];
    if (typeof v !== "string") throw new OrtbusError("bad_request", `string tensor element ${i} is a ${typeof v}, not a string`);
    if (LONE_SURROGATE.test(v)) throw new OrtbusError("bad_request", `string tensor element ${i} holds a lone surrogate (not valid UTF-8)`);
    data.push(v);
  }
  if (data.length !== elements(shape)) throw new OrtbusError("bad_request", `string tensor of shape [${shape.join(", ")}] needs ${elements(shape)} strings, got ${data.length}`);
  return { type: "string", shape, data };
}

/**
 * Encodes a tensor for infer: its values as little-endian bytes of its type; a string
 * tensor's as its strings (msgpack: an array of str).
 */
export function tensorBytes(t: TensorInput & { type: NumericTensorType }): NumericTensor;
export function tensorBytes(t: TensorInput & { type: "string" }): StringTensor;
export function tensorBytes(t: TensorInput): Tensor;
export function tensorBytes(t: TensorInput): Tensor {
  if (t.type === "string") return stringTensor(t);
  const size = ELEM_SIZE[t.type];
  if (size === undefined) throw new OrtbusError("bad_request", `tensor type ${String(t.type)} is not one of ${Object.keys(ELEM_SIZE).join(", ")}`);
  const shape = t.shape.map((d) => Number(d));
  const d = t.data;
  if (d instanceof Uint8Array && t.type !== "uint8" && t.type !== "bool" && t.type !== "int8") {
    return { type: t.type, shape, data: copyBytes(d) }; // already raw bytes
  }
  const n = (d as ArrayLike<unknown>).length;
  const out = new Uint8Array(n * size);
  const dv = new DataView(out.buffer);
  for (let i = 0; i < n; i++) {
    const v = (d as ArrayLike<unknown>)[i];
    switch (t.type) {
      case "float32":
        dv.setFloat32(4 * i, Number(v), true);
        break;
      case "float64":
        dv.setFloat64(8 * i, Number(v), true);
        break;
      case "int64":
        dv.setBigInt64(8 * i, typeof v === "bigint" ? v : BigInt(Math.trunc(Number(v))), true);
        break;
      case "int32":
        dv.setInt32(4 * i, Number(v), true);
        break;
      case "float16":
        dv.setUint16(2 * i, float16Bits(Number(v)), true);
        break;
      case "bfloat16":
        dv.setUint16(2 * i, bfloat16Bits(Number(v)), true);
        break;
      case "int16":
        dv.setInt16(2 * i, Number(v), true);
        break;
      case "int8":
        dv.setInt8(i, Number(v));
        break;
      case "uint64":
        dv.setBigUint64(8 * i, typeof v === "bigint" ? v : BigInt(Math.trunc(Number(v))), true);
        break;
      case "uint32":
        dv.setUint32(4 * i, Number(v), true);
        break;
      case "uint16":
        dv.setUint16(2 * i, Number(v), true);
        break;
      case "uint8":
        dv.setUint8(i, Number(v));
        break;
      case "bool":
        dv.setUint8(i, v ? 1 : 0);
        break;
    }
  }
  return { type: t.type, shape, data: out };
}

/**
 * The .npy dtype of each type; string is '<U{n}'. bfloat16 is '<V2', as np.save writes
 * ml_dtypes' bfloat16 (read back with `np.load(f).view(ml_dtypes.bfloat16)`).
 */
const NPY_DESCR: Record<NumericTensorType, string> = {
  float32: "<f4", float64: "<f8", float16: "<f2", bfloat16: "<V2",
  int64: "<i8", int32: "<i4", int16: "<i2", int8: "|i1",
  uint64: "<u8", uint32: "<u4", uint16: "<u2", uint8: "|u1", bool: "|b1",
};

/** Other spellings read: a void has no byte order ('|V2'); 'bfloat16' is str(dtype). */
const NPY_DESCR_ALSO: Record<string, NumericTensorType> = { "|V2": "bfloat16", bfloat16: "bfloat16" };
const NPY_MAGIC = [0x93, 0x4e, 0x55, 0x4d, 0x50, 0x59]; // \x93NUMPY

/**
 * A tensor as the bytes of a NumPy .npy file (version 1.0, C order, little-endian, the
 * header padded to 64 bytes as np.save writes it): what infer's inputPaths read.
 */
export function npyBytes(t: TensorInput): Uint8Array {
  const w = tensorBytes(t);
  let descr: string | undefined;
  let data: Uint8Array;
  if (w.type === "string") {
    [descr, data] = unicodeData(w.data);
  } else {
    descr = NPY_DESCR[w.type];
    data = w.data;
  }
  if (descr === undefined) throw new OrtbusError("bad_request", `tensor type ${w.type} has no .npy dtype`);
  const shape = w.shape.length === 1 ? `(${w.shape[0]},)` : `(${w.shape.join(", ")})`;
  let h = `{'descr': '${descr}', 'fortran_order': False, 'shape': ${shape}, }`;
  h += " ".repeat((64 - ((10 + h.length + 1) % 64)) % 64) + "\n";
  const out = new Uint8Array(10 + h.length + data.byteLength);
  out.set([...NPY_MAGIC, 1, 0, h.length & 0xff, h.length >> 8]);
  for (let i = 0; i < h.length; i++) out[10 + i] = h.charCodeAt(i);
  out.set(data, 10 + h.length);
  return out;
}

/** The most code points of an element of a '<U{n}' file read (the server's limit too). */
const MAX_UNICODE_LEN = 2 ** 26;
/** The most data npyBytes writes for a string tensor (every element padded to the longest). */
const MAX_UNICODE_DATA = 2 ** 30;

/**
 * Strings as NumPy's fixed-width unicode: dtype '<U{n}', n the most code points of an
 * element (at least 1), each element UTF-32LE padded with NULs. NumPy strips trailing NULs
 * when it reads, so an element ending with U+0000 is refused.
 */
function unicodeData(strs: string[]): [string, Uint8Array] {
  const points = strs.map((s) => Array.from(s, (c) => c.codePointAt(0)!));
  const width = Math.max(1, ...points.map((p) => p.length));
  points.forEach((p, i) => {
    if (p.length > 0 && p[p.length - 1] === 0) throw new OrtbusError("bad_request", `string ${i} ends with U+0000, which a NumPy unicode array cannot hold`);
  });
  if (strs.length * 4 * width > MAX_UNICODE_DATA) throw new OrtbusError("bad_request", `the .npy data of ${strs.length} strings of up to ${width} code points is over ${MAX_UNICODE_DATA} bytes`);
  const out = new Uint8Array(strs.length * 4 * width);
  const dv = new DataView(out.buffer);
  points.forEach((p, i) => p.forEach((c, k) => dv.setUint32(4 * (i * width + k), c, true)));
  return [`<U${width}`, out];
}

/** Reads the data of a '<U{width}' array of n elements (its size already checked). */
function unicodeStrings(body: Uint8Array, n: number, width: number, bad: (why: string) => OrtbusError): string[] {
  const dv = new DataView(body.buffer, body.byteOffset, body.byteLength);
  const out: string[] = new Array(n);
  for (let i = 0; i < n; i++) {
    let end = width;
    while (end > 0 && dv.getUint32(4 * (i * width + end - 1), true) === 0) end--;
    let s = "";
    for (let k = 0; k < end; k++) {
      const c = dv.getUint32(4 * (i * width + k), true);
      if (c > 0x10ffff || (c >= 0xd800 && c <= 0xdfff)) throw bad(`element ${i} holds 0x${c.toString(16)}, which is not a Unicode scalar value`);
      s += String.fromCodePoint(c);
    }
    out[i] = s;
  }
  return out;
}

/**
 * Reads a NumPy .npy file (versions 1.0 to 3.0, C order, little-endian, a tensor type) as
 * a Tensor, such as an output infer wrote; its data is a copy. Anything else throws
 * OrtbusError bad_request.
 */
export function tensorFromNpy(b: Uint8Array): Tensor {
  const bad = (why: string) => new OrtbusError("bad_request", `not a usable .npy tensor: ${why}`);
  if (b.byteLength < 10 || NPY_MAGIC.some((m, i) => b[i] !== m)) throw bad("no \\x93NUMPY magic");
  const dv = new DataView(b.buffer, b.byteOffset, b.byteLength);
  const major = b[6]!;
  if (b[7] !== 0 || major < 1 || major > 3) throw bad(`format version ${major}.${b[7]}`);
  const start = major === 1 ? 10 : 12;
  if (b.byteLength < start) throw bad("truncated header length");
  const hlen = major === 1 ? dv.getUint16(8, true) : dv.getUint32(8, true);
  if (hlen > 65536 || start + hlen > b.byteLength) throw bad(`header length ${hlen}`);
  const h = new TextDecoder("latin1").decode(b.subarray(start, start + hlen));
  const descr = /['"]descr['"]\s*:\s*['"]([^'"]*)['"]/.exec(h)?.[1];
  const unicode = /^<U([0-9]{1,12})$/.exec(descr ?? "");
  const type = (Object.keys(NPY_DESCR) as NumericTensorType[]).find((k) => NPY_DESCR[k] === descr || (NPY_DESCR[k][0] === "|" && descr === "<" + NPY_DESCR[k].slice(1))) ?? NPY_DESCR_ALSO[descr ?? ""];
  if (type === undefined && unicode === null) throw bad(`dtype ${descr}`);
  if (/['"]fortran_order['"]\s*:\s*True/.test(h)) throw bad("fortran_order is True");
  const dims = /['"]shape['"]\s*:\s*\(([^)]*)\)/.exec(h)?.[1];
  if (dims === undefined) throw bad("no shape");
  const shape = dims.split(",").map((d) => d.trim().replace(/L$/, "")).filter((d) => d !== "").map(Number);
  if (shape.some((d) => !Number.isSafeInteger(d) || d < 0)) throw bad(`shape (${dims})`);
  const n = elements(shape);
  const body = b.byteLength - start - hlen;
  if (unicode !== null) {
    const width = Number(unicode[1]);
    if (width < 1 || width > MAX_UNICODE_LEN) throw bad(`dtype ${descr}: an element of ${width} code points`);
    if (n * 4 * width !== body) throw bad(`shape (${dims}) of ${descr} does not match ${body} bytes of data`);
    return { type: "string", shape, data: unicodeStrings(b.subarray(start + hlen), n, width, bad) };
  }
  if (n * ELEM_SIZE[type!] !== body) throw bad(`shape (${dims}) does not match ${body} bytes of data`);
  return { type: type!, shape, data: copyBytes(b.subarray(start + hlen)) };
}

/**
 * The values of a tensor: Float32Array, Float64Array, Int32Array, Int16Array, Int8Array,
 * Uint32Array, Uint16Array or Uint8Array for those types; float16 and bfloat16 as a
 * Float32Array (exact); int64 and uint64 as a number array (exact up to 2^53, never
 * bigints); bool as booleans; string as strings (a copy).
 */
export function tensorValues(
  t: Tensor,
): Float32Array | Float64Array | Int32Array | Int16Array | Int8Array | Uint32Array | Uint16Array | Uint8Array | number[] | boolean[] | string[] {
  if (t.type === "string") return [...t.data];
  const size = ELEM_SIZE[t.type];
  if (size === undefined) throw new OrtbusError("internal", `unknown tensor type ${String(t.type)}`);
  const n = Math.floor(t.data.byteLength / size);
  const dv = new DataView(t.data.buffer, t.data.byteOffset, t.data.byteLength);
  switch (t.type) {
    case "float32": {
      const out = new Float32Array(n);
      for (let i = 0; i < n; i++) out[i] = dv.getFloat32(4 * i, true);
      return out;
    }
    case "float64": {
      const out = new Float64Array(n);
      for (let i = 0; i < n; i++) out[i] = dv.getFloat64(8 * i, true);
      return out;
    }
    case "int64": {
      const out: number[] = new Array(n);
      for (let i = 0; i < n; i++) out[i] = Number(dv.getBigInt64(8 * i, true));
      return out;
    }
    case "int32": {
      const out = new Int32Array(n);
      for (let i = 0; i < n; i++) out[i] = dv.getInt32(4 * i, true);
      return out;
    }
    case "float16":
    case "bfloat16": {
      const out = new Float32Array(n);
      const f = t.type === "float16" ? float16Value : bfloat16Value;
      for (let i = 0; i < n; i++) out[i] = f(dv.getUint16(2 * i, true));
      return out;
    }
    case "int16": {
      const out = new Int16Array(n);
      for (let i = 0; i < n; i++) out[i] = dv.getInt16(2 * i, true);
      return out;
    }
    case "int8":
      return new Int8Array(copyBytes(t.data).buffer, 0, n);
    case "uint64": {
      const out: number[] = new Array(n);
      for (let i = 0; i < n; i++) out[i] = Number(dv.getBigUint64(8 * i, true));
      return out;
    }
    case "uint32": {
      const out = new Uint32Array(n);
      for (let i = 0; i < n; i++) out[i] = dv.getUint32(4 * i, true);
      return out;
    }
    case "uint16": {
      const out = new Uint16Array(n);
      for (let i = 0; i < n; i++) out[i] = dv.getUint16(2 * i, true);
      return out;
    }
    case "uint8":
      return copyBytes(t.data);
    case "bool":
      return Array.from(t.data, (b) => b !== 0);
  }
}
