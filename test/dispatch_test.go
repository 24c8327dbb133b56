package test

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/nats-io/nats.go"

	"github.com/ortbus/ortbus/codec"
	"github.com/ortbus/ortbus/config"
	"github.com/ortbus/ortbus/subjects"
)

// Dispatch to one worker, prefetch and replies straight to the client (gateway/pick.go,
// policy.go, request.go), with a real gateway, real workers and real models.

// dispatchConfig: pool "one" (one one-slot worker, batch) and pool "two" (two one-slot
// workers, interactive), both on the CPU device.
func dispatchConfig(t *testing.T, root string, gw config.Gateway) string {
	return gwConfig{
		Root:    root,
		Gateway: gw,
		Pools: []gwPool{
			{Name: "one", Version: "1.30.0", Workers: 1, Slots: 1, Classes: []string{"batch"}, Models: []string{gwSlow}},
			{Name: "two", Version: "1.30.0", Workers: 2, Slots: 1, Classes: []string{"interactive"}, Models: []string{gwSlow, gwTagger}},
		},
		Classes: []gwClass{{Name: "interactive", Chain: []string{"two"}}, {Name: "batch", Chain: []string{"one"}}},
	}.write(t)
}

// claimOf decodes a claim.
func claimOf(t *testing.T, m *nats.Msg) codec.Claim {
	t.Helper()
	var c codec.Claim
	if err := codec.Unmarshal(m.Data, &c); err != nil {
		t.Fatalf("claim on %s: %v", m.Subject, err)
	}
	return c
}

