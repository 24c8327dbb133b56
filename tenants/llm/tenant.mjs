// tenant.mjs: a real LLM engine as a tenant of the device ortbus shares: llama.cpp
// through node-llama-cpp (tenants/llm/package-lock.json pins 3.21.1; its prebuilt CPU and
// Vulkan binaries), serving a GGUF model (`ortbus models gen-llm`) to requests read from
// stdin, reporting each as a JSON line on stdout. internal/llmtenant runs it from Go.
//
//   node tenants/llm/tenant.mjs -modules DIR -model FILE.gguf [-gpu cpu|vulkan|cuda]
//        [-threads 1] [-ctx 512] [-mmap] [-max-line 65536] [-max-queue 64]
//   node tenants/llm/tenant.mjs -modules DIR -check [-gpu cpu|vulkan|cuda]
//
// -modules is the node_modules holding node-llama-cpp (scripts/fetch-llm-tenant.sh
// installs it into .deps/llm-tenant/node_modules). -gpu cpu (the default) runs on the
// CPU with -threads threads; vulkan and cuda offload every layer to that backend (its
// prebuilt binary must be installed: the Makefile's llm-tenant installs the CPU and the
// Vulkan ones). Binaries are never built nor downloaded: a missing one is an error.
// -check loads the backend alone, prints one "check" event ({build, gpu, node_llama_cpp,
// llama_cpp}) and exits 0 (1 with an error event when it does not load): the install
// script's test that the prebuilt binary is what runs.
// Without -mmap the weights are read into the process's own memory (as a GPU engine holds
// them in device memory), so unloading really gives them back; with -mmap they are
// mapped from the file. Run it with MALLOC_MMAP_THRESHOLD_=131072 in its environment
// (internal/llmtenant does; the tenant warns on stderr without it): glibc otherwise
// raises its mmap threshold to each large block freed, a reloaded model then lives on
// its heap, and the next unload gives nothing back to the system.
//
// Input, one JSON object a line (a line over -max-line bytes, a line that is no JSON
// object, an unknown op: an "error" event, and the tenant goes on):
//   {"op":"generate","id":"r1","prompt":"text","max_tokens":32,"ignore_eos":true}
//   {"op":"free"}      unload the model and its context   (also SIGUSR1)
//   {"op":"resume"}    load them again                    (also SIGUSR2)
//   {"op":"stop"}      unload and exit 0 once the operations before it are done (also
//                      end of stdin); SIGTERM and SIGINT likewise, but they stop the
//                      requests before them at their next token (stop "stopped")
// Operations run one at a time, in arrival order (signals included); at most -max-queue
// wait, beyond that a request is refused ("busy"). A free stops the requests before it
// (the one running and those waiting) at their next token, their events saying stop
// "freed", so memory is given back soon. Operations after a stop are dropped (a request
// with an error "stopping").
//
// Output, one JSON object a line, "event" naming it:
//   ready    {load_ms, rss_bytes, model_bytes, context_size, threads, gpu, build, vram_used_bytes,
//             node_llama_cpp, node, pid}                  the model is loaded, requests are served
//   request  {id, prompt_tokens, tokens, first_token_ms, total_ms, tokens_per_s, stop, output}
//            stop: max_tokens, eos, freed, stopped; output: the generated token ids
//   freed    {free_ms, rss_before_bytes, rss_bytes, vram_used_bytes}
//   resumed  {load_ms, rss_bytes, vram_used_bytes}
//   error    {id?, code, message}   code: line_too_long bad_json bad_request unknown_op busy
//                                   unloaded too_long stopping load_failed internal
//   exit     {reason, status}    the last line: reason stop, stdin closed, SIGTERM, SIGINT, usage, load_failed; status the exit status
//
// Figures of a request: first_token_ms from the request's turn (it left the queue) to its
// first generated token (tokenizing and the prompt's evaluation included); total_ms to
// its last; tokens_per_s the decode rate, (tokens - 1) / (last - first token time), 0 for
// a single token. Sampling is greedy (temperature 0): the same prompt on the same model
// gives the same output. The model is random (models/gguf), so it emits EOS at random:
// with ignore_eos (the default) EOS is never sampled (its logit is masked), so each
// request does exactly max_tokens of work, the fixed load a bench needs; with
// ignore_eos false an EOS ends the request (stop "eos"). max_tokens is 1..4096 and the
// prompt (BOS and one token a byte) plus max_tokens must fit the context.
//
// Memory figures are the process's resident set (process.memoryUsage().rss) and, with a
// GPU, the backend's used VRAM (llama.getVramState().used); 0 on the CPU.
//
// llama.cpp's and node-llama-cpp's own messages go to stderr; stdout carries only events.
import { readFileSync } from "node:fs";
import { createRequire } from "node:module";
import { join, resolve } from "node:path";
import { pathToFileURL } from "node:url";

