package test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ortbus/ortbus/bench"
	"github.com/ortbus/ortbus/client"
	"github.com/ortbus/ortbus/codec"
	"github.com/ortbus/ortbus/config"
	"github.com/ortbus/ortbus/internal/llmtenant"
	"github.com/ortbus/ortbus/internal/testkit/testenv"
	"github.com/ortbus/ortbus/models/gguf"
)

// lockedBuffer is a bytes.Buffer safe to write from one goroutine and read from another.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// tenantEvents passes the tenant's events of the named kinds on a channel.
func tenantEvents(kinds ...string) (chan llmtenant.Event, func(llmtenant.Event)) {
	ch := make(chan llmtenant.Event, 16)
	return ch, func(ev llmtenant.Event) {
		for _, k := range kinds {
			if ev.Event == k {
				ch <- ev
			}
		}
	}
}

// nextEvent waits for the tenant's next event on ch, which must be want.
func nextEvent(t *testing.T, ch chan llmtenant.Event, want string, stderr *lockedBuffer) llmtenant.Event {
	t.Helper()
	select {
	case ev := <-ch:
		if ev.Event != want {
			t.Fatalf("the tenant said %+v, want %q", ev, want)
		}
		return ev
	case <-time.After(time.Minute):
		t.Fatalf("the tenant did not say %q within a minute; the wrapper and tenant said:\n%s", want, stderr.String())
	}
	return llmtenant.Event{}
}

