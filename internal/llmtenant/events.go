package llmtenant

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
)

// The events the tenant prints (tenants/llm/tenant.mjs documents their fields).
const (
	EventReady   = "ready"
	EventRequest = "request"
	EventFreed   = "freed"
	EventResumed = "resumed"
	EventError   = "error"
	EventExit    = "exit"
	EventCheck   = "check"
)

// The codes of the tenant's error events.
const (
	CodeLineTooLong = "line_too_long"
	CodeBadJSON     = "bad_json"
	CodeBadRequest  = "bad_request"
	CodeUnknownOp   = "unknown_op"
	CodeBusy        = "busy"
	CodeUnloaded    = "unloaded"
	CodeTooLong     = "too_long"
	CodeStopping    = "stopping" // sent after a stop
	CodeLoadFailed  = "load_failed"
	CodeInternal    = "internal"
)

// The stop reasons of a request event.
const (
	StopMaxTokens = "max_tokens"
	StopEOS       = "eos"
	StopFreed     = "freed"   // a free came: the model is being unloaded
	StopStopped   = "stopped" // a stop came: the tenant is exiting
)

// MaxTokens is the most tokens one request may ask for (the tenant's bound too).
const MaxTokens = 4096

// MaxLine bounds one event line: a request event with MaxTokens output tokens is about
// 25 KiB; a longer line is no event of the tenant's.
const MaxLine = 1 << 20

// Event is one line of the tenant's stdout; which fields are set depends on Event (the
// name). Times are milliseconds, memory bytes.
type Event struct {
	Event string `json:"event"`

	// ready
	LoadMS       float64 `json:"load_ms"`         // ready, resumed: the load's time
	RSSBytes     int64   `json:"rss_bytes"`       // ready, freed, resumed: the tenant's resident set after it
	ModelBytes   int64   `json:"model_bytes"`     // ready: the model's tensors
	ContextSize  int     `json:"context_size"`    // ready: tokens of the context
	Threads      int     `json:"threads"`         // ready
	GPU          string  `json:"gpu"`             // ready, check: cpu, vulkan or cuda
	Build        string  `json:"build"`           // ready, check: "prebuilt" (node-llama-cpp's binary) or "localBuild"
	VRAMUsed     int64   `json:"vram_used_bytes"` // ready, freed, resumed: the backend's used device memory (0 on the CPU)
	NodeLlamaCpp string  `json:"node_llama_cpp"`  // ready, check: node-llama-cpp's version
	LlamaCpp     string  `json:"llama_cpp"`       // check: llama.cpp's release in the binary
	Node         string  `json:"node"`            // ready: node's version
	PID          int     `json:"pid"`             // ready

	// request
	ID           string  `json:"id"` // request; error, when about a request
	PromptTokens int     `json:"prompt_tokens"`
	Tokens       int     `json:"tokens"`
	FirstTokenMS float64 `json:"first_token_ms"` // from the request's turn to its first token
	TotalMS      float64 `json:"total_ms"`       // to its last token
	TokensPerS   float64 `json:"tokens_per_s"`   // decode rate: (tokens-1) / (last - first token)
	Stop         string  `json:"stop"`           // StopMaxTokens, StopEOS, StopFreed, StopStopped
	Output       []int   `json:"output"`         // the generated token ids (byte b is token b)

	// freed
	FreeMS         float64 `json:"free_ms"`
	RSSBeforeBytes int64   `json:"rss_before_bytes"`

	// error
	Code    string `json:"code"`
	Message string `json:"message"`

	// exit
	Reason string `json:"reason"`
	Status int    `json:"status"` // the tenant's exit status
}

// errLineTooLong is readEvent's error for a line over MaxLine (dropped to its end).
var errLineTooLong = errors.New("llmtenant: event line over the limit")

// decodeEvent decodes and checks one event line.
func decodeEvent(line []byte) (Event, error) {
	var ev Event
	if err := json.Unmarshal(line, &ev); err != nil {
		return Event{}, fmt.Errorf("llmtenant: not an event line: %w", err)
	}
	switch ev.Event {
	case EventReady, EventRequest, EventFreed, EventResumed, EventError, EventExit, EventCheck:
	default:
		return Event{}, fmt.Errorf("llmtenant: unknown event %q", ev.Event)
	}
	return ev, ev.check()
}

// check refuses figures no tenant reports: negative, non-finite or over the bounds.
func (e *Event) check() error {
	for _, f := range []float64{e.LoadMS, e.FirstTokenMS, e.TotalMS, e.TokensPerS, e.FreeMS} {
		if f < 0 || math.IsInf(f, 0) || math.IsNaN(f) {
			return fmt.Errorf("llmtenant: %s event with a figure %v", e.Event, f)
		}
	}
	for _, n := range []int64{e.RSSBytes, e.ModelBytes, e.VRAMUsed, e.RSSBeforeBytes, int64(e.ContextSize), int64(e.Threads), int64(e.PromptTokens), int64(e.Tokens)} {
		if n < 0 {
			return fmt.Errorf("llmtenant: %s event with a figure %d", e.Event, n)
		}
	}
	if len(e.Output) > MaxTokens || e.Tokens > MaxTokens {
		return fmt.Errorf("llmtenant: request event with %d tokens (limit %d)", max(len(e.Output), e.Tokens), MaxTokens)
	}
	return nil
}

// readLine reads one line of at most max bytes (without its newline). A longer line is
// read to its end and dropped: errLineTooLong, and the next call reads the next line.
func readLine(r *bufio.Reader, max int) ([]byte, error) {
	var line []byte
	for {
		part, err := r.ReadSlice('\n')
		if len(line)+len(part) > max+1 { // +1: the newline
			line = nil
			for errors.Is(err, bufio.ErrBufferFull) {
				_, err = r.ReadSlice('\n')
			}
			if err != nil && !errors.Is(err, io.EOF) {
				return nil, err
			}
			return nil, errLineTooLong
		}
		line = append(line, part...)
		switch {
		case err == nil:
			return line[:len(line)-1], nil
		case errors.Is(err, bufio.ErrBufferFull):
			continue
		case errors.Is(err, io.EOF) && len(line) > 0:
			return line, nil
		default:
			return nil, err
		}
	}
}