const MAX_TOKENS = 4096;

function parseArgs(argv) {
  const a = { gpu: "cpu", threads: 1, ctx: 512, mmap: false, maxLine: 65536, maxQueue: 64 };
  const num = (k, v, lo, hi) => {
    const n = Number(v);
    if (!Number.isInteger(n) || n < lo || n > hi) throw new Error(`${k} must be an integer in ${lo}..${hi}, got ${v}`);
    return n;
  };
  for (let i = 0; i < argv.length; i++) {
    const k = argv[i];
    if (k === "-mmap") { a.mmap = true; continue; }
    if (k === "-check") { a.check = true; continue; }
    const v = argv[++i];
    if (v === undefined) throw new Error(`flag ${k} has no value`);
    switch (k) {
      case "-modules": a.modules = v; break;
      case "-model": a.model = v; break;
      case "-gpu":
        if (!["cpu", "vulkan", "cuda"].includes(v)) throw new Error(`-gpu must be cpu, vulkan or cuda, got ${v}`);
        a.gpu = v; break;
      case "-threads": a.threads = num(k, v, 1, 256); break;
      case "-ctx": a.ctx = num(k, v, 16, 1 << 20); break;
      case "-max-line": a.maxLine = num(k, v, 64, 16 << 20); break;
      case "-max-queue": a.maxQueue = num(k, v, 1, 1 << 16); break;
      default: throw new Error(`unknown flag ${k}`);
    }
  }
  if (!a.modules || (!a.model && !a.check)) throw new Error("usage: tenant.mjs -modules DIR (-model FILE.gguf | -check) [-gpu cpu|vulkan|cuda] [-threads N] [-ctx N] [-mmap] [-max-line N] [-max-queue N]");
  return a;
}

function emit(event, fields) {
  process.stdout.write(JSON.stringify({ event, ...fields }) + "\n");
}

const ms = (t0) => Math.round((performance.now() - t0) * 1000) / 1000;
const rss = () => process.memoryUsage().rss;

// Engine owns llama.cpp's state: the backend (kept for the process's life), and the model
// and its context (loaded, or freed).
class Engine {
  constructor(lib, llama, args) {
    this.lib = lib; this.llama = llama; this.args = args;
    this.model = null; this.context = null; this.sequence = null;
  }

  get loaded() { return this.model !== null; }

  async vramUsed() {
    if (this.args.gpu === "cpu") return 0;
    return (await this.llama.getVramState()).used;
  }

  async load() {
    const t0 = performance.now();
    this.model = await this.llama.loadModel({
      modelPath: this.args.model, useMmap: this.args.mmap,
      gpuLayers: this.args.gpu === "cpu" ? 0 : "max",
    });
    this.context = await this.model.createContext({ contextSize: this.args.ctx, threads: this.args.threads, sequences: 1 });
    this.sequence = this.context.getSequence();
    this.eosBias = new this.lib.TokenBias(this.model.tokenizer).set(this.model.tokens.eos, "never");
    return ms(t0);
  }

  async free() {
    const t0 = performance.now();
    const before = rss();
    await this.context?.dispose();
    await this.model?.dispose();
    this.model = this.context = this.sequence = this.eosBias = null;
    return { free_ms: ms(t0), rss_before_bytes: before, rss_bytes: rss(), vram_used_bytes: await this.vramUsed() };
  }

  // generate runs one checked request and returns its figures; it stops at the next token
  // once interrupted() names a reason.
  async generate(req, interrupted) {
    const t0 = performance.now();
    const model = this.model;
    const prompt = [model.tokens.bos, ...model.tokenize(req.prompt)];
    if (prompt.length + req.max_tokens > this.context.contextSize) {
      throw new RequestError("too_long", `prompt of ${prompt.length} tokens and max_tokens ${req.max_tokens} exceed the context of ${this.context.contextSize}`);
    }
    await this.sequence.clearHistory();
    const opts = { temperature: 0 };
    if (req.ignore_eos) opts.tokenBias = this.eosBias;
    const output = [];
    let first = 0, last = 0, stop = "max_tokens";
    for await (const tok of this.sequence.evaluate(prompt, opts)) {
      last = performance.now();
      if (output.length === 0) first = last;
      if (tok === model.tokens.eos && !req.ignore_eos) { stop = "eos"; break; }
      output.push(tok);
      if (output.length >= req.max_tokens) break;
      const why = interrupted();
      if (why) { stop = why; break; }
    }
    const n = output.length;
    return {
      id: req.id, prompt_tokens: prompt.length, tokens: n,
      first_token_ms: first ? round3(first - t0) : 0, total_ms: last ? round3(last - t0) : 0,
      tokens_per_s: n > 1 ? round3((n - 1) / ((last - first) / 1000)) : 0, stop, output,
    };
  }
}