// TestLeaseReliefRealTenant: the README's LLM tenant (llama.cpp through node-llama-cpp,
// real, on the generated tiny model with a 16k-token context: about 240 MiB resident, 100
// MiB freed) under `ortbus lease --on-pressure 'kill -USR1 …' --on-relief 'kill -USR2 …'`
// with a batch lease of 256 MiB of cpu (budget 512 MiB), which covers what it uses: no
// warning. An urgent acquire that needs more than the trim of the lease to the tenant's
// use presses it: the tenant frees its model (its own freed event), the lease shrinks to
// what it then uses, and the urgent lease is granted. Released, the pressing work is done:
// the wrapper asks for relief, the lease is grown back to 256 MiB, the on-relief hook
// resumes the tenant by itself (its resumed event), and it generates again.
func TestLeaseReliefRealTenant(t *testing.T) {
	t.Parallel()
	o := testenv.RequireLLMTenant(t)
	model, err := gguf.GenerateLlama(t.TempDir(), "tiny")
	if err != nil {
		t.Fatal(err)
	}
	g := startGateway(t, gwConfig{
		Root:    imageRoot(t),
		Devices: map[string]config.Device{"cpu": {Capacity: 1 << 30, SafeFraction: 0.5}}, // budget 512 MiB
		Pools:   []gwPool{{Name: "p", Version: "1.30.0", Workers: 1, Slots: 1, Classes: []string{"interactive"}, Models: []string{gwTagger}}},
		Classes: []gwClass{{Name: "interactive", Chain: []string{"p"}}},
	}.write(t))
	g.waitLive(t, "p", 1)
	events, onEvent := tenantEvents("freed", "resumed")
	stderr := &lockedBuffer{}
	o.Model, o.Context, o.OnEvent, o.Stderr = model, 16384, onEvent, stderr
	o.Wrap = []string{testBinary(t, "ortbus"), "lease", "-s", g.Ready.NATSURL, "--device", "cpu", "--bytes", "256MiB", "--class", "batch",
		"--holder", "llama", "--ttl", "3s", "--on-pressure", "kill -USR1 $ORTBUS_LEASE_PID", "--on-relief", "kill -USR2 $ORTBUS_LEASE_PID", "--"}
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	tn, err := llmtenant.Start(ctx, o)
	if err != nil {
		t.Fatalf("%v; the wrapper said:\n%s", err, stderr.String())
	}
	t.Cleanup(tn.Close)
	if _, err := tn.Generate(ctx, llmtenant.Request{Prompt: "Hello", MaxTokens: 4}); err != nil {
		t.Fatal(err)
	}
	loaded, err := tn.RSS()
	if err != nil || loaded > 256<<20 {
		t.Fatalf("the tenant uses %d MiB (%v): the lease of 256 MiB must cover it", loaded>>20, err)
	}

	// The urgent acquire: what is free now plus 64 MiB, more than trimming the lease to
	// the loaded tenant gives back (256 MiB less its use): the tenant must free its model.
	c, err := client.Connect(g.Ready.NATSURL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	need := deviceOf(t, g, "cpu").FreeBytes + 64<<20
	if trim := int64(256<<20) - loaded; need <= deviceOf(t, g, "cpu").FreeBytes+trim {
		t.Fatalf("the urgent need %d MiB would fit after a trim of %d MiB alone", need>>20, trim>>20)
	}
	urgent, err := c.WaitLease(ctx, &codec.LeaseRequest{Device: "cpu", Bytes: need, Class: "urgent", Holder: "urgent", TTLMS: 60_000}, time.Minute)
	if err != nil {
		t.Fatalf("the urgent acquire: %v; the wrapper said:\n%s", err, stderr.String())
	}
	freed := nextEvent(t, events, "freed", stderr)
	if l, ok := leaseOf(t, g, "cpu", "llama"); !ok || l.Bytes >= 256<<20-64<<20 {
		t.Errorf("the tenant's lease while the urgent one is held: %+v, want shrunk to its use (%d MiB)", l, freed.RSSBytes>>20)
	}
	var te *llmtenant.Error
	if _, err := tn.Generate(ctx, llmtenant.Request{Prompt: "Hello", MaxTokens: 4}); !errors.As(err, &te) || te.Code != llmtenant.CodeUnloaded {
		t.Errorf("generating while freed: %v, want %s", err, llmtenant.CodeUnloaded)
	}

	// The urgent work done: the tenant is resumed by itself and generates.
	if _, err := c.ReleaseLease(ctx, urgent.Lease); err != nil {
		t.Fatal(err)
	}
	nextEvent(t, events, "resumed", stderr)
	if r, err := tn.Generate(ctx, llmtenant.Request{Prompt: "Hello", MaxTokens: 4}); err != nil || r.Tokens != 4 {
		t.Fatalf("generating after the relief: %+v %v", r, err)
	}
	if l, ok := leaseOf(t, g, "cpu", "llama"); !ok || l.Bytes != 256<<20 {
		t.Errorf("the tenant's lease after the relief: %+v, want grown back to 256 MiB", l)
	}
	out := stderr.String()
	for _, want := range []string{"running the on-pressure hook", "fit again: running the on-relief hook"} {
		if !strings.Contains(out, want) {
			t.Errorf("the wrapper did not say %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "warning") {
		t.Errorf("the wrapper warned of a lease that covers the tenant:\n%s", out)
	}
}

// TestLeaseBelowHolderWarnsReal: a lease of 8 MiB for a holder that allocates 64 MiB: the
// wrapper warns, with both figures.
func TestLeaseBelowHolderWarnsReal(t *testing.T) {
	t.Parallel()
	g := startGateway(t, gwConfig{
		Root:    imageRoot(t),
		Devices: map[string]config.Device{"cpu": {Capacity: 1 << 30, SafeFraction: 0.5}},
		Pools:   []gwPool{{Name: "p", Version: "1.30.0", Workers: 1, Slots: 1, Classes: []string{"interactive"}, Models: []string{gwTagger}}},
		Classes: []gwClass{{Name: "interactive", Chain: []string{"p"}}},
	}.write(t))
	h := startHeld(t, g, "64MiB", "--device", "cpu", "--bytes", "8MiB", "--class", "batch", "--holder", "small")
	h.next(t, bench.MemHolderReady)
	checkFor(t, "the wrapper's warning", gwReplyBound, pollEvery, func() error {
		b, _ := os.ReadFile(h.stderr)
		if s := string(b); !strings.Contains(s, "warning: the lease holds 8.0MiB of cpu, but CMD is measured using") || !strings.Contains(s, "lease at least") {
			return fmt.Errorf("not yet: %q", s)
		}
		return nil
	})
}
