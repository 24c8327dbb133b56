package test

import (
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ortbus/ortbus/codec"
	"github.com/ortbus/ortbus/config"
	"github.com/ortbus/ortbus/internal/testkit/testenv"
	"github.com/ortbus/ortbus/models/onnxgen"
)

// admissionConfig writes a gateway config with the models tagger and heavy (the slow
// tagger), which edit completes with devices, more models and the pools.
func admissionConfig(t *testing.T, root string, edit func(c *config.Config)) string {
	t.Helper()
	c := &config.Config{
		NATS:     config.NATS{Embedded: true, Listen: "127.0.0.1:0"},
		Gateway:  config.Gateway{ShutdownGrace: config.Duration(3 * time.Second)},
		Health:   config.Health{HeartbeatInterval: config.Duration(200 * time.Millisecond)},
		Security: config.Security{AllowedRoots: []string{root}},
		Models: map[string]*config.Model{
			"tagger": {Kind: config.KindTaggerPixAI, Dir: filepath.Join(testenv.Models(t), onnxgen.TaggerDir)},
			"heavy":  {Kind: config.KindTaggerPixAI, Dir: gwSlowTaggerDir(t)},
		},
	}
	edit(c)
	return writeConfigFile(t, filepath.Join(t.TempDir(), "admission.toml"), c)
}

// TestAdmissionRefusesOverBudget: declared peaks that pass the device's budget refuse
// the pool that does not fit, naming the device, the sum and the budget; the pool that
// fits starts and serves.
func TestAdmissionRefusesOverBudget(t *testing.T) {
	root := imageRoot(t)
	rt := testenv.RuntimeLib(t, "1.30.0")
	tagger := filepath.Join(testenv.Models(t), onnxgen.TaggerDir)
	cfg := admissionConfig(t, root, func(c *config.Config) {
		c.Devices = map[string]config.Device{"cpu": {Capacity: 300 << 20, SafeFraction: 0.85}}
		c.Models["big"] = &config.Model{Kind: config.KindTaggerPixAI, Dir: tagger, Memory: 200 << 20}
		c.Models["more"] = &config.Model{Kind: config.KindTaggerPixAI, Dir: tagger, Memory: 100 << 20}
		c.Pools = map[string]*config.Pool{
			"first":  {Runtime: rt, Threads: 1, Classes: []string{"interactive"}, Models: []string{"big"}},
			"second": {Runtime: rt, Threads: 1, Classes: []string{"batch"}, Models: []string{"more"}},
		}
		c.SetOrder("pools", "first", "second")
	})
	g := startGateway(t, cfg)
	st := g.status(t)
	var dev codec.DeviceStatus
	for _, d := range st.Devices {
		if d.Device == "cpu" {
			dev = d
		}
	}
	if dev.CapacityBytes != 300<<20 || dev.BudgetBytes != int64(float64(300<<20)*0.85) || dev.AdmittedBytes != 200<<20 {
		t.Fatalf("device status %+v", dev)
	}
	var second codec.PoolStatus
	for _, p := range st.Pools {
		if p.Name == "second" {
			second = p
		}
	}
	if second.Error == nil || second.Error.Code != codec.CodeOverloaded || second.Live != 0 {
		t.Fatalf("second pool was not refused: %+v", second)
	}
	for _, want := range []string{"device cpu", "300.0MiB", "255.0MiB"} {
		if !strings.Contains(second.Error.Message, want) {
			t.Errorf("refusal %q does not name %q", second.Error.Message, want)
		}
	}
	// The same figures on /metrics.
	metrics := gwScrape(t, g.Ready.HTTP)
	for name, want := range map[string]float64{
		`ortbus_device_budget_bytes{device="cpu"}`:   float64(dev.BudgetBytes),
		`ortbus_device_admitted_bytes{device="cpu"}`: 200 << 20,
	} {
		got := -1.0
		for _, line := range strings.Split(metrics, "\n") {
			if v, ok := strings.CutPrefix(line, name+" "); ok {
				got, _ = strconv.ParseFloat(v, 64)
			}
		}
		if got != want {
			t.Errorf("%s = %v, want %v", name, got, want)
		}
	}
	// The pool that fits serves; the refused one answers with its refusal, not a hang.
	path := colourPNG(t, root, "red")
	if r := g.call(t, "tag", &codec.Request{Path: path}, 10*time.Second); r.Err != nil {
		t.Fatalf("first pool: %v", r.Err)
	}
	r := g.call(t, "tag", &codec.Request{Path: path, Class: "batch"}, 10*time.Second)
	if r.code() != string(codec.CodeOverloaded) {
		t.Fatalf("batch on the refused pool: %v", r.Err)
	}
	t.Logf("refused: %s", second.Error.Message)
}

// TestAdmissionCapsBatch: with a small device budget, a pool whose dynamic batch of 8
// would pass it starts with its batch capped to what fits (measured per-item memory),
// and no batch larger than the cap ever runs.
func TestAdmissionCapsBatch(t *testing.T) {
	root := imageRoot(t)
	rt := testenv.RuntimeLib(t, "1.30.0")
	heavy := func(c *config.Config) {
		c.Pools = map[string]*config.Pool{"heavy": {Runtime: rt, Threads: 1, Classes: []string{"batch"}, Models: []string{"heavy"},
			MaxBatch: 8, MaxDelay: config.Duration(50 * time.Millisecond)}}
	}
	// First measure the model uncapped, then give the device room for about half a batch.
	g := startGateway(t, admissionConfig(t, root, heavy))
	st := g.status(t)
	m := st.Workers[0].Models[0]
	g.stop(t)
	if m.PerItemBytes <= 0 || m.MaxBatch != 8 {
		t.Fatalf("uncapped model status %+v", m)
	}
	peak1 := m.PeakBytes - 7*m.PerItemBytes
	budget := peak1 + 3*m.PerItemBytes + m.PerItemBytes/2 // room for a batch of 4
	capacity := int64(float64(budget) / 0.85)
	cfg := admissionConfig(t, root, func(c *config.Config) {
		heavy(c)
		c.Devices = map[string]config.Device{"cpu": {Capacity: config.Bytes(capacity)}}
	})
	g = startGateway(t, cfg)
	st = g.status(t)
	if len(st.Workers) != 1 || st.Pools[0].Error != nil {
		t.Fatalf("pool did not start: %+v", st.Pools[0])
	}
	capped := st.Workers[0].Models[0]
	if capped.MaxBatch >= 8 || capped.MaxBatch < 1 || capped.PeakBytes > st.Devices[0].BudgetBytes {
		t.Fatalf("batch not capped to fit: %+v (budget %d)", capped, st.Devices[0].BudgetBytes)
	}
	in := newInbox(t, g.NC)
	colours := []string{"red", "green", "blue", "yellow", "cyan", "magenta", "white", "black"}
	for i := 0; i < 16; i++ {
		g.post(t, in, "tag", strconv.Itoa(i), &codec.Request{Path: colourPNG(t, root, colours[i%8]), Class: "batch"})
	}
	biggest := 0
	for i := 0; i < 16; i++ {
		r := gwDecode(t, in.next(t, "batch reply"))
		tr := r.tag(t)
		biggest = max(biggest, tr.Timing.Batch)
	}
	if biggest > capped.MaxBatch {
		t.Fatalf("a batch of %d ran, over the cap of %d", biggest, capped.MaxBatch)
	}
	t.Logf("per item %d KiB; budget %d MiB; batch capped from 8 to %d; largest batch run %d",
		m.PerItemBytes>>10, st.Devices[0].BudgetBytes>>20, capped.MaxBatch, biggest)
}
