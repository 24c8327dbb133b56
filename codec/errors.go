package codec

import (
	"errors"
	"fmt"
)

// Code is a stable error code from the design's contract. Clients switch on it; its
// spelling never changes.
type Code string

// The stable error codes of the contract.
const (
	CodeBadRequest   Code = "bad_request"
	CodeUnknownOp    Code = "unknown_op"
	CodeUnknownModel Code = "unknown_model"
	CodeUnknownPool  Code = "unknown_pool"
	CodeUnknownJob   Code = "unknown_job"
	// CodeConflict: a job id already taken, by another owner or with other items.
	CodeConflict            Code = "conflict"
	CodeFileNotFound        Code = "file_not_found"
	CodeForbiddenPath       Code = "forbidden_path"
	CodeUnsupportedImage    Code = "unsupported_image"
	CodeImageTooLarge       Code = "image_too_large"
	CodeRuntimeMissing      Code = "runtime_missing"
	CodeProviderUnavailable Code = "provider_unavailable"
	CodeNoWorker            Code = "no_worker"
	CodeOverloaded          Code = "overloaded"
	CodeDeadlineExceeded    Code = "deadline_exceeded"
	CodeCancelled           Code = "cancelled"
	CodeWorkerLost          Code = "worker_lost"
	CodePoisonInput         Code = "poison_input"
	// CodeReplyTooLarge: the result exists but its encoding is over the NATS server's
	// max_payload (or the HTTP reply limit); it is answered as this error, never dropped.
	CodeReplyTooLarge Code = "reply_too_large"
	// CodeUnavailable: a service the request needs is not there (the job API where the
	// NATS server has no JetStream).
	CodeUnavailable Code = "unavailable"
	// CodeModelUnavailable: the worker runs, but the model asked for failed to load there
	// (ONNX Runtime refused it, its files are missing, its warm-up panicked); the load
	// error is in details.error. A model is the unit of failure: the worker's other
	// models serve.
	CodeModelUnavailable Code = "model_unavailable"
	CodeInternal         Code = "internal"
)

// Codes lists every stable code, for documentation and tests.
var Codes = []Code{
	CodeBadRequest, CodeUnknownOp, CodeUnknownModel, CodeUnknownPool, CodeUnknownJob, CodeFileNotFound,
	CodeForbiddenPath, CodeUnsupportedImage, CodeImageTooLarge, CodeRuntimeMissing,
	CodeProviderUnavailable, CodeNoWorker, CodeOverloaded, CodeDeadlineExceeded,
	CodeCancelled, CodeWorkerLost, CodePoisonInput, CodeReplyTooLarge, CodeUnavailable, CodeInternal,
	CodeConflict, CodeModelUnavailable,
}

// Status is the HTTP-like number sent in the Nats-Service-Error-Code header (and used as
// the HTTP status by the gateway's HTTP API).
func (c Code) Status() int {
	switch c {
	case CodeBadRequest, CodeUnsupportedImage:
		return 400
	case CodeForbiddenPath:
		return 403
	case CodeUnknownOp, CodeUnknownModel, CodeUnknownPool, CodeUnknownJob, CodeFileNotFound:
		return 404
	case CodeCancelled:
		return 499
	case CodeConflict:
		return 409
	case CodeImageTooLarge:
		return 413
	case CodePoisonInput:
		return 422
	case CodeOverloaded:
		return 429
	case CodeRuntimeMissing, CodeProviderUnavailable, CodeNoWorker, CodeWorkerLost, CodeUnavailable, CodeModelUnavailable:
		return 503
	case CodeDeadlineExceeded:
		return 504
	default:
		return 500
	}
}

// Known reports whether c is one of the contract's codes.
func (c Code) Known() bool {
	for _, k := range Codes {
		if c == k {
			return true
		}
	}
	return false
}

// Error is the error body of the contract: {code, message, details}. It is also a Go
// error, so code paths can return it and callers can recover it with errors.As.
type Error struct {
	Code    Code           `msgpack:"code" json:"code"`
	Message string         `msgpack:"message" json:"message"`
	Details map[string]any `msgpack:"details,omitempty" json:"details,omitempty"`
}

func (e *Error) Error() string { return string(e.Code) + ": " + e.Message }

// With returns e with one more detail set; it mutates and returns e for chaining.
func (e *Error) With(key string, value any) *Error {
	if e.Details == nil {
		e.Details = map[string]any{}
	}
	e.Details[key] = value
	return e
}

// Errorf makes an *Error with a formatted message.
func Errorf(code Code, format string, args ...any) *Error {
	return &Error{Code: code, Message: fmt.Sprintf(format, args...)}
}

// AsError returns err as an *Error: itself if it is (or wraps) one, else an internal
// error carrying err's text. A nil err gives nil.
func AsError(err error) *Error {
	if err == nil {
		return nil
	}
	var e *Error
	if errors.As(err, &e) {
		return e
	}
	return &Error{Code: CodeInternal, Message: err.Error()}
}

// CodeOf returns the code of err, or "" for nil, or internal for a non-contract error.
func CodeOf(err error) Code {
	if err == nil {
		return ""
	}
	return AsError(err).Code
}