const round3 = (x) => Math.round(x * 1000) / 1000;

class RequestError extends Error {
  constructor(code, message) { super(message); this.code = code; }
}

// requestID is m's id when it is one a request may carry, for its error event.
function requestID(m) {
  return typeof m?.id === "string" && m.id.length <= 256 ? m.id : undefined;
}

// checkGenerate validates a generate request's fields, or throws a RequestError.
function checkGenerate(m) {
  const id = m.id === undefined ? "" : m.id;
  if (typeof id !== "string" || id.length > 256) throw new RequestError("bad_request", "id must be a string of at most 256 characters");
  if (typeof m.prompt !== "string") throw new RequestError("bad_request", "prompt must be a string");
  const max = m.max_tokens === undefined ? 32 : m.max_tokens;
  if (!Number.isInteger(max) || max < 1 || max > MAX_TOKENS) throw new RequestError("bad_request", `max_tokens must be an integer in 1..${MAX_TOKENS}`);
  const ignoreEos = m.ignore_eos === undefined ? true : m.ignore_eos;
  if (typeof ignoreEos !== "boolean") throw new RequestError("bad_request", "ignore_eos must be a boolean");
  return { id, prompt: m.prompt, max_tokens: max, ignore_eos: ignoreEos };
}

// Tenant runs the operations one at a time, in arrival order.
class Tenant {
  constructor(engine, args) {
    this.engine = engine; this.args = args;
    this.chain = Promise.resolve(); this.waiting = 0; this.frees = 0;
    this.stopping = false; // a stop is queued: later operations are dropped
    this.interrupting = false; // a stop by signal: requests stop at their next token
  }

  // enqueue queues op; a generate beyond -max-queue waiting operations is refused.
  enqueue(op, m) {
    if (op === "stop" && m.interrupt) this.interrupting = true;
    if (this.stopping) {
      if (op === "generate") emit("error", { id: requestID(m), code: "stopping", message: "the tenant is stopping" });
      return;
    }
    if (op === "generate" && this.waiting >= this.args.maxQueue) {
      emit("error", { id: requestID(m), code: "busy", message: `${this.waiting} operations are waiting (-max-queue ${this.args.maxQueue})` });
      return;
    }
    if (op === "free") this.frees++; // a request running or waiting before it stops at its next token
    if (op === "stop") this.stopping = true;
    this.waiting++;
    this.chain = this.chain.then(async () => {
      this.waiting--;
      try {
        await this.run(op, m);
      } catch (e) {
        emit("error", { id: requestID(m), code: e.code || "internal", message: String(e?.message || e) });
      }
    });
  }

  async run(op, m) {
    const e = this.engine;
    switch (op) {
      case "generate": {
        const req = checkGenerate(m);
        if (!e.loaded) throw new RequestError("unloaded", "the model is freed: resume first");
        emit("request", await e.generate(req, () => (this.frees > 0 ? "freed" : this.interrupting ? "stopped" : "")));
        return;
      }
      case "free":
        this.frees--;
        if (e.loaded) emit("freed", await e.free());
        else emit("freed", { free_ms: 0, rss_before_bytes: rss(), rss_bytes: rss(), vram_used_bytes: await e.vramUsed() });
        return;
      case "resume": {
        const load_ms = e.loaded ? 0 : await e.load();
        emit("resumed", { load_ms, rss_bytes: rss(), vram_used_bytes: await e.vramUsed() });
        return;
      }
      case "stop":
        if (e.loaded) await e.free();
        emit("exit", { reason: m.reason, status: 0 });
        process.exit(0);
    }
  }
}

// readLines calls onLine with each line of stdin (without its newline), and onLong once
// for each line longer than maxLine, whose bytes are dropped up to its end: memory stays
// within maxLine whatever arrives.
function readLines(maxLine, onLine, onLong, onEnd) {
  let parts = [], size = 0, skipping = false;
  process.stdin.on("data", (chunk) => {
    let start = 0;
    while (start < chunk.length) {
      const nl = chunk.indexOf(10, start);
      const end = nl < 0 ? chunk.length : nl;
      if (!skipping) {
        size += end - start;
        if (size > maxLine) { skipping = true; parts = []; onLong(); }
        else parts.push(chunk.subarray(start, end));
      }
      if (nl < 0) break;
      if (!skipping) onLine(Buffer.concat(parts).toString("utf8"));
      parts = []; size = 0; skipping = false;
      start = nl + 1;
    }
  });
  process.stdin.on("end", onEnd);
}

