package test

import (
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/ortbus/ortbus/codec"
	"github.com/ortbus/ortbus/config"
	"github.com/ortbus/ortbus/internal/fault"
	"github.com/ortbus/ortbus/internal/testkit/testenv"
	"github.com/ortbus/ortbus/models/onnxgen"
)

// TestLateClaimAnsweredOnce: a worker's claim that reaches the gateway after the claim
// timer sent the request again (a worker slow to claim on a loaded machine) does not give
// the client two answers. The request goes straight to its client (reply_direct: over
// NATS in msgpack, no failover); the real worker's claim of the first attempt is held by
// the fault hook (fault.MagicSlowClaim) until it has claimed the second, so the gateway
// sees the first attempt's claim late, every time. The gateway's verdict on that late
// claim is "not yours": the worker drops the first attempt's reply (dropped_replies in
// its beat) and the client has exactly one answer, the second attempt's.
func TestLateClaimAnsweredOnce(t *testing.T) {
	t.Parallel()
	root := imageRoot(t)
	lib := testenv.RuntimeLib(t, "1.30.0")
	c := &config.Config{
		NATS:     config.NATS{Embedded: true, Listen: "127.0.0.1:0"},
		Gateway:  config.Gateway{ShutdownGrace: config.Duration(3 * time.Second)},
		Health:   config.Health{HeartbeatInterval: config.Duration(gwHeartbeat), MissCount: gwMissCount},
		Security: config.Security{AllowedRoots: []string{root}},
		Classes:  map[string]*config.Class{"interactive": {}},
		Pools: map[string]*config.Pool{
			"cpu": {Runtime: lib, Threads: 1, Slots: 2, Env: map[string]string{fault.EnvVar: "1"}, Classes: []string{"interactive"}, Models: []string{"tiny"}},
		},
		Models: map[string]*config.Model{"tiny": {Kind: config.KindRaw, Dir: filepath.Join(testenv.Models(t), onnxgen.TinyDir)}},
	}
	g := startGateway(t, writeConfigFile(t, filepath.Join(t.TempDir(), "late.toml"), c))
	g.waitLive(t, "cpu", 1)
	beats := newGWSpy(t, g.NC, "ortbus.hb.cpu.*")
	x := &codec.Tensor{Type: "float32", Shape: []int64{1, onnxgen.TinyDim}, Data: codec.Float32Bytes(make([]float32, onnxgen.TinyDim))}
	late := filepath.Join(root, fault.MagicSlowClaim+".npy")
	writeNPY(t, late, x)

	in := newInbox(t, g.NC)
	g.post(t, in, "infer", "late", &codec.Request{ID: "late-claim", Model: "tiny", Class: "interactive", InputPaths: map[string]string{"x": late}})
	_, got := gwCollect(t, in, 1)
	if r := got["late"]; r.Err != nil {
		t.Fatalf("the answer: %v, want a result", r.Err)
	}
	// The first attempt's reply was dropped: from then on it can never be sent.
	beats.until(t, "a beat counting the late attempt's reply dropped", func(m *nats.Msg) bool {
		var hb codec.Heartbeat
		return json.Unmarshal(m.Data, &hb) == nil && hb.DroppedReplies >= 1
	})
	if err := g.NC.Flush(); err != nil {
		t.Fatal(err)
	}
	select {
	case m := <-in.ch:
		t.Fatalf("a second answer for %s", in.key(m))
	default:
	}
	if !strings.Contains(g.log(), "dispatching it again") {
		t.Errorf("the gateway never sent the request again (the hook held no claim?):\n%s", g.log())
	}
	// The worker serves on: a request without the hook, answered once.
	if r, e := g.infer(t, &codec.Request{Model: "tiny", Class: "interactive", Inputs: map[string]*codec.Tensor{"x": x}}); e != nil || r.Pool != "cpu" {
		t.Fatalf("after: %+v %v", r, e)
	}
}
