package llmtenant_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ortbus/ortbus/internal/llmtenant"
	"github.com/ortbus/ortbus/internal/testkit/testenv"
	"github.com/ortbus/ortbus/models/gguf"
)

// startTiny starts the real tenant (node-llama-cpp's prebuilt CPU llama.cpp) on the
// generated tiny model, and stops it when t ends.
func startTiny(t *testing.T, ctxTokens int, onEvent func(llmtenant.Event)) *llmtenant.Tenant {
	t.Helper()
	o := testenv.RequireLLMTenant(t)
	model, err := gguf.GenerateLlama(t.TempDir(), "tiny")
	if err != nil {
		t.Fatal(err)
	}
	o.Model, o.Context, o.OnEvent = model, ctxTokens, onEvent
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	tn, err := llmtenant.Start(ctx, o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(tn.Close)
	return tn
}

// TestTenantFreeResumeStop: the real engine generates from the generated GGUF (the byte
// vocabulary: "Hello" is BOS and 5 tokens) and reports its first-token latency and
// decode rate; SIGUSR1 frees the model, and the tenant's resident set, read here from
// /proc, drops by at least half the model's bytes; a generation is then refused; a resume
// loads it again (the set grows back) and the same prompt gives the same greedy output;
// a second free gives the memory back again; a stop ends the process.
func TestTenantFreeResumeStop(t *testing.T) {
	tn := startTiny(t, 512, nil)
	ready := tn.Ready()
	if ready.Build != "prebuilt" || ready.GPU != "cpu" || ready.NodeLlamaCpp != "3.21.1" {
		t.Fatalf("ready %+v: want node-llama-cpp 3.21.1's prebuilt CPU binary", ready)
	}
	if ready.ModelBytes < 13<<20 || ready.LoadMS <= 0 || ready.ContextSize != 512 {
		t.Fatalf("ready %+v: want the tiny model's 13+ MiB, a load time, a 512-token context", ready)
	}
	ctx := t.Context()
	first, err := tn.Generate(ctx, llmtenant.Request{Prompt: "Hello", MaxTokens: 16})
	if err != nil {
		t.Fatal(err)
	}
	if first.PromptTokens != 6 || first.Tokens != 16 || len(first.Output) != 16 || first.Stop != llmtenant.StopMaxTokens {
		t.Fatalf("request %+v: want 6 prompt tokens (BOS, one a byte), 16 generated", first)
	}
	if first.FirstTokenMS <= 0 || first.TokensPerS <= 0 || first.TotalMS < first.FirstTokenMS {
		t.Fatalf("request %+v: want first_token_ms > 0, tokens_per_s > 0, total_ms >= first_token_ms", first)
	}
	if slices.Contains(first.Output, gguf.TokenEOS) {
		t.Fatalf("output %v has EOS, which ignore_eos masks", first.Output)
	}

	loaded := rss(t, tn)
	freed, err := tn.Free(ctx, llmtenant.BySignal)
	if err != nil {
		t.Fatal(err)
	}
	after := rss(t, tn)
	t.Logf("resident set: %d MiB loaded, %d MiB freed (the tenant saw %d -> %d MiB)", loaded>>20, after>>20, freed.RSSBeforeBytes>>20, freed.RSSBytes>>20)
	if after > loaded-ready.ModelBytes/2 || freed.RSSBytes > freed.RSSBeforeBytes-ready.ModelBytes/2 {
		t.Fatalf("freeing gave back too little: /proc %d -> %d, the tenant's %d -> %d (model %d bytes)", loaded, after, freed.RSSBeforeBytes, freed.RSSBytes, ready.ModelBytes)
	}
	var te *llmtenant.Error
	if _, err := tn.Generate(ctx, llmtenant.Request{Prompt: "Hello"}); !errors.As(err, &te) || te.Code != llmtenant.CodeUnloaded {
		t.Fatalf("generation while freed: %v, want code %s", err, llmtenant.CodeUnloaded)
	}

	resumed, err := tn.Resume(ctx, llmtenant.ByStdin)
	if err != nil {
		t.Fatal(err)
	}
	if back := rss(t, tn); resumed.LoadMS <= 0 || back < after+ready.ModelBytes/2 {
		t.Fatalf("resume %+v: resident set %d -> %d, want a load and the model back", resumed, after, back)
	}
	again, err := tn.Generate(ctx, llmtenant.Request{Prompt: "Hello", MaxTokens: 16})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(again.Output, first.Output) || again.TokensPerS <= 0 {
		t.Fatalf("after the reload: %+v, want the same greedy output %v", again, first.Output)
	}
	// Every free gives the memory back, not only the first (glibc's threshold: baseEnv).
	reloaded := rss(t, tn)
	if _, err := tn.Free(ctx, llmtenant.BySignal); err != nil {
		t.Fatal(err)
	}
	if again := rss(t, tn); again > reloaded-ready.ModelBytes/2 {
		t.Fatalf("the second free gave back too little: %d -> %d (model %d bytes)", reloaded, again, ready.ModelBytes)
	}

	pid := tn.PID()
	exit, err := tn.Stop(ctx)
	if err != nil || exit.Reason != "stop" || exit.Status != 0 {
		t.Fatalf("stop: %+v, %v", exit, err)
	}
	if err := syscall.Kill(pid, 0); !errors.Is(err, syscall.ESRCH) {
		t.Fatalf("the tenant's process %d is still there after its exit: %v", pid, err)
	}
}

func rss(t *testing.T, tn *llmtenant.Tenant) int64 {
	t.Helper()
	n, err := tn.RSS()
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// TestTenantInput: the tenant survives hostile input — a line that is no JSON, a line
// over its limit, bad fields — each refused with its code, and goes on serving; a free
// asked on stdin stops the generation before it at its next token, and SIGUSR2 resumes.
func TestTenantInput(t *testing.T) {
	unsolicited := make(chan llmtenant.Event, 16)
	tn := startTiny(t, 4096, func(ev llmtenant.Event) {
		if ev.Event == llmtenant.EventError && ev.ID == "" {
			unsolicited <- ev
		}
	})
	ctx := t.Context()
	for _, c := range []struct {
		line []byte
		code string
	}{
		{[]byte("not json"), llmtenant.CodeBadJSON},
		{[]byte(`["an array"]`), llmtenant.CodeBadJSON},
		{[]byte(`{"op":"rm -rf"}`), llmtenant.CodeUnknownOp},
		{[]byte(`{"op":"generate","prompt":"` + strings.Repeat("a", 70000) + `"}`), llmtenant.CodeLineTooLong},
	} {
		if err := tn.WriteLine(c.line); err != nil {
			t.Fatal(err)
		}
		select {
		case ev := <-unsolicited:
			if ev.Code != c.code {
				t.Fatalf("line %.40q: error %+v, want code %s", c.line, ev, c.code)
			}
		case <-tn.Done():
			t.Fatalf("the tenant exited on line %.40q: %s", c.line, tn.Stderr())
		}
	}
	for _, c := range []struct {
		req  llmtenant.Request
		code string
	}{
		{llmtenant.Request{Prompt: "x", MaxTokens: llmtenant.MaxTokens + 1}, llmtenant.CodeBadRequest},
		{llmtenant.Request{Prompt: strings.Repeat("y", 4000), MaxTokens: 200}, llmtenant.CodeTooLong},
	} {
		var te *llmtenant.Error
		if _, err := tn.Generate(ctx, c.req); !errors.As(err, &te) || te.Code != c.code {
			t.Fatalf("request of %d prompt bytes, %d tokens: %v, want code %s", len(c.req.Prompt), c.req.MaxTokens, err, c.code)
		}
	}

	// A long generation, then a free on stdin behind it: the generation stops early.
	long, err := tn.Submit(llmtenant.Request{Prompt: "a", MaxTokens: 4000})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tn.Free(ctx, llmtenant.ByStdin); err != nil {
		t.Fatal(err)
	}
	if ev, err := long.Wait(ctx); err != nil || ev.Stop != llmtenant.StopFreed || ev.Tokens >= 4000 || ev.Tokens < 1 {
		t.Fatalf("the generation a free interrupted: %+v, %v; want stop %s before 4000 tokens", ev, err, llmtenant.StopFreed)
	}
	if _, err := tn.Resume(ctx, llmtenant.BySignal); err != nil {
		t.Fatal(err)
	}
	if ev, err := tn.Generate(ctx, llmtenant.Request{Prompt: "still here", MaxTokens: 4}); err != nil || ev.Tokens != 4 {
		t.Fatalf("after the hostile input: %+v, %v", ev, err)
	}
	if _, err := tn.Stop(ctx); err != nil {
		t.Fatal(err)
	}
}
