package test

import (
	"fmt"
	"testing"
	"time"

	"github.com/ortbus/ortbus/codec"
	"github.com/ortbus/ortbus/config"
)

// Degrade (docs/PROTOCOL.md section 7, deadline feasibility; gateway/policy.go, feasible)
// with a real gateway, real workers and real models: the urgent class's chain is
// [acc, cpu], acc on an accelerator device ("gpu.intel:0", run here on the CPU EP) that a
// batch pool shares, cpu on the CPU device. While a batch unit runs on the accelerator,
// an urgent request whose deadline the accelerator's queue cannot meet goes to the CPU
// pool (a smaller model there, as CPU speech recognition is) and is answered in time,
// rather than waiting for the accelerator or being answered deadline_exceeded.

// degradeDevice is the accelerator device of the test: a device other than cpu, so that
// the batch pool's load counts against the acc pool only.
const degradeDevice = "gpu.intel:0"

// TestDegradeToCPU: the first urgent request (no measured service time yet) goes to the
// preferred accelerator pool, and its timing gives the pool's service time S as the
// gateway measures it (total_us - queue_us). Then batch work fills the accelerator: the
// test waits for the first batch item's claim (a unit is running), and sends urgent
// requests with a deadline of 1.25 x S: enough for the accelerator alone (S), not with
// its device loaded (degrade counts S x (1 + in flight / slots) >= 1.5 x S with one
// batch item in flight on its two slots). Each must be a result from pool cpu, on time.
// The deadline is derived from the run's own measurement, not fixed, so a loaded machine
// moves both sides alike.
func TestDegradeToCPU(t *testing.T) {
	t.Parallel()
	root := imageRoot(t)
	red := colourPNG(t, root, "red")
	g := startGateway(t, gwConfig{
		Root: root,
		// A device of unknown capacity admits nothing: the accelerator's is declared.
		Devices: map[string]config.Device{degradeDevice: {Capacity: 4 << 30, SafeFraction: 0.85}},
		Pools: []gwPool{
			{Name: "acc", Version: "1.30.0", Workers: 1, Slots: 1, Device: degradeDevice, Classes: []string{"urgent"}, Models: []string{gwSlow}},
			{Name: "accb", Version: "1.30.0", Workers: 1, Slots: 1, Device: degradeDevice, MaxBatch: 8, Classes: []string{"batch"}, Models: []string{gwSlow}},
			{Name: "cpu", Version: "1.30.0", Workers: 1, Slots: 1, Classes: []string{"urgent"}, Models: []string{gwTagger}},
		},
		Classes: []gwClass{
			{Name: "urgent", Chain: []string{"acc", "cpu"}, Timeout: "2s", Degrade: true},
			{Name: "batch", Chain: []string{"accb"}},
		},
	}.write(t))
	for _, p := range []string{"acc", "accb", "cpu"} {
		g.waitLive(t, p, 1)
	}

	// Calibration: the accelerator is idle and unmeasured, so it takes the request.
	first := g.call(t, "tag", &codec.Request{Path: red, Class: "urgent", TimeoutMS: 2000}, gwReplyBound).tag(t)
	if first.Pool != "acc" {
		t.Fatalf("the first urgent request, the accelerator idle, was served by %q, want acc (the chain's first pool)", first.Pool)
	}
	service := time.Duration(first.Timing.TotalUS-first.Timing.QueueUS) * time.Microsecond
	deadline := max(time.Millisecond, service*5/4)
	t.Logf("accelerator service time %v; urgent deadline %v", service, deadline)

	// Fill the accelerator with batch work: 40 items of the slow tagger (several units of 8,
	// seconds of compute); wait until the first one is taken.
	claims := newGWSpy(t, g.NC, "ortbus.claim.>")
	batch := newInbox(t, g.NC)
	const nBatch = 40
	for i := range nBatch {
		g.post(t, batch, "tag", fmt.Sprint("b", i), &codec.Request{ID: fmt.Sprint("batch-", i), Path: red, Class: "batch"})
	}
	gwClaimOf(t, claims, "batch-0")

	const nUrgent = 3
	for i := range nUrgent {
		r := g.call(t, "tag", &codec.Request{Path: red, Class: "urgent", TimeoutMS: deadline.Milliseconds()}, gwReplyBound)
		if r.Err != nil {
			t.Fatalf("urgent request %d with the accelerator busy: %s: %s; want a result from the CPU pool (degrade)", i, r.Err.Code, r.Err.Message)
		}
		tr := r.tag(t)
		if tr.Pool != "cpu" {
			t.Errorf("urgent request %d with the accelerator busy was served by %q, want cpu (degrade to the next pool of the chain)", i, tr.Pool)
		}
		checkColourTag(t, tr, "red")
	}
	// The batch work is answered too, by its own pool.
	_, got := gwCollect(t, batch, nBatch)
	for k, r := range got {
		if tr := r.tag(t); tr.Pool != "accb" {
			t.Errorf("batch %s served by %q, want accb", k, tr.Pool)
		}
	}
}
