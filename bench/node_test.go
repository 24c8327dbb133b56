package bench

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ortbus/ortbus/codec"
	"github.com/ortbus/ortbus/internal/testkit/testenv"
	"github.com/ortbus/ortbus/models/onnxgen"
)

// TestParseNodeChunk: the runner's last line is its measurement; anything else is an
// error that quotes what it printed.
func TestParseNodeChunk(t *testing.T) {
	c, err := parseNodeChunk([]byte("a warning\n" + `{"items":54,"seconds":1.01,"cpu_s":1.2,"warm_items":12,"load_s":0.12,"runtime":"bun 1.4.5","onnxruntime_node":"1.30.0","threads":1,"spin":"default"}` + "\n"))
	if err != nil || c.Items != 54 || c.Seconds != 1.01 || c.Runtime != "bun 1.4.5" || c.Version != "1.30.0" || c.Spin != "default" {
		t.Fatalf("%+v %v", c, err)
	}
	for _, out := range []string{"", "TypeError: x\n", `{"items":3}`} {
		if _, err := parseNodeChunk([]byte(out)); err == nil {
			t.Errorf("%q: no error", out)
		}
	}
}

// TestFindNodeBenchMissing: without the install, the error says what is missing and how
// to install it.
func TestFindNodeBenchMissing(t *testing.T) {
	_, err := findNodeBench(&Options{Repo: t.TempDir()})
	if !errors.Is(err, errNodeBenchMissing) || !strings.Contains(err.Error(), "make node-bench") {
		t.Fatalf("err = %v", err)
	}
}

// TestNodeBenchRun runs the runner on the tiny model for a moment, spinning and not, when
// `make node-bench` has installed it (make test does; skipped otherwise).
func TestNodeBenchRun(t *testing.T) {
	root, err := FindRepo()
	if err != nil {
		t.Fatal(err)
	}
	nb, err := findNodeBench(&Options{Repo: root})
	if errors.Is(err, errNodeBenchMissing) {
		testenv.Unavailable(t, err.Error()) // a go test run without `make node-bench` (make test installs it)
	}
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	model := filepath.Join(dir, "model.onnx")
	if err := os.WriteFile(model, onnxgen.TinyGraph().Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	x := &codec.Tensor{Type: "float32", Shape: []int64{1, onnxgen.TinyDim}, Data: codec.Float32Bytes(make([]float32, onnxgen.TinyDim))}
	inputs, err := writeNodeInputs(dir, "tiny", []nodeInput{{"x", x}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for _, spin := range []bool{true, false} {
		c, err := nb.run(ctx, model, inputs, 1, spin, "cpu", 20*time.Millisecond, 100*time.Millisecond)
		if err != nil {
			t.Fatal(err)
		}
		if c.Items == 0 || c.Seconds < 0.1 || c.Version != NodeBenchVersion || !strings.HasPrefix(c.Runtime, "bun ") || (c.Spin == "default") != spin || c.EP != "cpu" || c.FirstMS != 0 {
			t.Fatalf("spin %v: %+v", spin, c)
		}
	}
	if _, err := nb.run(ctx, model, []string{"x=" + filepath.Join(dir, "missing.npy")}, 1, true, "cpu", 0, 10*time.Millisecond); err == nil {
		t.Fatal("a missing input file: no error")
	}
	// On webgpu (where the Vulkan loader is: lavapipe without a GPU), the runner's session
	// is webgpu's and its first call comes before the warm-up.
	testenv.RequireVulkan(t) // the rest, only where Vulkan lists an adapter (always under CI)
	restore, err := webgpuEnv(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer restore()
	c, err := nb.run(ctx, model, inputs, 1, true, "webgpu", 20*time.Millisecond, 100*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	if c.EP != "webgpu" || c.FirstMS <= 0 || c.Items == 0 || c.WarmItems < 1 {
		t.Fatalf("webgpu: %+v", c)
	}
}

// TestThroughputPrintNode: with the node paths the table has their columns and verdicts;
// skipped, it says so and why, and has none.
func TestThroughputPrintNode(t *testing.T) {
	tms := []tpModel{{name: heavyModel, threads: 1}}
	mk := func(skipped string) *ThroughputResults {
		rate := func(v float64) Rate { return Rate{ItemsPerS: v, ByModel: map[string]float64{heavyModel: v}} }
		res := &ThroughputResults{Model: heavyModel, InProcess: rate(10), System: rate(9), SystemBatched: rate(11),
			Ratios: map[string]ThroughputRatios{heavyModel: {SystemOverInProcess: 0.9, SystemBatchedOverInProcess: 1.1}},
			Models: map[string]ThroughputModel{heavyModel: {MeanBatch: 8}}}
		res.Setup.Node.Skipped = skipped
		if skipped == "" {
			res.Node, res.NodeNoSpin = rate(12), rate(10)
			r := res.Ratios[heavyModel]
			r.InProcessOverNode, r.SystemOverNode, r.SystemBatchedOverNode = 0.833, 0.75, 0.917
			res.Ratios[heavyModel] = r
			res.Setup.Node.Runner, res.Setup.Node.OnnxruntimeNode = "bun 1.4.5", NodeBenchVersion
		}
		return res
	}
	var out strings.Builder
	rep := newReport("throughput")
	mk("").print(&out, rep, tms, 3*time.Second)
	for _, want := range []string{"node no-spin", "node/s", "batched/node", "under bun 1.4.5", ">= 1.0x node: MISSED"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("no %q in\n%s", want, out.String())
		}
	}
	if !strings.Contains(strings.Join(rep.Notes, "\n"), "0.917x onnxruntime-node") {
		t.Errorf("notes %q", rep.Notes)
	}
	out.Reset()
	mk("the onnxruntime-node baseline is not installed").print(&out, newReport("throughput"), tms, 3*time.Second)
	if s := out.String(); !strings.Contains(s, "node: SKIPPED") || !strings.Contains(s, "not installed") || strings.Contains(s, "node/s") {
		t.Errorf("skipped:\n%s", s)
	}
}
