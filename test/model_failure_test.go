package test

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ortbus/ortbus/cli"
	"github.com/ortbus/ortbus/client"
	"github.com/ortbus/ortbus/codec"
	"github.com/ortbus/ortbus/config"
	"github.com/ortbus/ortbus/internal/fault"
	"github.com/ortbus/ortbus/internal/testkit/testenv"
	"github.com/ortbus/ortbus/models/onnxgen"
)

// TestModelUnitOfFailure runs one pool of eleven models through a real gateway, its
// ortworker and ONNX Runtime 1.30.0: tiny (y = 2x+1); scalar (rank-0 input and outputs,
// which panicked the worker in its warm-up); const (no inputs: an index out of range);
// triplets (its warm-up on zeros fails, real inputs run); strings (a string Identity of
// open shape); half (a float16 output of open shape, Cast from float32); int8 (Neg of
// int8); not (Not of bool); refused (an operator ONNX Runtime does not know); panics (its warm-up panics, by
// the test-only fault switch); missing (no model.onnx). The worker starts and serves the
// eight good models, every answer worked out by hand, inline in msgpack and in JSON over
// HTTP; the three bad ones
// are answered model_unavailable with their load error in details.error; the heartbeat
// and `ortbus status` show each model's state.
func TestModelUnitOfFailure(t *testing.T) {
	t.Parallel()
	root := imageRoot(t)
	md := testenv.Models(t)
	dir := t.TempDir()
	write := func(name string, g *onnxgen.Graph) string {
		d := filepath.Join(dir, name)
		if err := g.WriteFile(filepath.Join(d, onnxgen.ModelFile)); err != nil {
			t.Fatal(err)
		}
		return d
	}
	missing := filepath.Join(dir, "missing")
	spool := filepath.Join(root, "spool")
	for _, d := range []string{missing, spool} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	int8Neg := onnxgen.NewGraph("int8_neg")
	int8Neg.AddInput("x", onnxgen.Int8, "N")
	int8Neg.AddOutput("y", onnxgen.Int8, "N")
	int8Neg.AddNode("Neg", []string{"x"}, []string{"y"})
	dur := func(d time.Duration) config.Duration { return config.Duration(d) }
	boolNot := onnxgen.NewGraph("bool_not")
	boolNot.AddInput("x", onnxgen.Bool, "N")
	boolNot.AddOutput("y", onnxgen.Bool, "N")
	boolNot.AddNode("Not", []string{"x"}, []string{"y"})
	order := []string{"tiny", "refused", "scalar", "strings", "panics", "const", "half", "triplets", "int8", "not", "missing"}
	c := &config.Config{
		NATS:     config.NATS{Embedded: true, Listen: "127.0.0.1:0"},
		Gateway:  config.Gateway{ShutdownGrace: dur(3 * time.Second)},
		Health:   config.Health{HeartbeatInterval: dur(gwHeartbeat), MissCount: gwMissCount},
		Security: config.Security{AllowedRoots: []string{root}, SpoolDir: spool},
		Classes:  map[string]*config.Class{"interactive": {Chain: []string{"pm"}}},
		Pools: map[string]*config.Pool{"pm": {Runtime: testenv.RuntimeLib(t, "1.30.0"), Threads: 1, Classes: []string{"interactive"},
			Models: order, Env: map[string]string{fault.EnvVar: "1"}}},
		Models: map[string]*config.Model{
			"tiny":     {Kind: config.KindRaw, Dir: filepath.Join(md, onnxgen.TinyDir)},
			"scalar":   {Kind: config.KindRaw, Dir: filepath.Join(md, onnxgen.ScalarDir)},
			"const":    {Kind: config.KindRaw, Dir: filepath.Join(md, onnxgen.ConstDir)},
			"triplets": {Kind: config.KindRaw, Dir: write("triplets", onnxgen.TripletsGraph())},
			"refused":  {Kind: config.KindRaw, Dir: write("refused", onnxgen.UnloadableGraph())},
			"strings":  {Kind: config.KindRaw, Dir: write("strings", onnxgen.IdentityGraph(onnxgen.String, "N"))},
			"half":     {Kind: config.KindRaw, Dir: write("half", onnxgen.CastGraph(onnxgen.Float, onnxgen.Float16, "N", 3))},
			"int8":     {Kind: config.KindRaw, Dir: write("int8", int8Neg)},
			"not":      {Kind: config.KindRaw, Dir: write("not", boolNot)},
			"panics":   {Kind: config.KindRaw, Dir: write(fault.MagicPanic, onnxgen.TinyGraph())},
			"missing":  {Kind: config.KindRaw, Dir: missing},
		},
	}
	c.SetOrder("models", order...)
	g := startGateway(t, writeConfigFile(t, filepath.Join(t.TempDir(), "gateway.toml"), c))
	live := g.waitLive(t, "pm", 1)

	f32 := func(shape []int64, v ...float32) *codec.Tensor {
		return &codec.Tensor{Type: "float32", Shape: shape, Data: codec.Float32Bytes(v)}
	}
	infer := func(req *codec.Request) gwReply {
		t.Helper()
		return g.call(t, "infer", req, gwReplyBound)
	}
	outputs := func(model string, req *codec.Request) map[string]*codec.Tensor {
		t.Helper()
		req.Model = model
		r := infer(req)
		if r.Err != nil {
			t.Fatalf("%s: %s: %s (details %v)", model, r.Err.Code, r.Err.Message, r.Err.Details)
		}
		var rep codec.InferReply
		if err := codec.Unmarshal(r.Msg.Data, &rep); err != nil {
			t.Fatal(err)
		}
		return rep.Outputs
	}
	check := func(what string, got *codec.Tensor, want *codec.Tensor) {
		t.Helper()
		if got == nil || got.Type != want.Type || !slices.Equal(got.Shape, want.Shape) || !bytes.Equal(got.Data, want.Data) {
			t.Errorf("%s = %+v, want %+v", what, got, want)
		}
	}
	i64 := func(shape []int64, v int64) *codec.Tensor {
		b, _ := json.Marshal(map[string]any{"type": "int64", "shape": shape, "data": []int64{v}})
		var x codec.Tensor
		if err := json.Unmarshal(b, &x); err != nil {
			t.Fatal(err)
		}
		return &x
	}

	// The good models, inline in msgpack.
	out := outputs("tiny", &codec.Request{Inputs: map[string]*codec.Tensor{"x": f32([]int64{1, 4}, 0, 1, -1, 0.5)}})
	check("tiny y", out["y"], f32([]int64{1, 4}, 1, 3, -1, 2))
	x := f32([]int64{2, 3}, 1, 2, 3, 4, 5, 6)
	out = outputs("scalar", &codec.Request{Inputs: map[string]*codec.Tensor{"x": x, "k": f32([]int64{}, 0.5)}})
	check("scalar sum", out["sum"], f32([]int64{}, 10.5))
	check("scalar count", out["count"], i64([]int64{}, 6))
	check("scalar y", out["y"], f32([]int64{2, 3}, 0.5, 1, 1.5, 2, 2.5, 3))
	// Only the outputs asked for; a zero-size x; a scalar given with a nil shape.
	out = outputs("scalar", &codec.Request{Inputs: map[string]*codec.Tensor{"x": f32([]int64{0, 3}), "k": f32(nil, 2)}, Outputs: []string{"sum", "y"}})
	if len(out) != 2 {
		t.Errorf("outputs sum and y asked for, got %v", out)
	}
	check("scalar sum of nothing", out["sum"], f32([]int64{}, 0))
	check("scalar y of nothing", out["y"], f32([]int64{0, 3}))
	out = outputs("const", &codec.Request{})
	check("const answer", out["answer"], i64([]int64{}, onnxgen.ConstAnswer))
	check("const table", out["table"], f32([]int64{2, 3}, onnxgen.ConstTable...))
	check("const none", out["none"], f32([]int64{0, 2}))
	out = outputs("triplets", &codec.Request{Inputs: map[string]*codec.Tensor{"x": f32([]int64{1, 6}, 1, 2, 3, 4, 5, 6)}})
	check("triplets y", out["y"], f32([]int64{2, 3}, 1, 2, 3, 4, 5, 6))
	strs := &codec.Tensor{Type: "string", Shape: []int64{3}, Strings: []string{"", "é", "日本語"}}
	out = outputs("strings", &codec.Request{Inputs: map[string]*codec.Tensor{"x": strs}})
	if y := out["y"]; y == nil || y.Type != "string" || !slices.Equal(y.Shape, strs.Shape) || !slices.Equal(y.Strings, strs.Strings) {
		t.Errorf("strings y = %+v, want %+v", y, strs)
	}
	// 1, -2.5, 0.1 in float16: 0x3c00, 0xc100, 0x2e66.
	out = outputs("half", &codec.Request{Inputs: map[string]*codec.Tensor{"x": f32([]int64{1, 3}, 1, -2.5, 0.1)}})
	check("half y", out["y"], &codec.Tensor{Type: "float16", Shape: []int64{1, 3}, Data: []byte{0x00, 0x3c, 0x00, 0xc1, 0x66, 0x2e}})
	out = outputs("int8", &codec.Request{Inputs: map[string]*codec.Tensor{"x": {Type: "int8", Shape: []int64{4}, Data: []byte{1, 0xfe, 127, 0}}}})
	check("int8 y", out["y"], &codec.Tensor{Type: "int8", Shape: []int64{4}, Data: []byte{0xff, 2, 0x81, 0}})
	out = outputs("not", &codec.Request{Inputs: map[string]*codec.Tensor{"x": {Type: "bool", Shape: []int64{3}, Data: []byte{1, 0, 1}}}})
	check("not y", out["y"], &codec.Tensor{Type: "bool", Shape: []int64{3}, Data: []byte{0, 1, 0}})

	// By path: rank-0 .npy files in and out (shape ()).
	xPath, kPath := filepath.Join(root, "x.npy"), filepath.Join(root, "k.npy")
	writeNPY(t, xPath, x)
	writeNPY(t, kPath, f32([]int64{}, 2))
	if r := infer(&codec.Request{Model: "scalar", InputPaths: map[string]string{"x": xPath, "k": kPath}, OutputDir: spool}); r.Err != nil {
		t.Fatalf("scalar by path: %+v", r.Err)
	}
	check("scalar sum by path", readNPY(t, filepath.Join(spool, "sum.npy")), f32([]int64{}, 42))
	check("scalar count by path", readNPY(t, filepath.Join(spool, "count.npy")), i64([]int64{}, 6))
	check("scalar y by path", readNPY(t, filepath.Join(spool, "y.npy")), f32([]int64{2, 3}, 2, 4, 6, 8, 10, 12))

	// In JSON over HTTP: a scalar's shape is [], never null.
	hc := &httpClient{addr: g.Ready.HTTP}
	r := hc.do(t, t.Context(), "POST", "/v1/infer", `{"model":"scalar","inputs":{"x":{"type":"float32","shape":[1,3],"data":[1,2,3]},"k":{"type":"float32","shape":[],"data":[-1]}},"outputs":["sum","count"]}`)
	var hr struct {
		Outputs map[string]json.RawMessage `json:"outputs"`
	}
	if r.status != 200 || json.Unmarshal(r.body, &hr) != nil {
		t.Fatalf("HTTP infer of scalar: %d %s", r.status, r.body)
	}
	if s, c := string(hr.Outputs["sum"]), string(hr.Outputs["count"]); s != `{"type":"float32","shape":[],"data":[-6]}` || c != `{"type":"int64","shape":[],"data":[3]}` {
		t.Errorf("HTTP infer of scalar: sum %s count %s", s, c)
	}
	r = hc.do(t, t.Context(), "POST", "/v1/infer", `{"model":"const","outputs":["answer"]}`)
	if r.status != 200 || !strings.Contains(string(r.body), `"answer":{"type":"int64","shape":[],"data":[42]}`) {
		t.Errorf("HTTP infer of const: %d %s", r.status, r.body)
	}

	// The bad models: model_unavailable (503), the load error in details.error.
	for model, want := range map[string]struct {
		code codec.Code
		text string
	}{
		"refused": {codec.CodeModelUnavailable, "NoSuchOp"},
		"panics":  {codec.CodeInternal, "panic while loading model panics"},
		"missing": {codec.CodeFileNotFound, "model.onnx not found"},
	} {
		r := infer(&codec.Request{Model: model})
		if r.Err == nil || r.Err.Code != codec.CodeModelUnavailable {
			t.Errorf("%s: %+v, want model_unavailable", model, r.Err)
			continue
		}
		le, _ := r.Err.Details["error"].(map[string]any)
		if r.Err.Details["model"] != model || r.Err.Details["pool"] != "pm" || le == nil || le["code"] != string(want.code) || !strings.Contains(le["message"].(string), want.text) {
			t.Errorf("%s: details %v, want model, pool and a load error %s with %q", model, r.Err.Details, want.code, want.text)
		}
		t.Logf("%s: %s: %s", model, r.Err.Code, r.Err.Message)
	}
	r = hc.do(t, t.Context(), "POST", "/v1/infer", `{"model":"refused","inputs":{"x":{"type":"float32","shape":[2],"data":[1,2]}}}`)
	if r.status != 503 || !strings.Contains(string(r.body), `"code":"model_unavailable"`) {
		t.Errorf("HTTP infer of refused: %d %s, want 503 model_unavailable", r.status, r.body)
	}

	// Status: each model's state in the worker's heartbeat, and in `ortbus status`.
	var wk codec.WorkerStatus
	for _, w := range live {
		wk = w
	}
	states := map[string]codec.ModelStatus{}
	for _, m := range wk.Models {
		states[m.Name] = m
	}
	for _, name := range order {
		m := states[name]
		want := codec.ModelReady
		if name == "refused" || name == "panics" || name == "missing" {
			want = codec.ModelFailed
		}
		if m.State != want || m.Loaded != (want == codec.ModelReady) || (want == codec.ModelFailed) != (m.Error != nil) {
			t.Errorf("status of %s: %+v, want %s", name, m, want)
		}
	}
	if states["triplets"].WarmupError == "" || states["tiny"].WarmupError != "" {
		t.Errorf("warm-up errors: triplets %q tiny %q, want triplets' alone", states["triplets"].WarmupError, states["tiny"].WarmupError)
	}
	if wk.Panics == 0 {
		t.Error("the warm-up panic was not counted in the heartbeat's panics")
	}
	var buf bytes.Buffer
	cli.PrintStatus(&buf, g.status(t))
	text := buf.String()
	t.Logf("ortbus status:\n%s", text)
	if !strings.Contains(text, "ok; failed models: refused,panics,missing") {
		t.Error("ortbus status does not name the pool's failed models")
	}
	rows := map[string][]string{}
	for line := range strings.Lines(text) {
		if f := strings.Fields(line); len(f) >= 4 && f[1] == "pm" && f[2] == wk.Worker {
			rows[f[0]] = f[3:]
		}
	}
	for name, m := range states {
		row := rows[name]
		if len(row) == 0 || row[0] != m.State || m.Error != nil && !strings.Contains(strings.Join(row, " "), string(m.Error.Code)+": ") {
			t.Errorf("ortbus status: model %s's row %q, want state %s and its error's code", name, row, m.State)
		}
	}
}

