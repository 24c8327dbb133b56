package llmtenant

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"syscall"
	"time"
)

// Request is one generation.
type Request struct {
	// ID names it in its event; "" is a fresh one ("g1", "g2", ...). Two generations
	// waiting at once must not share one.
	ID     string
	Prompt string
	// MaxTokens is the tokens to generate, 1..MaxTokens; 0 is the tenant's default (32).
	MaxTokens int
	// StopAtEOS ends the generation at the model's EOS token. By default EOS is never
	// sampled, so every generation makes exactly MaxTokens tokens (the fixed work a
	// bench needs from a model whose EOS comes at random).
	StopAtEOS bool
}

// Generate sends req and waits for its request event (first_token_ms, tokens,
// tokens_per_s), or its error event as an *Error (CodeUnloaded while the model is freed,
// CodeBusy when too many wait, CodeTooLong past the context). Generations may be called
// from several goroutines: the tenant runs them one at a time, in arrival order.
func (t *Tenant) Generate(ctx context.Context, req Request) (Event, error) {
	c, err := t.Submit(req)
	if err != nil {
		return Event{}, err
	}
	return c.Wait(ctx)
}

// Call is a generation sent and not yet waited for.
type Call struct {
	t  *Tenant
	id string
	ch chan Event
}

// Submit sends req and returns at once: what comes after it on the tenant's stdin (a
// Free ByStdin) is read after it. Wait gives its event.
func (t *Tenant) Submit(req Request) (*Call, error) {
	t.mu.Lock()
	if req.ID == "" {
		t.nextID++
		req.ID = "g" + strconv.FormatUint(t.nextID, 10)
	}
	if _, dup := t.pending[req.ID]; dup {
		t.mu.Unlock()
		return nil, fmt.Errorf("llmtenant: a generation with id %q is already waiting", req.ID)
	}
	c := &Call{t: t, id: req.ID, ch: make(chan Event, 1)}
	t.pending[req.ID] = c.ch
	t.mu.Unlock()
	msg := map[string]any{"op": "generate", "id": req.ID, "prompt": req.Prompt, "ignore_eos": !req.StopAtEOS}
	if req.MaxTokens != 0 {
		msg["max_tokens"] = req.MaxTokens
	}
	if err := t.send(msg); err != nil {
		t.mu.Lock()
		c.unwait()
		t.mu.Unlock()
		return nil, fmt.Errorf("llmtenant: sending generation %s: %w", req.ID, err)
	}
	return c, nil
}

// ID is the generation's id.
func (c *Call) ID() string { return c.id }

// Wait waits for the generation's event, as Generate does; given up on (ctx), the
// generation is withdrawn here (the tenant still runs it).
func (c *Call) Wait(ctx context.Context) (Event, error) {
	return c.t.wait(ctx, c.ch, "generation "+c.id, c.unwait)
}

// unwait withdraws c (under t.mu).
func (c *Call) unwait() {
	if c.t.pending[c.id] == c.ch {
		delete(c.t.pending, c.id)
	}
}

// Trigger is how Free and Resume ask the tenant: by a signal (SIGUSR1, SIGUSR2: what an
// on-pressure hook sends) or by a line on its stdin ({"op":"free"}, {"op":"resume"}).
type Trigger int

// The triggers.
const (
	BySignal Trigger = iota
	ByStdin
)

// Free asks the tenant to unload its model and context and waits for its freed event:
// rss_before_bytes and rss_bytes around the unload (a generation running then stops at
// its next token, with stop "freed"). Freeing a freed tenant reports a freed event too.
func (t *Tenant) Free(ctx context.Context, by Trigger) (Event, error) {
	return t.toggle(ctx, by, syscall.SIGUSR1, "free", &t.freed)
}

// Resume asks the tenant to load its model again and waits for its resumed event
// (load_ms, rss_bytes). Resuming a loaded tenant reports load_ms 0.
func (t *Tenant) Resume(ctx context.Context, by Trigger) (Event, error) {
	return t.toggle(ctx, by, syscall.SIGUSR2, "resume", &t.resumed)
}

func (t *Tenant) toggle(ctx context.Context, by Trigger, sig syscall.Signal, op string, waiters *[]chan Event) (Event, error) {
	ch := make(chan Event, 1)
	t.mu.Lock()
	*waiters = append(*waiters, ch)
	t.mu.Unlock()
	unwait := func() {
		if i := slices.Index(*waiters, ch); i >= 0 {
			*waiters = slices.Delete(*waiters, i, i+1)
		}
	}
	var err error
	if by == BySignal {
		err = t.signal(sig)
	} else {
		err = t.send(map[string]string{"op": op})
	}
	if err != nil {
		t.mu.Lock()
		unwait()
		t.mu.Unlock()
		return Event{}, fmt.Errorf("llmtenant: asking for %s: %w", op, err)
	}
	return t.wait(ctx, ch, op, unwait)
}

// signal sends sig to the tenant's process while the started process has not been
// reaped (with no wrapper the tenant's pid is then no longer its).
func (t *Tenant) signal(sig syscall.Signal) error {
	select {
	case <-t.done:
		return ErrExited
	default:
	}
	return syscall.Kill(t.PID(), sig)
}

// Stop asks the tenant to stop ({"op":"stop"}, then its stdin closed): it unloads and
// exits 0 after the operations before it. It waits for the exit, as long as ctx allows,
// then kills the tenant's group; it returns the exit event (with reason "stop"), or why
// there was none or the exit was not clean.
func (t *Tenant) Stop(ctx context.Context) (Event, error) {
	err := t.send(map[string]string{"op": "stop"})
	t.wmu.Lock()
	t.stdin.Close()
	t.wmu.Unlock()
	select {
	case <-t.done:
	case <-ctx.Done():
		t.Close()
		return Event{}, fmt.Errorf("llmtenant: the tenant did not stop: %w; killed it", ctx.Err())
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	switch {
	case t.exit == nil:
		return Event{}, fmt.Errorf("llmtenant: the tenant exited (%v) without an exit event (sending stop: %v): %s", t.state, err, t.stderr.String())
	case !t.state.Success():
		return *t.exit, fmt.Errorf("llmtenant: the tenant exited with %v", t.state)
	}
	return *t.exit, nil
}

// closeGrace is how long Close waits for the killed processes to exit.
const closeGrace = 10 * time.Second

// Close kills the tenant and the process group of what was started (the tenant, or its
// wrapper) if they still run, and waits for both to exit: the tenant's memory is free
// when it returns. It is safe to call at any time, more than once (a test's cleanup),
// and before the ready event (no tenant pid known yet).
//
// A wrapped tenant (ortbus lease --gate runs it in a group of its own) is not this
// process's child: it is killed and awaited through its pidfd (own), which names that
// process alone, so a wrapper that exited first does not leave it running, and Close
// does not return while it is still exiting (issue 42: "tenant gone false, wrapper gone
// true" right after Close).
func (t *Tenant) Close() {
	deadline := time.Now().Add(closeGrace)
	t.closeOwn(deadline)
	select {
	case <-t.done:
		return
	default:
	}
	// The group id is the started process's pid (Setpgid), not reused while it is
	// unreaped (done not closed); never 0, which would be this process's own group.
	if started := t.cmd.Process.Pid; started > 0 {
		syscall.Kill(-started, syscall.SIGKILL)
	}
	select {
	case <-t.done:
	case <-time.After(time.Until(deadline)):
	}
}
