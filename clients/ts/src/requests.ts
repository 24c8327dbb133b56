// Requests: one function per op of the client API that is not a job or a lease (tag,
// embed, compare, detect, segment, infer; cancel, status, health): the wire request built
// from the call's arguments, and the reply as the call returns it. OrtbusClient's methods
// of the same names call them.

import type { Connection } from "./connection.ts";
import type {
  CancelReply,
  CompareReply,
  DetectReply,
  EmbedReply,
  HealthReply,
  InferReply,
  SegmentReply,
  StatusReply,
  TagReply,
  Tensor,
} from "./messages.ts";
import type { CallOptions, DetectOptions, InferOptions, SegmentOptions, TagOptions } from "./options.ts";
import { float32Bytes, float32FromBytes, tensorBytes } from "./tensors.ts";
import type { FloatVector, TensorInput } from "./tensors.ts";
import { copyBytes } from "./wire.ts";
import type { WireRequest } from "./wire.ts";

/** What a call needs of the connection: an inference request (request) or another (send). */
export type Sender = Pick<Connection, "request" | "send">;

export function tag(c: Sender, path: string, opts: TagOptions): Promise<TagReply> {
  const req: WireRequest = { path };
  if (opts.thresholds) req.thresholds = { ...opts.thresholds };
  return c.request<TagReply>("tag", req, opts).then(normTag);
}

export async function embed(c: Sender, path: string, opts: CallOptions): Promise<EmbedReply> {
  const r = await c.request<Omit<EmbedReply, "embedding"> & { embedding: unknown }>("embed", { path }, opts);
  return { ...r, embedding: float32FromBytes(r.embedding) };
}

export async function compare(c: Sender, feature: FloatVector, candidates: FloatVector[], opts: CallOptions): Promise<CompareReply> {
  const req: WireRequest = { feature: float32Bytes(feature), candidates: candidates.map(float32Bytes) };
  const r = await c.request<CompareReply>("compare", req, opts);
  return { ...r, differences: (r.differences ?? []).map(Number), same: r.same ?? [] };
}

export function detect(c: Sender, path: string, opts: DetectOptions): Promise<DetectReply> {
  const req: WireRequest = { path };
  if (opts.conf !== undefined) req.conf = opts.conf;
  if (opts.iou !== undefined) req.iou = opts.iou;
  return c.request<DetectReply>("detect", req, opts).then((r) => ({ ...r, boxes: r.boxes ?? [] }));
}

export function segment(c: Sender, path: string, opts: SegmentOptions): Promise<SegmentReply> {
  const req: WireRequest = { path };
  if (opts.outPath !== undefined) req.out_path = opts.outPath;
  return c.request<SegmentReply>("segment", req, opts);
}

export async function infer(c: Sender, inputs: Record<string, TensorInput>, opts: InferOptions): Promise<InferReply> {
  const wire: Record<string, Tensor> = {};
  for (const [k, v] of Object.entries(inputs)) wire[k] = tensorBytes(v);
  const req: WireRequest = {};
  if (Object.keys(wire).length > 0) req.inputs = wire;
  if (opts.outputs) req.outputs = [...opts.outputs];
  if (opts.inputPaths) req.input_paths = { ...opts.inputPaths };
  if (opts.outputDir !== undefined) req.output_dir = opts.outputDir;
  if (opts.outputPaths) req.output_paths = { ...opts.outputPaths };
  const r = await c.request<InferReply>("infer", req, opts);
  const outputs: Record<string, Tensor> = {};
  for (const [k, t] of Object.entries(r.outputs ?? {})) {
    const shape = (t.shape ?? []).map(Number);
    if (t.type === "string") {
      outputs[k] = { type: "string", shape, data: Array.isArray(t.data) ? t.data.map(String) : [] };
      continue;
    }
    outputs[k] = { type: t.type, shape, data: t.data instanceof Uint8Array ? copyBytes(t.data) : new Uint8Array(0) };
  }
  return { ...r, outputs };
}

export function cancel(c: Sender, id: string, opts: Pick<CallOptions, "timeoutMs" | "signal">): Promise<CancelReply> {
  return c.send<CancelReply>("cancel", { id }, id, opts);
}

export function status(c: Sender, opts: Pick<CallOptions, "timeoutMs" | "signal">): Promise<StatusReply> {
  return c.send<StatusReply>("status", {}, undefined, opts);
}

export function health(c: Sender, opts: Pick<CallOptions, "timeoutMs" | "signal">): Promise<HealthReply> {
  return c.send<HealthReply>("health", {}, undefined, opts);
}

/** A tag reply with every map and list present (empty when the gateway left it out). */
export function normTag(r: TagReply): TagReply {
  return {
    ...r,
    general: r.general ?? {},
    character: r.character ?? {},
    rating: r.rating ?? {},
    ips: r.ips ?? [],
    ips_mapping: r.ips_mapping ?? {},
  };
}
