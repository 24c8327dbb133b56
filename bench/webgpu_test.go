package bench

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/ortbus/ortbus/config"
	"github.com/ortbus/ortbus/internal/testkit/testenv"
	"github.com/ortbus/ortbus/models/onnxgen"
)

// TestFindGPU: the GPU check's four outcomes: nvidia-smi listing a GPU (cuda:0), a DRM
// render node without it (drm:N), and neither, saying what is missing.
func TestFindGPU(t *testing.T) {
	notFound := func() ([]byte, error) { return nil, &exec.Error{Name: "nvidia-smi", Err: exec.ErrNotFound} }
	g := findGPU(notFound, nil)
	if g.Device != "" || !strings.Contains(g.What, "no NVIDIA GPU: nvidia-smi not found") || !strings.Contains(g.What, "/dev/dri") {
		t.Errorf("no GPU: %+v", g)
	}
	g = findGPU(func() ([]byte, error) { return []byte("NVIDIA H200\nNVIDIA H200\n"), nil }, []string{"/dev/dri/renderD128"})
	if g.Device != "cuda:0" || g.What != "NVIDIA H200 (nvidia-smi)" {
		t.Errorf("nvidia-smi lists a GPU: %+v", g)
	}
	g = findGPU(func() ([]byte, error) { return []byte("\n"), nil }, nil)
	if g.Device != "" || !strings.Contains(g.What, "nvidia-smi lists no GPU") {
		t.Errorf("nvidia-smi lists none: %+v", g)
	}
	g = findGPU(func() ([]byte, error) { return nil, errors.New("exit status 9") }, []string{"/dev/dri/renderD129", "/dev/dri/renderD128"})
	if !strings.HasPrefix(g.Device, "drm:") || !strings.Contains(g.What, "renderD128") {
		t.Errorf("render node: %+v", g)
	}
}

// TestThroughputPrintWebGPU: a webgpu run prints each path's EP and the two
// targets, noting those missed; a smoke run's rows carry its label and no target is
// judged or noted.
func TestThroughputPrintWebGPU(t *testing.T) {
	tms := []tpModel{{name: smokeModel, threads: 1}}
	mk := func(smoke string) *ThroughputResults {
		rate := func(v float64) Rate { return Rate{ItemsPerS: v, ByModel: map[string]float64{smokeModel: v}} }
		res := &ThroughputResults{Model: smokeModel, InProcess: rate(10), System: rate(9), SystemBatched: rate(9.5), Node: rate(8),
			Ratios: map[string]ThroughputRatios{smokeModel: {SystemOverInProcess: 0.9, SystemBatchedOverInProcess: 0.95, SystemOverNode: 1.125, SystemBatchedOverNode: 1.187}},
			Models: map[string]ThroughputModel{smokeModel: {MeanBatch: 1}}}
		res.Setup.EP, res.Setup.Rounds = "webgpu", 1
		res.Setup.Node.Runner, res.Setup.Node.OnnxruntimeNode = "bun 1.4.5", NodeBenchVersion
		res.Setup.WebGPU = &WebGPUSetup{Device: "cuda:0", Adapter: "NVIDIA H200 (discrete)", Smoke: smoke, GPU: GPU{Device: "cuda:0", What: "NVIDIA H200 (nvidia-smi)"},
			Paths: map[string]*PathEP{"inprocess": {EP: "webgpu", Where: "the bench process", FirstMS: map[string]float64{smokeModel: 120}},
				"system": {EP: "webgpu", Where: "pool plain", Device: "cuda:0", FirstMS: map[string]float64{smokeModel: 300}}}}
		return res
	}
	var out strings.Builder
	rep := newReport("throughput")
	mk("").print(&out, rep, tms, 3*time.Second)
	s := out.String()
	for _, want := range []string{"ep: webgpu on every path", "NVIDIA H200 (discrete)", "inprocess", "tiny 120", "tiny 300", "executionProviders ['webgpu']",
		"in-process webgpu: MISSED", "onnxruntime-node webgpu: ok"} {
		if !strings.Contains(s, want) {
			t.Errorf("no %q in\n%s", want, s)
		}
	}
	if strings.Contains(s, "no-spin/s") {
		t.Errorf("a no-spin table on webgpu:\n%s", s)
	}
	if n := strings.Join(rep.Notes, "\n"); !strings.Contains(n, "0.950x the in-process webgpu loop") || strings.Contains(n, "onnxruntime-node's webgpu") {
		t.Errorf("notes %q", rep.Notes)
	}
	out.Reset()
	rep = newReport("throughput")
	mk(SmokeLabel).print(&out, rep, tms, time.Second)
	s = out.String()
	if !strings.Contains(s, "tiny ["+SmokeLabel+"]") || !strings.Contains(s, "targets not judged") || strings.Contains(s, "MISSED") || len(rep.Notes) != 0 {
		t.Errorf("smoke: notes %q\n%s", rep.Notes, s)
	}
}