// TestModelCrashWhileLoading: a model whose load kills its worker natively (a real
// SIGSEGV, by the test-only fault switch) costs one restart, not a crash loop: the worker
// said which model it was loading, its supervisor skips that model from then on, and the
// restarted worker serves the pool's other models — one before the crashing model in the
// pool's order, one after it — while the crashing one is answered model_unavailable with
// the reason. Without the skip the pool crash-loops and serves nothing.
func TestModelCrashWhileLoading(t *testing.T) {
	t.Parallel()
	root := imageRoot(t)
	md := testenv.Models(t)
	crashDir := filepath.Join(t.TempDir(), fault.MagicSegv)
	if err := onnxgen.TinyGraph().WriteFile(filepath.Join(crashDir, onnxgen.ModelFile)); err != nil {
		t.Fatal(err)
	}
	dur := func(d time.Duration) config.Duration { return config.Duration(d) }
	order := []string{"tiny", "crashes", "scalar"}
	c := &config.Config{
		NATS:     config.NATS{Embedded: true, Listen: "127.0.0.1:0"},
		Gateway:  config.Gateway{ShutdownGrace: dur(3 * time.Second)},
		Health:   config.Health{HeartbeatInterval: dur(gwHeartbeat), MissCount: gwMissCount},
		Security: config.Security{AllowedRoots: []string{root}},
		Classes:  map[string]*config.Class{"interactive": {Chain: []string{"pc"}}},
		Pools: map[string]*config.Pool{"pc": {Runtime: testenv.RuntimeLib(t, "1.30.0"), Threads: 1, Classes: []string{"interactive"},
			Models: order, Env: map[string]string{fault.EnvVar: "1"}}},
		Models: map[string]*config.Model{
			"tiny":    {Kind: config.KindRaw, Dir: filepath.Join(md, onnxgen.TinyDir)},
			"crashes": {Kind: config.KindRaw, Dir: crashDir},
			"scalar":  {Kind: config.KindRaw, Dir: filepath.Join(md, onnxgen.ScalarDir)},
		},
	}
	c.SetOrder("models", order...)
	g := startGateway(t, writeConfigFile(t, filepath.Join(t.TempDir(), "gateway.toml"), c))
	var wk codec.WorkerStatus
	for _, w := range g.waitLive(t, "pc", 1) {
		wk = w
	}

	st := g.status(t)
	var pool codec.PoolStatus
	for _, p := range st.Pools {
		if p.Name == "pc" {
			pool = p
		}
	}
	if pool.CrashLooping || !strings.Contains(pool.Skipped["crashes"], "died while loading it") || len(pool.Skipped) != 1 {
		t.Fatalf("pool pc: crash-looping %v, skipped %v; want crashes skipped alone", pool.CrashLooping, pool.Skipped)
	}
	if wk.Restarts != 1 || !strings.Contains(wk.Worker, "-r1@") {
		t.Errorf("worker %s restarted %d times, want once", wk.Worker, wk.Restarts)
	}
	states := map[string]codec.ModelStatus{}
	for _, m := range wk.Models {
		states[m.Name] = m
	}
	if m := states["crashes"]; m.State != codec.ModelFailed || m.Error == nil || m.Error.Code != codec.CodeWorkerLost || !strings.Contains(m.Error.Message, "died while loading it") {
		t.Errorf("crashes in the heartbeat: %+v, want failed, worker_lost, the reason", m)
	}
	for _, name := range []string{"tiny", "scalar"} {
		if states[name].State != codec.ModelReady {
			t.Errorf("%s in the heartbeat: %+v, want ready", name, states[name])
		}
	}

	x := &codec.Tensor{Type: "float32", Shape: []int64{1, 4}, Data: codec.Float32Bytes([]float32{1, 2, 3, 4})}
	r := g.call(t, "infer", &codec.Request{Model: "tiny", Inputs: map[string]*codec.Tensor{"x": x}}, gwReplyBound)
	var rep codec.InferReply
	if r.Err != nil || codec.Unmarshal(r.Msg.Data, &rep) != nil || !bytes.Equal(rep.Outputs["y"].Data, codec.Float32Bytes([]float32{3, 5, 7, 9})) {
		t.Fatalf("tiny after the crash: %+v", r.Err)
	}
	r = g.call(t, "infer", &codec.Request{Model: "crashes", Inputs: map[string]*codec.Tensor{"x": x}}, gwReplyBound)
	le, _ := r.Err.Details["error"].(map[string]any)
	if r.Err == nil || r.Err.Code != codec.CodeModelUnavailable || le == nil || le["code"] != string(codec.CodeWorkerLost) {
		t.Fatalf("crashes: %+v, want model_unavailable with the worker_lost load error", r.Err)
	}
	var buf bytes.Buffer
	cli.PrintStatus(&buf, st)
	if !strings.Contains(buf.String(), "skipped (a worker died loading them): crashes") {
		t.Errorf("ortbus status does not name the skipped model:\n%s", buf.String())
	}
}

