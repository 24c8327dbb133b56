package test

import (
	"fmt"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ortbus/ortbus/client"
	"github.com/ortbus/ortbus/codec"
	"github.com/ortbus/ortbus/config"
	"github.com/ortbus/ortbus/internal/testkit/testenv"
	"github.com/ortbus/ortbus/models/onnxgen"
)

// TestModelsChangeWithoutRestart runs a real gateway, its one worker and ONNX Runtime
// while the pool's models change under traffic, in place — the same worker process
// throughout (its id and PID), never restarted:
//   - `model load scalar` into the running pool of one worker: scalar is served
//     afterwards, tiny throughout;
//   - `model unload scalar`: scalar is unknown afterwards, tiny served throughout;
//   - the config file edited to load scalar, then SIGHUP: scalar served again;
//   - the file edited in a way a reload cannot apply ([health]): refused by `ortbus
//     reload`, naming it, the configuration in force kept;
//   - `model reload tiny` under tiny's own traffic: a new copy loaded (the worker's
//     sessions_created grows) and swapped in by the same worker, 0 requests failed;
//   - a pool added by the file, then the first removed: tiny moves to the new pool.
//
// Requests for tiny are posted while each change is applied; every one of them is
// answered exactly once, with its result: nothing is lost while models change.
func TestModelsChangeWithoutRestart(t *testing.T) {
	t.Parallel()
	dur := func(d time.Duration) config.Duration { return config.Duration(d) }
	c := tinyConfig(t, imageRoot(t), "pr", 5*time.Second, "interactive")
	c.Models["scalar"] = &config.Model{Kind: config.KindRaw, Dir: filepath.Join(testenv.Models(t), onnxgen.ScalarDir)}
	c.SetOrder("models", "tiny", "scalar")
	cfgPath := writeConfigFile(t, filepath.Join(t.TempDir(), "gateway.toml"), c)
	g := startGateway(t, cfgPath)
	g.waitLive(t, "pr", 1)
	cl := client.New(g.NC)
	in := newInbox(t, g.NC)

	posted := 0
	tiny := func() {
		posted++
		g.post(t, in, "infer", fmt.Sprint("t", posted), &codec.Request{Model: "tiny", TimeoutMS: 120_000,
			Inputs: map[string]*codec.Tensor{"x": {Type: "float32", Shape: []int64{1, 4}, Data: codec.Float32Bytes([]float32{1, 2, 3, 4})}}})
	}
	// under runs change while tiny requests are posted, and returns its reply.
	under := func(what string, change func() (*codec.ReloadReply, error)) (*codec.ReloadReply, error) {
		t.Helper()
		type result struct {
			rep *codec.ReloadReply
			err error
		}
		done := make(chan result, 1)
		go func() { rep, err := change(); done <- result{rep, err} }()
		for {
			tiny()
			select {
			case r := <-done:
				t.Logf("%s: %+v %v (%d tiny requests posted so far)", what, r.rep, r.err, posted)
				return r.rep, r.err
			case <-time.After(20 * time.Millisecond):
			}
		}
	}
	scalar := func() gwReply {
		t.Helper()
		return g.call(t, "infer", &codec.Request{Model: "scalar", Inputs: map[string]*codec.Tensor{
			"x": {Type: "float32", Shape: []int64{1, 3}, Data: codec.Float32Bytes([]float32{1, 2, 3})},
			"k": {Type: "float32", Shape: []int64{}, Data: codec.Float32Bytes([]float32{0.5})}}, Outputs: []string{"sum"}}, gwReplyBound)
	}
	wantScalar := func(when string) {
		t.Helper()
		r := scalar()
		var rep codec.InferReply
		if r.Err != nil || codec.Unmarshal(r.Msg.Data, &rep) != nil || rep.Outputs["sum"] == nil ||
			string(rep.Outputs["sum"].Data) != string(codec.Float32Bytes([]float32{3})) {
			t.Fatalf("%s: scalar %+v, want sum 3 (0.5 × (1+2+3))", when, r.Err)
		}
	}
	if r := scalar(); r.Err == nil || r.Err.Code != codec.CodeUnknownModel {
		t.Fatalf("scalar before it is loaded: %+v, want unknown_model", r.Err)
	}
	// The pool's one worker, which every change below keeps.
	first := onlyWorker(t, g, "pr")
	same := func(when string) codec.WorkerStatus {
		t.Helper()
		w := onlyWorker(t, g, "pr")
		if w.Worker != first.Worker || w.PID != first.PID || w.Restarts != 0 {
			t.Fatalf("%s: the pool's worker is %s (pid %d, %d restarts), want %s (pid %d) kept", when, w.Worker, w.PID, w.Restarts, first.Worker, first.PID)
		}
		return w
	}
	inPlace := func(what string, rep *codec.ReloadReply, err error, want string) {
		t.Helper()
		if err != nil || rep.Models["pr"] != want || len(rep.Replaced) != 0 || len(rep.Failed) != 0 {
			t.Fatalf("%s: %+v %v, want pr's models changed in place (%q), nothing replaced or failed", what, rep, err, want)
		}
	}

	ctx := t.Context()
	rep, err := under("model load scalar", func() (*codec.ReloadReply, error) {
		return cl.Model(ctx, &codec.ModelControl{Action: codec.ModelLoad, Model: "scalar", Pool: "pr"})
	})
	inPlace("model load scalar", rep, err, "models +scalar")
	wantScalar("after model load")
	same("after model load")

	rep, err = under("model unload scalar", func() (*codec.ReloadReply, error) {
		return cl.Model(ctx, &codec.ModelControl{Action: codec.ModelUnload, Model: "scalar"})
	})
	inPlace("model unload scalar", rep, err, "models -scalar")
	same("after model unload")
	if r := scalar(); r.Err == nil || r.Err.Code != codec.CodeUnknownModel {
		t.Fatalf("scalar after its unload: %+v, want unknown_model", r.Err)
	}

	// The file edited, then SIGHUP.
	c.Pools["pr"].Models = []string{"tiny", "scalar"}
	writeConfigFile(t, cfgPath, c)
	if err := g.lp.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	// The worker has scalar ready (its heartbeat) a moment before routing knows it (the
	// change's last step): served is the proof.
	for n := 0; ; n++ {
		tiny()
		st := g.status(t)
		if w := gwLive(st, "pr"); len(w) == 1 && modelReady(w, "scalar") && scalar().Err == nil {
			break
		}
		if n > int(gwReplyBound/(20*time.Millisecond)) {
			t.Fatal("scalar never served after the file's edit and SIGHUP")
		}
		time.Sleep(20 * time.Millisecond)
	}
	wantScalar("after SIGHUP")
	same("after SIGHUP")

	// What a reload cannot apply: refused, named, nothing changed.
	c.Health.HeartbeatInterval = dur(2 * gwHeartbeat)
	writeConfigFile(t, cfgPath, c)
	if _, err := cl.Reload(ctx); err == nil || !strings.Contains(err.Error(), "[health]") || codec.CodeOf(err) != codec.CodeBadRequest {
		t.Fatalf("reload of a [health] change: %v, want bad_request naming [health]", err)
	}
	wantScalar("after the refused reload")
	c.Health.HeartbeatInterval = dur(gwHeartbeat)
	writeConfigFile(t, cfgPath, c)
	if rep, err := cl.Reload(ctx); err != nil || rep.Changes != "no change" {
		t.Fatalf("reload of the file in force: %+v %v", rep, err)
	}

	// Unloaded at run time from what the file gives the pool: status says so, and a reload
	// of the file loads it again.
	if _, err := under("model unload scalar (in the file)", func() (*codec.ReloadReply, error) {
		return cl.Model(ctx, &codec.ModelControl{Action: codec.ModelUnload, Model: "scalar", Pool: "pr"})
	}); err != nil {
		t.Fatal(err)
	}
	if st := g.status(t); len(st.Pools) != 1 || len(st.Pools[0].Unloaded) != 1 || st.Pools[0].Unloaded[0] != "scalar" {
		t.Fatalf("status after the unload: %+v, want scalar unloaded", st.Pools)
	}
	rep, err = under("reload of the file", func() (*codec.ReloadReply, error) { return cl.Reload(ctx) })
	inPlace("reload after the unload", rep, err, "models +scalar")
	wantScalar("after the file's reload")
	if st := g.status(t); len(st.Pools[0].Unloaded) != 0 {
		t.Fatalf("status after the reload: unloaded %v", st.Pools[0].Unloaded)
	}

	// Reloaded under its own traffic: a new copy, in the same worker, no request failed
	// (checked with every tiny request at the end).
	before := same("before model reload")
	rep, err = under("model reload tiny", func() (*codec.ReloadReply, error) {
		return cl.Model(ctx, &codec.ModelControl{Action: codec.ModelReload, Model: "tiny"})
	})
	inPlace("model reload tiny", rep, err, "model tiny reloaded")
	if after := same("after model reload"); after.SessionsCreated <= before.SessionsCreated {
		t.Errorf("model reload tiny: the worker's sessions_created %d → %d: no new copy loaded", before.SessionsCreated, after.SessionsCreated)
	}
	wantScalar("after model reload tiny")

	// A pool added by the file, then the first one removed: tiny moves to the new pool
	// under traffic.
	c.Pools["p2"] = &config.Pool{Runtime: testenv.RuntimeLib(t, "1.30.0"), Threads: 1, Classes: []string{"interactive"}, Models: []string{"tiny"}}
	c.Classes["interactive"].Chain = []string{"pr", "p2"}
	writeConfigFile(t, cfgPath, c)
	rep, err = under("reload: pool p2 added", func() (*codec.ReloadReply, error) { return cl.Reload(ctx) })
	if err != nil || len(rep.Added) != 1 || rep.Added[0] != "p2" {
		t.Fatalf("reload adding p2: %+v %v", rep, err)
	}
	g.waitLive(t, "p2", 1)
	delete(c.Pools, "pr")
	c.Classes["interactive"].Chain = []string{"p2"}
	writeConfigFile(t, cfgPath, c)
	rep, err = under("reload: pool pr removed", func() (*codec.ReloadReply, error) { return cl.Reload(ctx) })
	if err != nil || len(rep.Removed) != 1 || rep.Removed[0] != "pr" {
		t.Fatalf("reload removing pr: %+v %v", rep, err)
	}
	for range 5 {
		tiny()
	}
	if st := g.status(t); len(gwLive(st, "pr")) != 0 || len(st.Pools) != 1 || st.Pools[0].Name != "p2" {
		t.Errorf("after pr's removal: pools %+v, live in pr %d", st.Pools, len(gwLive(st, "pr")))
	}

	// Every tiny request: exactly one answer (gwCollect fails on a second), its result.
	_, got := gwCollect(t, in, posted)
	for k, r := range got {
		if r.Err != nil {
			t.Errorf("%s: %s: %s", k, r.Err.Code, r.Err.Message)
		}
	}
	t.Logf("%d tiny requests across the changes, all answered once", posted)
}

// onlyWorker is the one live worker of pool, as status shows it.
func onlyWorker(t *testing.T, g *gatewayProc, pool string) codec.WorkerStatus {
	t.Helper()
	live := gwLive(g.status(t), pool)
	if len(live) != 1 {
		t.Fatalf("pool %s has %d live workers, want 1", pool, len(live))
	}
	for _, w := range live {
		return w
	}
	panic("unreachable")
}

// modelReady reports whether a live worker of workers has model ready.
func modelReady(workers map[string]codec.WorkerStatus, model string) bool {
	for _, w := range workers {
		for _, m := range w.Models {
			if m.Name == model && m.State == codec.ModelReady {
				return true
			}
		}
	}
	return false
}