// TestThroughputWebGPUSmoke runs `ortbus bench throughput -ep webgpu -smoke` through the
// real system (a gateway, its two webgpu pools' workers), the in-process loop and, when
// `make node-bench` installed it, onnxruntime-node: on lavapipe where the machine has no
// GPU. It checks that every row has items/s > 0, that each path was seen running on
// webgpu (the in-process session's EP; the workers' heartbeats and every counted reply;
// the node runner's session), that each paid its first run (shader compilation) before
// counting, and that the table says what it is.
func TestThroughputWebGPUSmoke(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a gateway and workers; skipped with -short")
	}
	testenv.RequireVulkan(t)
	root := testenv.RepoRoot(t)
	testenv.RuntimeLib(t, RuntimeVersion)
	bin := buildSystem(t, root)
	_, nodeErr := findNodeBench(&Options{Repo: root})
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	var out bytes.Buffer
	t0 := time.Now()
	rep, err := Throughput(ctx, Options{Repo: root, BinDir: bin, EP: "webgpu", Smoke: true, Out: &out})
	t.Logf("throughput -ep webgpu -smoke (%v):\n%s", time.Since(t0).Round(time.Millisecond), out.String())
	if err != nil {
		t.Fatal(err)
	}
	res := rep.Results.(*ThroughputResults)
	wg := res.Setup.WebGPU
	if res.Setup.EP != "webgpu" || wg == nil || wg.Smoke == "" || wg.Adapter == "" || wg.Vulkan == nil || len(wg.Vulkan.Adapters) == 0 {
		t.Fatalf("setup %+v, webgpu %+v", res.Setup, wg)
	}
	if wg.GPU.Device == "" && (wg.Smoke != SmokeLabel || wg.Device != "cpu" || !strings.Contains(out.String(), "no GPU on this machine")) {
		t.Errorf("no GPU here (%s), but smoke %q on device %q", wg.GPU.What, wg.Smoke, wg.Device)
	}
	paths := map[string]float64{"inprocess": res.InProcess.ByModel[smokeModel], "system": res.System.ByModel[smokeModel], "system_batched": res.SystemBatched.ByModel[smokeModel]}
	if nodeErr == nil {
		paths["node"] = res.Node.ByModel[smokeModel]
	} else if res.Setup.Node.Skipped == "" {
		t.Errorf("node-bench not installed (%v), yet the node paths were not skipped", nodeErr)
	}
	for key, rate := range paths {
		p := wg.Paths[key]
		if rate <= 0 {
			t.Errorf("%s: %.2f items/s", key, rate)
		}
		if p == nil || p.EP != "webgpu" || p.FirstMS[smokeModel] <= 0 || p.Adapter != wg.Adapter {
			t.Errorf("%s ran on %+v, want ep webgpu, a first run, adapter %s", key, p, wg.Adapter)
		}
	}
	for _, key := range []string{"system", "system_batched"} {
		if p := wg.Paths[key]; p == nil || p.Device != wg.Device {
			t.Errorf("%s: %+v, want device %s", key, p, wg.Device)
		}
	}
	if _, ok := res.NodeNoSpin.ByModel[smokeModel]; ok {
		t.Error("a node no-spin path on webgpu")
	}
	s := out.String()
	for _, want := range []string{"tiny [" + wg.Smoke + "]", "targets not judged", "adapter: " + wg.Adapter} {
		if !strings.Contains(s, want) {
			t.Errorf("no %q in the table", want)
		}
	}
	for _, n := range rep.Notes {
		if strings.Contains(n, "target missed") {
			t.Errorf("a smoke judged a target: %s", n)
		}
	}
}

