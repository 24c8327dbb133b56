// @ortbus/client: the TypeScript client of ortbus (ONNX Runtime inference routed over NATS
// to resident worker processes), and OrtbusAiClient, a drop-in for an app's in-process AI
// client. ESM, typed, no build step: Bun (and any runtime that strips types) imports this
// file directly.
//
// Wire contract (docs/PROTOCOL.md): requests are msgpack maps sent to `ortbus.v1.<op>`;
// replies are msgpack maps; an error reply carries the headers Nats-Service-Error-Code /
// Nats-Service-Error and a body {code, message, details} whose `code` is one of
// ORTBUS_ERROR_CODES. Float vectors travel as msgpack bin of little-endian float32.
//
// This file is the package's public API; the code lives in src/, one file a concern:
//
//   src/errors.ts      the stable error codes (ORTBUS_ERROR_CODES, statusOf) and OrtbusError
//   src/messages.ts    the replies of the client API (codec/messages.go)
//   src/options.ts     the options of connect and of each call
//   src/wire.ts        msgpack/JSON encoding and bounded decoding, the ops, error replies
//   src/tensors.ts     float vectors, tensors and .npy files as bytes
//   src/transport.ts   timeouts, and how a transport failure becomes an OrtbusError
//   src/failover.ts    gateway beats, and resending a call when its gateway dies
//   src/connection.ts  the NATS connection, its state, and one request/reply (send)
//   src/requests.ts    tag, embed, compare, detect, segment, infer, cancel, status, health
//   src/leases.ts      device memory leases (codec/lease.go)
//   src/jobs.ts        durable batch jobs (codec/jobs.go)
//   src/client.ts      OrtbusClient, one method per op
//   src/ai.ts          OrtbusAiClient, the app's IAiClient

export { ORTBUS_ERROR_CODES, OrtbusError, isOrtbusError, statusOf } from "./src/errors.ts";
export type { OrtbusErrorCode } from "./src/errors.ts";

export type {
  Box,
  CancelReply,
  ClassStatus,
  CompareReply,
  DetectReply,
  DeviceStatus,
  EmbedReply,
  GateStatus,
  HealthReply,
  InferReply,
  Lease,
  ModelStatus,
  OrtbusClass,
  Pause,
  PoolStatus,
  SegmentReply,
  Served,
  StatusReply,
  TagReply,
  Tensor,
  NumericTensor,
  NumericTensorType,
  StringTensor,
  TensorType,
  Timing,
  WorkerStatus,
} from "./src/messages.ts";

export type { CallOptions, ConnectOptions, DetectOptions, InferOptions, SegmentOptions, TagOptions } from "./src/options.ts";

export { API_PREFIX, REPLY_LIMITS, copyBytes, decodeJSON, decodeMsg, encodeMsg } from "./src/wire.ts";
export type { Op } from "./src/wire.ts";

export { float32Bytes, float32FromBytes, npyBytes, tensorBytes, tensorFromNpy, tensorValues } from "./src/tensors.ts";
export type { FloatVector, TensorInput } from "./src/tensors.ts";

export { MAX_LEASE_WAIT_MS } from "./src/leases.ts";
export type { LeaseOptions } from "./src/leases.ts";

export { JOB_OPS, jobFinished } from "./src/jobs.ts";
export type {
  JobDir,
  JobItemOptions,
  JobListReply,
  JobOp,
  JobReplyOf,
  JobResult,
  JobResultsOptions,
  JobResultsPage,
  JobState,
  JobStatus,
  JobSubmitReply,
  JobSubmitRequest,
  WatchJobOptions,
} from "./src/jobs.ts";

export { OrtbusClient } from "./src/client.ts";

export { OrtbusAiClient } from "./src/ai.ts";
export type {
  AiCallOptions,
  AiConnectOptions,
  CcipDifferenceResponse,
  CcipFeatureResponse,
  IAiClient,
  OppaiOracleResponse,
  PersonDetection,
  TaggingResponse,
} from "./src/ai.ts";
