package test

import (
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ortbus/ortbus/client"
	"github.com/ortbus/ortbus/codec"
	"github.com/ortbus/ortbus/config"
	"github.com/ortbus/ortbus/internal/testkit/testenv"
	"github.com/ortbus/ortbus/models/onnxgen"
)

// TestModelUnloadUnderTraffic: a real gateway, its one worker and ONNX Runtime; the slow
// tagger (about 110 ms a run) is unloaded while requests for it keep coming, one of them
// running on the worker at that moment. Every request gets exactly one answer: its
// result (the one running, and what the worker had accepted, run to the end on the
// unloaded model's copy), or unknown_model / model_unavailable (the ones after), never a
// timeout, a lost worker or an internal error; the worker is the same process afterwards
// (its sessions were not closed under the running call: no crash), and the pool's other
// model serves throughout.
func TestModelUnloadUnderTraffic(t *testing.T) {
	t.Parallel()
	root := imageRoot(t)
	c := tinyConfig(t, root, "pu", 5*time.Second, "interactive")
	c.Models[gwSlow] = &config.Model{Kind: config.KindTaggerPixAI, Dir: gwSlowTaggerDir(t)}
	c.Pools["pu"].Models = []string{"tiny", gwSlow}
	c.SetOrder("models", "tiny", gwSlow)
	g := startGateway(t, writeConfigFile(t, filepath.Join(t.TempDir(), "gateway.toml"), c))
	g.waitLive(t, "pu", 1)
	first := onlyWorker(t, g, "pu")
	cl := client.New(g.NC)
	in := newInbox(t, g.NC)
	red := colourPNG(t, root, "red")

	posted := 0
	slow := func(prefix string) string {
		posted++
		key := fmt.Sprint(prefix, posted)
		g.post(t, in, "tag", key, &codec.Request{Model: gwSlow, Path: red, TimeoutMS: 120_000})
		return key
	}
	before := map[string]bool{}
	for range 4 {
		before[slow("b")] = true
	}
	// One of them runs on the worker now.
	g.waitStatus(t, "a request running on the worker", func(st *codec.StatusReply) bool {
		for _, w := range gwLive(st, "pu") {
			return w.Running["interactive"] > 0
		}
		return false
	})
	type result struct {
		rep *codec.ReloadReply
		err error
	}
	done := make(chan result, 1)
	go func() {
		rep, err := cl.Model(t.Context(), &codec.ModelControl{Action: codec.ModelUnload, Model: gwSlow, Pool: "pu"})
		done <- result{rep, err}
	}()
	var r result
	for waiting := true; waiting; {
		slow("d")
		select {
		case r = <-done:
			waiting = false
		case <-time.After(20 * time.Millisecond):
		}
	}
	if r.err != nil || r.rep.Models["pu"] != "models -"+gwSlow || len(r.rep.Replaced) != 0 || len(r.rep.Failed) != 0 {
		t.Fatalf("model unload %s: %+v %v, want pu's model unloaded in place", gwSlow, r.rep, r.err)
	}
	after := map[string]bool{}
	for range 3 {
		after[slow("a")] = true
	}

	_, got := gwCollect(t, in, posted) // each exactly once (gwCollect fails on a second)
	counts := map[string]int{}
	for k, rep := range got {
		code := rep.code()
		counts[code]++
		switch {
		case code != "ok" && code != string(codec.CodeUnknownModel) && code != string(codec.CodeModelUnavailable):
			t.Errorf("%s: %s %+v: want its result, unknown_model or model_unavailable", k, code, rep.Err)
		case after[k] && code != string(codec.CodeUnknownModel):
			t.Errorf("%s, posted after the unload: %s, want unknown_model", k, code)
		}
	}
	okBefore := 0
	for k := range before {
		if got[k].Err == nil {
			okBefore++
		}
	}
	if okBefore == 0 {
		t.Errorf("none of the requests posted before the unload (one of them running at it) got its result: %v", counts)
	}
	t.Logf("%d requests for %s across its unload: %v", posted, gwSlow, counts)

	if w := onlyWorker(t, g, "pu"); w.Worker != first.Worker || w.PID != first.PID || w.Restarts != 0 {
		t.Errorf("after the unload the worker is %s (pid %d, %d restarts), want %s (pid %d) kept", w.Worker, w.PID, w.Restarts, first.Worker, first.PID)
	}
	if rep := g.call(t, "infer", tinyRequest(), gwReplyBound); rep.Err != nil {
		t.Errorf("tiny after the unload: %+v", rep.Err)
	}
	if st := g.status(t); len(st.Pools) != 1 || len(st.Pools[0].Unloaded) != 1 || st.Pools[0].Unloaded[0] != gwSlow {
		t.Errorf("status after the unload: pools %+v, want %s unloaded", st.Pools, gwSlow)
	}
}