// TestWebGPULayouts: the webgpu sweep is workers 1..4 within the cores, one thread,
// spinning off, max_batch 8 only where the op batches.
func TestWebGPULayouts(t *testing.T) {
	if l := webgpuLayouts(2, true); len(l) != 4 || l[3] != (Layout{Workers: 2, Threads: 1, MaxBatch: 8}) {
		t.Errorf("2 cores: %v", l)
	}
	if l := webgpuLayouts(16, false); len(l) != 4 || l[3].Workers != 4 || l[3].MaxBatch != 1 {
		t.Errorf("16 cores: %v", l)
	}
}

// TestTuneWebGPU: ortbus tune -ep webgpu on a cpu pool of the tiny model runs every
// layout of the webgpu sweep on webgpu (each layout's workers checked), and -write puts
// the winner with ep and device in the file, which then loads.
func TestTuneWebGPU(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a gateway per layout; skipped with -short")
	}
	testenv.RequireVulkan(t)
	root := testenv.RepoRoot(t)
	lib := testenv.RuntimeLib(t, RuntimeVersion)
	bin := buildSystem(t, root)
	md := testenv.Models(t)
	dir := t.TempDir()
	cfgPath := filepath.Join(dir, "tiny.toml")
	text := "[nats]\nembedded = true\n\n[security]\nallowed_roots = [\"" + dir + "\"]\n\n[models.tiny]\nkind = \"raw\"\ndir = \"" +
		filepath.Join(md, onnxgen.TinyDir) + "\"\n\n[pools.p]\nruntime = \"" + lib + "\"\nworkers = 1\nthreads = 1\nclasses = [\"interactive\"]\nmodels = [\"tiny\"]\n"
	if err := os.WriteFile(cfgPath, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	var out bytes.Buffer
	res, err := Tune(ctx, TuneOptions{Options: Options{Repo: root, BinDir: bin, Out: &out, EP: "webgpu"}, Config: cfgPath, Pool: "p",
		Inputs: map[string]string{"x": "zeros:1x4"}, Duration: 300 * time.Millisecond, Write: true})
	t.Logf("tune -ep webgpu:\n%s", out.String())
	if err != nil {
		t.Fatal(err)
	}
	if res.EP != "webgpu" || res.Adapter == "" || res.Device == "" || !strings.Contains(out.String(), "ep: webgpu on device "+res.Device) {
		t.Errorf("results %+v", res)
	}
	if len(res.Rows) != len(webgpuLayouts(runtime.NumCPU(), false)) && len(res.Rows) != len(webgpuLayouts(runtime.NumCPU(), true)) {
		t.Errorf("%d rows", len(res.Rows))
	}
	for _, r := range res.Rows {
		if r.Err != "" || r.ItemsPerSec <= 0 || r.Threads != 1 || r.Spin {
			t.Errorf("layout %v: %+v", r.Layout, r)
		}
	}
	c, err := config.Load(cfgPath)
	if err != nil {
		t.Fatal(err)
	}
	if p := c.Pools["p"]; !res.Written || p.EP != "webgpu" || p.Device != res.Device || p.Workers != res.Winner.Workers {
		t.Errorf("written pool %+v, want the winner %v on webgpu %s", p, res.Winner.Layout, res.Device)
	}
}