// TestDispatchToWorkers: the gateway sends every item to one worker
// (infer.<pool>.<class>.<worker>); two slow interactive requests sent together go to the
// two workers of pool two, round after round (the queue group would put both on one worker
// half the time); with pool one's one slot busy, a second batch item is prefetched to its
// worker before the first one's answer; and a worker's answer goes straight to the client,
// followed by its done claim, unless the request is in JSON.
func TestDispatchToWorkers(t *testing.T) {
	root := imageRoot(t)
	blue, red := colourPNG(t, root, "blue"), colourPNG(t, root, "red")
	g := startGateway(t, dispatchConfig(t, root, config.Gateway{}))
	g.waitLive(t, "one", 1)
	live := g.waitLive(t, "two", 2)
	dispatched := newGWSpy(t, g.NC, "infer.>")
	claims := newGWSpy(t, g.NC, "ortbus.claim.>")
	in := newInbox(t, g.NC)

	// Prefetch, first, while no interactive work has been on the device: p0 runs, p1 waits
	// at the worker, p2 in the gateway. One spy on everything keeps the server's order: p1
	// leaves the gateway before p0's answer (without prefetch it would leave only once
	// p0's done claim came, after that answer).
	all := newGWSpy(t, g.NC, ">")
	for _, id := range []string{"p0", "p1", "p2"} {
		g.post(t, in, "tag", id, &codec.Request{ID: id, Path: blue, Class: "batch", Model: gwSlow})
	}
	var before []string
	all.until(t, "the first batch answer", func(m *nats.Msg) bool {
		if strings.HasPrefix(m.Subject, "infer.") {
			before = append(before, gwDispatchedIDs(t, []*nats.Msg{m})...)
		}
		return strings.HasPrefix(m.Subject, in.prefix+".")
	})
	if len(before) != 2 {
		t.Errorf("before the first batch answer the gateway had dispatched %v, want p0 and p1 (prefetched), not p2", before)
	}
	for i := 0; i < 3; i++ {
		in.next(t, "the batch answers")
	}

	// Two at once, five rounds: each round on both workers.
	for round := 0; round < 5; round++ {
		a, b := fmt.Sprintf("r%da", round), fmt.Sprintf("r%db", round)
		g.post(t, in, "tag", a, &codec.Request{ID: a, Path: red, Model: gwSlow})
		g.post(t, in, "tag", b, &codec.Request{ID: b, Path: red, Model: gwSlow})
		_, got := gwCollect(t, in, 2)
		wa, wb := got[a].tag(t).Worker, got[b].tag(t).Worker
		if wa == wb {
			t.Errorf("round %d: both requests served by %s, want one on each worker of %v", round, wa, live)
		}
	}
	for _, m := range dispatched.drain(t, g.NC) {
		p, err := subjects.Parse(m.Subject)
		if err != nil || p.Kind != subjects.KindInfer || p.Worker == "" {
			t.Errorf("item dispatched on %s: want infer.<pool>.<class>.<worker> (%v)", m.Subject, err)
			continue
		}
		if p.Pool == "two" {
			if _, ok := live[p.Worker]; !ok {
				t.Errorf("item sent to %s, not a live worker of pool two (%v)", p.Worker, live)
			}
		}
	}

	// Straight to the client: a done claim, with the result's timing, after each answer.
	r := g.call(t, "tag", &codec.Request{ID: "direct", Path: red, Model: gwTagger}, gwReplyBound)
	checkColourTag(t, r.tag(t), "red")
	done := claims.until(t, "the done claim of the direct request", func(m *nats.Msg) bool {
		c := claimOf(t, m)
		return c.ID == "direct" && c.State == codec.ClaimDone
	})
	if c := claimOf(t, done); c.Code != "" || c.Timing == nil || c.Timing.InferUS <= 0 || !strings.HasPrefix(c.Worker, "two") {
		t.Errorf("done claim %+v, want no code, the result's timing, a worker of pool two", c)
	}
	// An error answered by the worker reaches the client with its code, and the claim says
	// it too.
	bad := g.call(t, "tag", &codec.Request{ID: "direct-bad", Path: red + ".missing", Model: gwTagger}, gwReplyBound)
	if bad.Err == nil {
		t.Fatalf("tag of a missing file answered %q, want an error", bad.Msg.Data)
	}
	c := claimOf(t, claims.until(t, "the done claim of the failed request", func(m *nats.Msg) bool {
		c := claimOf(t, m)
		return c.ID == "direct-bad" && c.State == codec.ClaimDone
	}))
	if c.Code != bad.Err.Code {
		t.Errorf("done claim code %q, the client got %q", c.Code, bad.Err.Code)
	}
	// JSON is relayed by the gateway (it re-encodes the worker's msgpack): no done claim.
	msg := nats.NewMsg("ortbus.v1.tag")
	msg.Header.Set(codec.HeaderContentType, codec.ContentTypeJSON)
	msg.Data, _ = json.Marshal(map[string]any{"id": "relayed", "path": red, "model": gwTagger})
	jr, err := g.NC.RequestMsg(msg, gwReplyBound)
	if err != nil {
		t.Fatal(err)
	}
	var tr codec.TagReply
	if err := json.Unmarshal(jr.Data, &tr); err != nil || tr.ID != "relayed" {
		t.Fatalf("JSON reply %q: %v", jr.Data, err)
	}
	for _, m := range claims.drain(t, g.NC) {
		if c := claimOf(t, m); c.ID == "relayed" && c.State == codec.ClaimDone {
			t.Errorf("a JSON request was answered straight to the client: %+v", c)
		}
	}
	// The gateway counts a direct answer when its done claim comes, a hop after the client
	// has it: wait until nothing is in flight.
	g.waitStatus(t, "nothing in flight", func(st *codec.StatusReply) bool {
		for _, c := range st.Classes {
			if c.Running != 0 || c.Queued != 0 {
				return false
			}
		}
		return true
	})
	counts := gwRequestCounts(t, g.Ready.HTTP)
	if n := counts[gwMetricKey("tag", "interactive", "two", gwTagger, "ok")]; n < 2 {
		t.Errorf("ortbus_requests_total ok for the tagger on two: %v, want the direct and the relayed answer", n)
	}
}

// TestRelayReplies: with [gateway] relay_replies every answer goes through the gateway:
// no done claim.
func TestRelayReplies(t *testing.T) {
	root := imageRoot(t)
	red := colourPNG(t, root, "red")
	g := startGateway(t, dispatchConfig(t, root, config.Gateway{RelayReplies: true}))
	g.waitLive(t, "two", 2)
	claims := newGWSpy(t, g.NC, "ortbus.claim.>")
	checkColourTag(t, g.call(t, "tag", &codec.Request{ID: "relay", Path: red, Model: gwTagger}, gwReplyBound).tag(t), "red")
	taken := false
	for _, m := range claims.drain(t, g.NC) {
		c := claimOf(t, m)
		if c.ID == "relay" && c.State == codec.ClaimDone {
			t.Errorf("relay_replies: a done claim %+v", c)
		}
		taken = taken || (c.ID == "relay" && c.State == codec.ClaimTaken)
	}
	if !taken {
		t.Error("no taken claim of the request: the spy saw nothing")
	}
}