function onLine(tenant, line) {
  if (line.trim() === "") return;
  let m;
  try { m = JSON.parse(line); } catch (e) {
    emit("error", { code: "bad_json", message: String(e.message).slice(0, 200) });
    return;
  }
  if (m === null || typeof m !== "object" || Array.isArray(m)) {
    emit("error", { code: "bad_json", message: "a line must be a JSON object" });
    return;
  }
  if (!["generate", "free", "resume", "stop"].includes(m.op)) {
    emit("error", { id: requestID(m), code: "unknown_op", message: `op must be generate, free, resume or stop` });
    return;
  }
  tenant.enqueue(m.op, m.op === "stop" ? { reason: "stop" } : m);
}

async function main() {
  let args;
  try { args = parseArgs(process.argv.slice(2)); } catch (e) {
    emit("error", { code: "bad_request", message: e.message });
    emit("exit", { reason: "usage", status: 2 });
    process.exit(2);
  }
  process.stdout.on("error", () => process.exit(1)); // the reader is gone: nobody to report to
  if (!process.env.MALLOC_MMAP_THRESHOLD_) {
    process.stderr.write("tenant: MALLOC_MMAP_THRESHOLD_ is not set: a free after a resume may give no memory back (see the header of tenant.mjs)\n");
  }
  if (args.check) return check(args);
  const t0 = performance.now();
  const tenant = new Tenant(null, args);
  // The handlers are in place before the load: a signal that arrives during it waits its
  // turn instead of ending the process (SIGUSR2's default) or opening the inspector
  // (SIGUSR1's).
  process.on("SIGUSR1", () => tenant.enqueue("free", {}));
  process.on("SIGUSR2", () => tenant.enqueue("resume", {}));
  for (const sig of ["SIGTERM", "SIGINT"]) process.on(sig, () => tenant.enqueue("stop", { reason: sig, interrupt: true }));
  // stdin is read once the model is loaded: the first line out is ready (or the load's
  // error), and lines sent before wait in the pipe.
  tenant.chain = start(args, t0).then((engine) => {
    tenant.engine = engine;
    readLines(args.maxLine, (line) => onLine(tenant, line),
      () => emit("error", { code: "line_too_long", message: `a line over ${args.maxLine} bytes was dropped` }),
      () => tenant.enqueue("stop", { reason: "stdin closed" }));
  });
}

// start loads node-llama-cpp from -modules, its prebuilt backend and the model, and
// reports ready; a failure is reported and ends the process (exit 1).
async function start(args, t0) {
  let engine;
  try {
    const { lib, llama } = await backend(args);
    engine = new Engine(lib, llama, args);
    await engine.load();
  } catch (e) {
    failed(e);
  }
  emit("ready", {
    load_ms: ms(t0), rss_bytes: rss(), model_bytes: engine.model.size, context_size: engine.context.contextSize,
    threads: args.threads, gpu: args.gpu, build: engine.llama.buildType, vram_used_bytes: await engine.vramUsed(),
    node_llama_cpp: packageVersion(args), node: process.version, pid: process.pid,
  });
  return engine;
}

// backend imports node-llama-cpp from -modules and loads its prebuilt llama.cpp binary
// for -gpu (never a build, never a download).
async function backend(args) {
  const require = createRequire(resolve(args.modules, "noop.js"));
  const lib = await import(pathToFileURL(require.resolve("node-llama-cpp")).href);
  const llama = await lib.getLlama({
    gpu: args.gpu === "cpu" ? false : args.gpu, build: "never", skipDownload: true, usePrebuiltBinaries: true,
    progressLogs: "stderr", maxThreads: args.threads, logLevel: "warn",
    logger: (level, message) => process.stderr.write(`[llama.cpp ${level}] ${message}\n`),
  });
  return { lib, llama };
}

function packageVersion(args) {
  return JSON.parse(readFileSync(join(args.modules, "node-llama-cpp", "package.json"), "utf8")).version;
}

// failed reports a load failure and ends the process.
function failed(e) {
  emit("error", { code: "load_failed", message: String(e?.message || e) });
  emit("exit", { reason: "load_failed", status: 1 });
  process.exit(1);
}

// check is -check: the backend alone, reported.
async function check(args) {
  try {
    const { llama } = await backend(args);
    emit("check", { build: llama.buildType, gpu: llama.gpu || "cpu", node_llama_cpp: packageVersion(args), llama_cpp: llama.llamaCppRelease.release });
    await llama.dispose();
  } catch (e) {
    failed(e);
  }
  process.exit(0);
}

main();
