package test

import (
	"path/filepath"
	"testing"
	"time"

	"github.com/ortbus/ortbus/codec"
	"github.com/ortbus/ortbus/config"
	"github.com/ortbus/ortbus/internal/testenv"
	"github.com/ortbus/ortbus/models/onnxgen"
)

// TestPauseBatch: through a real gateway and worker, an app pauses batch for a moment:
// a batch request sent meanwhile waits (an interactive one sent after it is answered
// first), and is answered once the pause has ended on its own — after its time, with its
// result. Status lists the pause while it lasts.
func TestPauseBatch(t *testing.T) {
	t.Parallel()
	root := imageRoot(t)
	md := testenv.Models(t)
	dur := func(d time.Duration) config.Duration { return config.Duration(d) }
	c := &config.Config{
		NATS:     config.NATS{Embedded: true, Listen: "127.0.0.1:0"},
		Gateway:  config.Gateway{ShutdownGrace: dur(3 * time.Second)},
		Health:   config.Health{HeartbeatInterval: dur(gwHeartbeat), MissCount: gwMissCount},
		Security: config.Security{AllowedRoots: []string{root}},
		Classes:  map[string]*config.Class{"interactive": {Chain: []string{"p"}}, "batch": {Chain: []string{"p"}}},
		Pools: map[string]*config.Pool{"p": {Runtime: testenv.RuntimeLib(t, "1.30.0"), Threads: 1, Classes: []string{"interactive", "batch"},
			Models: []string{"tiny"}}},
		Models: map[string]*config.Model{"tiny": {Kind: config.KindRaw, Dir: filepath.Join(md, onnxgen.TinyDir)}},
	}
	g := startGateway(t, writeConfigFile(t, filepath.Join(t.TempDir(), "gateway.toml"), c))
	g.waitLive(t, "p", 1)
	pauseFor := 1500 * time.Millisecond
	b, _ := codec.Marshal(&codec.PauseRequest{Class: "batch", ForMS: pauseFor.Milliseconds()})
	m, err := g.NC.Request("ortbus.v1.pause", b, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	var pr codec.PauseReply
	if err := codec.Unmarshal(m.Data, &pr); err != nil || pr.Class != "batch" || pr.UntilUnixMS == 0 {
		t.Fatalf("pause reply %s: %+v %v", m.Data, pr, err)
	}
	until := time.UnixMilli(pr.UntilUnixMS)
	if st := g.status(t); len(st.Pauses) != 1 || st.Pauses[0].Class != "batch" {
		t.Fatalf("status pauses %+v", st.Pauses)
	}
	in := newInbox(t, g.NC)
	x := map[string]*codec.Tensor{"x": {Type: "float32", Shape: []int64{1, 4}, Data: codec.Float32Bytes([]float32{1, 2, 3, 4})}}
	g.post(t, in, "infer", "batch", &codec.Request{Model: "tiny", Class: "batch", TimeoutMS: 60_000, Inputs: x})
	g.post(t, in, "infer", "interactive", &codec.Request{Model: "tiny", Class: "interactive", Inputs: x})
	order, got := gwCollect(t, in, 2)
	if order[0] != "interactive" || order[1] != "batch" {
		t.Fatalf("answer order %v, want interactive before the paused batch", order)
	}
	for k, r := range got {
		if r.Err != nil {
			t.Fatalf("%s: %+v", k, r.Err)
		}
	}
	if now := time.Now(); now.Before(until) {
		t.Fatalf("the batch request was answered %s before its pause ended", until.Sub(now))
	}
	if st := g.status(t); len(st.Pauses) != 0 {
		t.Fatalf("status pauses after the end: %+v", st.Pauses)
	}
}