// TestModelCrashWhileLoadingInPlace: `ortbus model load` of a model whose load crashes
// the worker natively (fault.MagicSegv) into a running pool of one worker. The crash
// costs one restart, not a crash loop: the change's reply names the failure, the
// restarted worker skips the model (the gateway remembers it), the pool serves its other
// model, and a request for the crashing one is answered model_unavailable.
func TestModelCrashWhileLoadingInPlace(t *testing.T) {
	t.Parallel()
	root := imageRoot(t)
	crashDir := filepath.Join(t.TempDir(), fault.MagicSegv)
	if err := onnxgen.TinyGraph().WriteFile(filepath.Join(crashDir, onnxgen.ModelFile)); err != nil {
		t.Fatal(err)
	}
	c := tinyConfig(t, root, "pc", 5*time.Second, "interactive")
	c.Pools["pc"].Env = map[string]string{fault.EnvVar: "1"}
	c.Models["crashes"] = &config.Model{Kind: config.KindRaw, Dir: crashDir}
	c.SetOrder("models", "tiny", "crashes")
	g := startGateway(t, writeConfigFile(t, filepath.Join(t.TempDir(), "gateway.toml"), c))
	g.waitLive(t, "pc", 1)
	first := onlyWorker(t, g, "pc")

	rep, err := client.New(g.NC).Model(t.Context(), &codec.ModelControl{Action: codec.ModelLoad, Model: "crashes", Pool: "pc"})
	if err == nil && len(rep.Failed) == 0 {
		t.Fatalf("model load of a model that crashes its worker: %+v, want the failure named", rep)
	}
	t.Logf("model load: %+v %v", rep, err)

	var wk codec.WorkerStatus
	g.waitStatus(t, "the worker restarted, crashes skipped", func(st *codec.StatusReply) bool {
		for _, p := range st.Pools {
			if p.Name == "pc" && (p.CrashLooping || !strings.Contains(p.Skipped["crashes"], "died while loading it")) {
				return false
			}
		}
		for _, w := range gwLive(st, "pc") {
			wk = w
			return w.PID != first.PID && w.Restarts == 1
		}
		return false
	})
	states := map[string]codec.ModelStatus{}
	for _, m := range wk.Models {
		states[m.Name] = m
	}
	if states["tiny"].State != codec.ModelReady {
		t.Errorf("tiny on the restarted worker: %+v, want ready", states["tiny"])
	}
	x := &codec.Tensor{Type: "float32", Shape: []int64{1, 4}, Data: codec.Float32Bytes([]float32{1, 2, 3, 4})}
	r := g.call(t, "infer", &codec.Request{Model: "tiny", Inputs: map[string]*codec.Tensor{"x": x}}, gwReplyBound)
	var out codec.InferReply
	if r.Err != nil || codec.Unmarshal(r.Msg.Data, &out) != nil || !bytes.Equal(out.Outputs["y"].Data, codec.Float32Bytes([]float32{3, 5, 7, 9})) {
		t.Fatalf("tiny after the crash: %+v", r.Err)
	}
	r = g.call(t, "infer", &codec.Request{Model: "crashes", Inputs: map[string]*codec.Tensor{"x": x}}, gwReplyBound)
	if r.Err == nil || r.Err.Code != codec.CodeModelUnavailable {
		t.Fatalf("crashes after its crash: %+v, want model_unavailable", r.Err)
	}
}
