// library.mjs: the Bun user's alternative in `ortbus bench library`: sharp + onnxruntime-node
// in one process.
//
//   bun bench/node/library.mjs -modules DIR -list FILES.txt -tagger T.onnx -tagger-size 448 \
//       -ccip C.onnx -ccip-size 384 -inflight 2 -threads 1 -prep-reps R
//
// It loads sharp and onnxruntime-node from DIR (.deps/node-bench/node_modules), sets sharp
// to one thread (sharp.concurrency(1)) with libvips's operation cache off (as ortbus's
// workers run it), opens both models with -threads intra-op threads, and then:
//
//  1. run: a tag pass over every file of the list, then an embed pass, -inflight files in
//     flight; an item is the file read, sharp's preprocessing and one session.run;
//  2. prep: each file preprocessed for the tagger alone, one at a time, -prep-reps times
//     (per-file milliseconds, for the bench's preprocessing table).
//
// Preprocessing is the models' (models/tagger.go, models/ccip.go): EXIF orientation applied
// (.rotate()), resized to exactly the model's square (fit "fill", Lanczos 3, shrink on
// load), alpha flattened on white, sRGB, 8 bits; then RGB NCHW float32: the tagger
// (x/255-0.5)/0.5, CCIP (x/255-mean)/std with CLIP's statistics.
//
// It prints one JSON line: {"items","errors":[...],"seconds","cpu_s","prep":[{"path","ms":[..]}],
// "runtime","sharp","vips","onnxruntime_node","threads","inflight"}.
import { readFileSync } from "node:fs";
import { readFile } from "node:fs/promises";
import { createRequire } from "node:module";
import { join } from "node:path";

function parseArgs(argv) {
  const a = { threads: 1, inflight: 2, prepReps: 3 };
  for (let i = 0; i < argv.length; i += 2) {
    const k = argv[i], v = argv[i + 1];
    if (v === undefined) throw new Error(`flag ${k} has no value`);
    switch (k) {
      case "-modules": a.modules = v; break;
      case "-list": a.list = v; break;
      case "-tagger": a.tagger = v; break;
      case "-tagger-size": a.taggerSize = Number(v); break;
      case "-ccip": a.ccip = v; break;
      case "-ccip-size": a.ccipSize = Number(v); break;
      case "-inflight": a.inflight = Number(v); break;
      case "-threads": a.threads = Number(v); break;
      case "-prep-reps": a.prepReps = Number(v); break;
      default: throw new Error(`unknown flag ${k}`);
    }
  }
  for (const k of ["modules", "list", "tagger", "taggerSize", "ccip", "ccipSize"]) {
    if (!a[k]) throw new Error(`-${k} is required`);
  }
  return a;
}

const args = parseArgs(process.argv.slice(2));
const require = createRequire(join(args.modules, "noop.js"));
const ort = require("onnxruntime-node");
const sharp = require("sharp");
sharp.concurrency(1);
sharp.cache(false);

const files = readFileSync(args.list, "utf8").split("\n").filter((l) => l !== "");
const opts = { intraOpNumThreads: args.threads, interOpNumThreads: 1, executionMode: "sequential" };
const half = { mean: [0.5, 0.5, 0.5], std: [0.5, 0.5, 0.5] };
const clip = { mean: [0.48145466, 0.4578275, 0.40821073], std: [0.26862954, 0.2613026, 0.2757771] };

async function model(path, size, norm) {
  const session = await ort.InferenceSession.create(path, opts);
  return { session, size, norm, input: session.inputNames[0] };
}

// prep is the file's tensor for m: sharp's pixels, then the model's normalisation.
async function prep(path, m) {
  const buf = await readFile(path);
  const { data } = await sharp(buf, { failOn: "none" })
    .rotate()
    .resize(m.size, m.size, { fit: "fill", kernel: "lanczos3" })
    .flatten({ background: "#ffffff" })
    .toColourspace("srgb")
    .removeAlpha()
    .raw({ depth: "uchar" })
    .toBuffer({ resolveWithObject: true });
  const hw = m.size * m.size;
  if (data.length !== 3 * hw) throw new Error(`${path}: ${data.length} bytes of pixels, want ${3 * hw}`);
  const x = new Float32Array(3 * hw);
  for (let c = 0; c < 3; c++) {
    const s = 1 / (255 * m.norm.std[c]), o = m.norm.mean[c] / m.norm.std[c];
    for (let i = 0; i < hw; i++) x[c * hw + i] = data[3 * i + c] * s - o;
  }
  return new ort.Tensor("float32", x, [1, 3, m.size, m.size]);
}

async function item(path, m) {
  const out = await m.session.run({ [m.input]: await prep(path, m) });
  for (const k in out) out[k].dispose?.();
}

// pass runs every file through m, inflight at a time.
async function pass(m, errors) {
  let next = 0, items = 0;
  async function lane() {
    while (next < files.length) {
      const f = files[next++];
      try {
        await item(f, m);
        items++;
      } catch (e) {
        errors.push({ path: f, error: String(e && e.message || e) });
      }
    }
  }
  await Promise.all(Array.from({ length: Math.max(1, args.inflight) }, lane));
  return items;
}

const tagger = await model(args.tagger, args.taggerSize, half);
const ccip = await model(args.ccip, args.ccipSize, clip);
// Warm-up (not counted): one item of each model.
await item(files[0], tagger);
await item(files[0], ccip);

const errors = [];
const c0 = process.cpuUsage();
const t0 = performance.now();
let items = await pass(tagger, errors);
items += await pass(ccip, errors);
const seconds = (performance.now() - t0) / 1000;
const cpu = process.cpuUsage(c0);

const prepTimes = files.map((path) => ({ path, ms: [] }));
for (let r = 0; r < args.prepReps; r++) {
  for (const p of prepTimes) {
    const s = performance.now();
    try {
      await prep(p.path, tagger);
      p.ms.push(performance.now() - s);
    } catch (e) {
      // counted in the run's errors already
    }
  }
}

const runtime = typeof Bun !== "undefined" ? `bun ${Bun.version}` : `node ${process.versions.node}`;
console.log(JSON.stringify({
  items, errors, seconds, cpu_s: (cpu.user + cpu.system) / 1e6, prep: prepTimes, runtime,
  sharp: sharp.versions.sharp, vips: sharp.versions.vips, onnxruntime_node: ort.env?.versions?.node ?? "",
  threads: args.threads, inflight: args.inflight,
}));
