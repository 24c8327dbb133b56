// throughput.mjs: the onnxruntime-node baseline of `ortbus bench throughput`, one chunk.
//
// Run by the bench under Bun (as the app runs it; node also works):
//
//   bun bench/node/throughput.mjs -modules DIR -model M.onnx -input NAME=X.npy \
//       -threads N -spin default|off [-ep cpu|webgpu] -warm MS -duration MS
//
// It loads onnxruntime-node from DIR (the node_modules that scripts/fetch-node-bench.sh
// installs into .deps/node-bench), opens M.onnx with N intra-op threads, one inter-op
// thread and sequential execution, ONNX Runtime's idle spinning at its default or off
// (session.intra_op.allow_spinning / session.inter_op.allow_spinning = "0"), reads the
// float32 .npy the Go side wrote (the same tensor its in-process loop feeds), runs the
// model one item at a time for -warm ms (not counted), then counts the items for
// -duration ms, and prints one JSON line:
//
//   {"items":N,"seconds":S,"cpu_s":C,"warm_items":W,"load_s":L,"runtime":"bun 1.4.5",
//    "onnxruntime_node":"1.30.0","threads":N,"spin":"default","ep":"cpu"}
//
// -ep webgpu creates the session with executionProviders: ['webgpu'] alone (ONNX Runtime's
// WebGPU EP: Dawn over Vulkan on Linux; session creation fails rather than fall back when
// it has no adapter), and makes one call before the -warm ms, timed apart ("first_ms"):
// the first run compiles the EP's shaders, which the warm-up pays before anything is
// counted.
//
// Each item is what an app's call is: a new ort.Tensor over the input's data and one
// `await session.run(feeds)` (every output fetched).
import { readFileSync } from "node:fs";
import { createRequire } from "node:module";
import { join } from "node:path";

function parseArgs(argv) {
  const a = { threads: 1, spin: "default", ep: "cpu", warm: 500, duration: 1000, inputs: [] };
  for (let i = 0; i < argv.length; i += 2) {
    const k = argv[i], v = argv[i + 1];
    if (v === undefined) throw new Error(`flag ${k} has no value`);
    switch (k) {
      case "-modules": a.modules = v; break;
      case "-model": a.model = v; break;
      case "-input": {
        const eq = v.indexOf("=");
        if (eq <= 0) throw new Error(`-input ${v}: want NAME=FILE.npy`);
        a.inputs.push([v.slice(0, eq), v.slice(eq + 1)]);
        break;
      }
      case "-threads": a.threads = Number(v); break;
      case "-spin": a.spin = v; break;
      case "-ep": a.ep = v; break;
      case "-warm": a.warm = Number(v); break;
      case "-duration": a.duration = Number(v); break;
      default: throw new Error(`unknown flag ${k}`);
    }
  }
  if (!a.modules || !a.model || a.inputs.length === 0) throw new Error("-modules, -model and -input are required");
  if (a.spin !== "default" && a.spin !== "off") throw new Error(`-spin ${a.spin}: want default or off`);
  if (!(a.threads >= 1)) throw new Error(`-threads ${a.threads}`);
  if (a.ep !== "cpu" && a.ep !== "webgpu") throw new Error(`-ep ${a.ep}: want cpu or webgpu`);
  return a;
}

// readNPY reads a little-endian float32 .npy file (format 1.0, 2.0 or 3.0, C order).
function readNPY(path) {
  const b = readFileSync(path);
  if (b.length < 10 || b.toString("latin1", 0, 6) !== "\x93NUMPY") throw new Error(`${path}: not a .npy file`);
  const major = b[6];
  const hlen = major === 1 ? b.readUInt16LE(8) : b.readUInt32LE(8);
  const start = (major === 1 ? 10 : 12) + hlen;
  const header = b.toString("latin1", major === 1 ? 10 : 12, start);
  const descr = /'descr':\s*'([^']*)'/.exec(header);
  if (!descr || descr[1] !== "<f4") throw new Error(`${path}: dtype ${descr && descr[1]}, want <f4`);
  if (/'fortran_order':\s*True/.test(header)) throw new Error(`${path}: Fortran order`);
  const shapeM = /'shape':\s*\(([^)]*)\)/.exec(header);
  if (!shapeM) throw new Error(`${path}: no shape in header`);
  const shape = shapeM[1].split(",").map((s) => s.trim()).filter((s) => s !== "").map(Number);
  const n = shape.reduce((x, y) => x * y, 1);
  if (b.length - start !== 4 * n) throw new Error(`${path}: ${b.length - start} data bytes for shape [${shape}]`);
  // A copy: the file's bytes need not sit at a multiple of 4 in their buffer.
  const data = new Float32Array(n);
  new Uint8Array(data.buffer).set(b.subarray(start));
  return { data, shape };
}

const args = parseArgs(process.argv.slice(2));
const require = createRequire(join(args.modules, "noop.js"));
const ort = require("onnxruntime-node");

const opts = {
  intraOpNumThreads: args.threads,
  interOpNumThreads: 1,
  executionMode: "sequential",
};
if (args.ep !== "cpu") {
  opts.executionProviders = [args.ep];
}
if (args.spin === "off") {
  opts.extra = { session: { intra_op: { allow_spinning: "0" }, inter_op: { allow_spinning: "0" } } };
}

const inputs = args.inputs.map(([name, file]) => [name, readNPY(file)]);
const t0 = performance.now();
const session = await ort.InferenceSession.create(args.model, opts);
const loadS = (performance.now() - t0) / 1000;

async function one() {
  const feeds = {};
  for (const [name, x] of inputs) feeds[name] = new ort.Tensor("float32", x.data, x.shape);
  const out = await session.run(feeds);
  for (const k in out) out[k].dispose?.();
}

let warmItems = 0;
let firstMS;
if (args.ep !== "cpu") {
  const f0 = performance.now();
  await one();
  firstMS = performance.now() - f0;
  warmItems++;
}
for (const w0 = performance.now(); performance.now() - w0 < args.warm; warmItems++) await one();
let items = 0;
const c0 = process.cpuUsage();
const m0 = performance.now();
while (performance.now() - m0 < args.duration) {
  await one();
  items++;
}
const seconds = (performance.now() - m0) / 1000;
const cpu = process.cpuUsage(c0);
await session.release?.();

const runtime = typeof Bun !== "undefined" ? `bun ${Bun.version}` : `node ${process.versions.node}`;
console.log(JSON.stringify({
  items, seconds, cpu_s: (cpu.user + cpu.system) / 1e6, warm_items: warmItems, load_s: loadS, runtime,
  onnxruntime_node: ort.env?.versions?.node ?? "", threads: args.threads, spin: args.spin, ep: args.ep,
  ...(firstMS === undefined ? {} : { first_ms: firstMS }),
}));