// TestModelLoadOverBudget: memory admission refuses, before anything loads, a change
// whose models do not fit the device's budget (1 GiB of capacity here): `model load` of a
// model of 4 GiB declared, and a file reload that adds it beside a model that would fit
// — both overloaded, naming the device, and nothing of either applied (the small model
// stays unloaded, the big one unknown, the worker the same process). A change that fits
// is applied afterwards.
func TestModelLoadOverBudget(t *testing.T) {
	t.Parallel()
	c := tinyConfig(t, imageRoot(t), "pb", 5*time.Second, "interactive")
	c.Devices = map[string]config.Device{"cpu": {Capacity: 1 << 30}}
	c.Models["big"] = &config.Model{Kind: config.KindRaw, Dir: filepath.Join(testenv.Models(t), onnxgen.TinyDir), Memory: 4 << 30}
	c.Models["scalar"] = &config.Model{Kind: config.KindRaw, Dir: filepath.Join(testenv.Models(t), onnxgen.ScalarDir)}
	c.SetOrder("models", "tiny", "big", "scalar")
	cfgPath := writeConfigFile(t, filepath.Join(t.TempDir(), "gateway.toml"), c)
	g := startGateway(t, cfgPath)
	g.waitLive(t, "pb", 1)
	first := onlyWorker(t, g, "pb")
	cl := client.New(g.NC)
	ctx := t.Context()

	refused := func(what string, rep *codec.ReloadReply, err error) {
		t.Helper()
		if err == nil || codec.CodeOf(err) != codec.CodeOverloaded || !strings.Contains(err.Error(), "device cpu") || !strings.Contains(err.Error(), "nothing was changed") {
			t.Fatalf("%s: %+v %v, want refused overloaded naming device cpu", what, rep, err)
		}
	}
	rep, err := cl.Model(ctx, &codec.ModelControl{Action: codec.ModelLoad, Model: "big", Pool: "pb"})
	refused("model load big", rep, err)

	c.Pools["pb"].Models = []string{"tiny", "scalar", "big"}
	writeConfigFile(t, cfgPath, c)
	rep, err = cl.Reload(ctx)
	refused("reload of a file adding scalar and big", rep, err)

	for _, m := range []string{"big", "scalar"} {
		r := g.call(t, "infer", &codec.Request{Model: m, Inputs: map[string]*codec.Tensor{
			"x": {Type: "float32", Shape: []int64{1, 3}, Data: codec.Float32Bytes([]float32{1, 2, 3})}}}, gwReplyBound)
		if r.Err == nil || r.Err.Code != codec.CodeUnknownModel {
			t.Errorf("%s after the refused changes: %+v, want unknown_model (nothing applied)", m, r.Err)
		}
	}
	if rep := g.call(t, "infer", tinyRequest(), gwReplyBound); rep.Err != nil {
		t.Errorf("tiny after the refused changes: %+v", rep.Err)
	}
	w := onlyWorker(t, g, "pb")
	if w.Worker != first.Worker || w.PID != first.PID || len(w.Models) != 1 || w.Models[0].Name != "tiny" {
		t.Errorf("the worker after the refused changes: %s pid %d models %+v, want %s pid %d with tiny alone", w.Worker, w.PID, w.Models, first.Worker, first.PID)
	}

	// What fits is applied: the file without big, reloaded.
	c.Pools["pb"].Models = []string{"tiny", "scalar"}
	writeConfigFile(t, cfgPath, c)
	if rep, err := cl.Reload(ctx); err != nil || rep.Models["pb"] != "models +scalar" || len(rep.Failed) != 0 {
		t.Fatalf("reload of a file adding scalar: %+v %v", rep, err)
	}
	if w := onlyWorker(t, g, "pb"); w.PID != first.PID || !modelReady(map[string]codec.WorkerStatus{w.Worker: w}, "scalar") {
		t.Errorf("after scalar's load: pid %d, models %+v, want pid %d with scalar ready", w.PID, w.Models, first.PID)
	}
}

// tinyRequest is an infer request for the tiny model.
func tinyRequest() *codec.Request {
	return &codec.Request{Model: "tiny", TimeoutMS: 120_000,
		Inputs: map[string]*codec.Tensor{"x": {Type: "float32", Shape: []int64{1, 4}, Data: codec.Float32Bytes([]float32{1, 2, 3, 4})}}}
}
