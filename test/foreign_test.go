package test

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/ortbus/ortbus/codec"
	"github.com/ortbus/ortbus/config"
	"github.com/ortbus/ortbus/internal/testkit/testenv"
	"github.com/ortbus/ortbus/models/onnxgen"
)

// fakeSMI is an nvidia-smi for a machine without a GPU: GPU 0 has the uuid GPU-fake, its
// compute processes are the lines of the file apps (gpu_uuid, pid, used MiB), which the
// test rewrites; every other query fails (so a worker's devices.Used finds no GPU). Each
// run of the process query adds a line to the file calls.
type fakeSMI struct{ dir string }

func newFakeSMI(t *testing.T) *fakeSMI {
	t.Helper()
	s := &fakeSMI{dir: t.TempDir()}
	script := "#!/bin/sh\ncase \"$*\" in\n" +
		"*--query-gpu=index,uuid*) echo '0, GPU-fake' ;;\n" +
		"*--query-compute-apps=gpu_uuid,pid,used_memory*) echo x >> '" + s.dir + "/calls'; cat '" + s.dir + "/apps' ;;\n" +
		"*) echo \"fake nvidia-smi: no $*\" >&2; exit 9 ;;\nesac\n"
	if err := os.WriteFile(filepath.Join(s.dir, "nvidia-smi"), []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	s.set(t, nil)
	return s
}

// path is the PATH with the fake first.
func (s *fakeSMI) path() string {
	return "PATH=" + s.dir + string(os.PathListSeparator) + os.Getenv("PATH")
}

func (s *fakeSMI) calls() int {
	b, _ := os.ReadFile(filepath.Join(s.dir, "calls"))
	return strings.Count(string(b), "x")
}

// set makes the GPU's processes mibs (pid -> MiB), atomically.
func (s *fakeSMI) set(t *testing.T, mibs map[int]int) {
	t.Helper()
	var b strings.Builder
	for pid, m := range mibs {
		fmt.Fprintf(&b, "GPU-fake, %d, %d\n", pid, m)
	}
	tmp := filepath.Join(s.dir, "apps.tmp")
	if err := os.WriteFile(tmp, []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, filepath.Join(s.dir, "apps")); err != nil {
		t.Fatal(err)
	}
}

// read waits until the gateway has stored a reading that began after the last set: two
// more runs of the query (the gateway reads one device at a time, and stores a reading
// before it starts the next).
func (s *fakeSMI) read(t *testing.T) {
	t.Helper()
	n := s.calls()
	checkFor(t, "two readings of the fake nvidia-smi", gwReplyBound, pollEvery, func() error {
		if c := s.calls(); c < n+2 {
			return fmt.Errorf("%d readings since the change", c-n)
		}
		return nil
	})
}

// TestForeignMemory: on a machine without a GPU, a gateway whose pool names device cuda:0
// (with ep = "cpu": its worker really runs on the CPU here) and a declared capacity reads
// the GPU's processes from a fake nvidia-smi first on its PATH. Its own worker's pid is not
// foreign (it is admitted: its declared model, or what the driver reports for its process
// when that is more); a process that appears mid-run is foreign_bytes in status and on /metrics and
// shrinks the free budget, so a lease that fitted before is refused overloaded with the
// foreign bytes in its figures; a lease covers its holder's usage up to its bytes; the
// process gone, its bytes come back.
func TestForeignMemory(t *testing.T) {
	t.Parallel()
	root := imageRoot(t)
	smi := newFakeSMI(t)
	cfg := admissionConfig(t, root, func(c *config.Config) {
		c.Devices = map[string]config.Device{"cuda:0": {Capacity: 1 << 30, SafeFraction: 0.5}} // budget 512 MiB
		c.Models["declared"] = &config.Model{Kind: config.KindTaggerPixAI, Dir: filepath.Join(testenv.Models(t), onnxgen.TaggerDir), Memory: 100 << 20}
		c.Pools = map[string]*config.Pool{"gpu": {Runtime: testenv.RuntimeLib(t, "1.30.0"), Threads: 1, EP: "cpu", Device: "cuda:0",
			Classes: []string{"interactive"}, Models: []string{"declared"}}}
	})
	g := launchGateway(t, cfg, true, smi.path())
	live := g.waitLive(t, "gpu", 1)
	var worker codec.WorkerStatus
	for _, w := range live {
		worker = w
	}
	cuda := func() codec.DeviceStatus { return deviceOf(t, g, "cuda:0") }
	lease := func(bytes int64) (codec.LeaseReply, *codec.Error) {
		return leaseReq(t, g, fmt.Sprintf(`{"action":"acquire","device":"cuda:0","bytes":%d,"ttl_ms":60000,"holder":"llm"}`, bytes))
	}
	release := func(l codec.LeaseReply) {
		t.Helper()
		if _, e := leaseReq(t, g, `{"action":"release","lease":"`+l.Lease+`"}`); e != nil {
			t.Fatal(e)
		}
	}
	const budget = 512 << 20

	// (c) The worker's own 100 MiB on the GPU are not foreign: they are its model's
	// (declared 100 MiB), admitted. (The worker reads the same nvidia-smi for its own
	// figure, so the wait is on the gateway's status, not on the count of readings.)
	smi.set(t, map[int]int{worker.PID: 100})
	smi.read(t)
	var st codec.DeviceStatus
	checkFor(t, "the worker's own usage admitted, not foreign", gwReplyBound, pollEvery, func() error {
		if st = cuda(); st.ForeignBytes != 0 || st.AdmittedBytes != 100<<20 || st.FreeBytes != budget-100<<20 {
			return fmt.Errorf("the worker's own usage (pid %d): %+v", worker.PID, st)
		}
		return nil
	})
	// A lease of 300 MiB fits now.
	l, e := lease(300 << 20)
	if e != nil {
		t.Fatalf("a lease of 300 MiB with 412 MiB free: %v", e)
	}
	release(l)

	// (a) A foreign process appears: 200 MiB on the GPU.
	foreignPID := worker.PID + 7777 // any pid but the gateway's workers'
	smi.set(t, map[int]int{worker.PID: 100, foreignPID: 200})
	checkFor(t, "the foreign process in status", gwReplyBound, pollEvery, func() error {
		if st = cuda(); st.ForeignBytes != 200<<20 {
			return fmt.Errorf("foreign_bytes %d, want 200 MiB (%+v)", st.ForeignBytes, st)
		}
		return nil
	})
	if st.FreeBytes != budget-300<<20 {
		t.Errorf("free %d MiB with 200 MiB foreign, want 212 MiB", st.FreeBytes>>20)
	}
	if v := metricValue(t, gwScrape(t, g.Ready.HTTP), `ortbus_device_foreign_bytes{device="cuda:0"}`); v != 200<<20 {
		t.Errorf("ortbus_device_foreign_bytes = %v, want 200 MiB", v)
	}
	// (b) The same lease is refused now, the foreign bytes in its figures.
	_, e = lease(300 << 20)
	if e == nil || e.Code != codec.CodeOverloaded || e.Details["foreign_bytes"] != float64(200<<20) || e.Details["sum_bytes"] != float64(600<<20) ||
		e.Details["budget_bytes"] != float64(budget) || !strings.Contains(e.Message, "foreign 200.0MiB") {
		t.Fatalf("lease of 300 MiB with a foreign process of 200 MiB: %v (details %v), want overloaded with foreign_bytes", e, e.Details)
	}
	// A lease taken by that process covers its usage up to its bytes: 150 MiB leased,
	// 50 MiB past it foreign, the free budget the same.
	l, e = lease(150 << 20)
	if e != nil {
		t.Fatalf("a lease of 150 MiB: %v", e)
	}
	if st = cuda(); st.LeasedBytes != 150<<20 || st.ForeignBytes != 50<<20 || st.FreeBytes != budget-300<<20 {
		t.Errorf("status with a lease covering the foreign process: %+v", st)
	}
	release(l)

	// The process is gone: its bytes are back.
	smi.set(t, map[int]int{worker.PID: 100})
	checkFor(t, "the foreign process gone from status", gwReplyBound, pollEvery, func() error {
		if st = cuda(); st.ForeignBytes != 0 || st.FreeBytes != budget-100<<20 {
			return fmt.Errorf("%+v", st)
		}
		return nil
	})
	if l, e = lease(300 << 20); e != nil {
		t.Fatalf("a lease of 300 MiB after the foreign process left: %v", e)
	}
	release(l)

	// (d) The worker's own usage grows past its model's peak (an EP's buffers grown past
	// the warm-up): the driver's figure for it, 300 MiB, is admitted, still not foreign,
	// and the same lease no longer fits.
	smi.set(t, map[int]int{worker.PID: 300})
	checkFor(t, "the worker's measured 300 MiB admitted", gwReplyBound, pollEvery, func() error {
		if st = cuda(); st.ForeignBytes != 0 || st.AdmittedBytes != 300<<20 || st.FreeBytes != budget-300<<20 {
			return fmt.Errorf("%+v", st)
		}
		return nil
	})
	if _, e = lease(300 << 20); e == nil || e.Code != codec.CodeOverloaded || e.Details["sum_bytes"] != float64(600<<20) {
		t.Fatalf("a lease of 300 MiB beside the worker's measured 300 MiB: %v, want overloaded with sum 600 MiB", e)
	}
}

// metricValue is the value of the series named (with its labels) in a /metrics text, or -1.
func metricValue(t *testing.T, metrics, series string) float64 {
	t.Helper()
	for _, line := range strings.Split(metrics, "\n") {
		if v, ok := strings.CutPrefix(line, series+" "); ok {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				t.Fatalf("metrics line %q: %v", line, err)
			}
			return f
		}
	}
	return -1
}
