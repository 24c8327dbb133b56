package bench

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/ortbus/ortbus/codec"
)

// TestMemCheckArithmetic: the workers' device_bytes against the device's growth less the
// other processes' growth: within 10% ok, past it off, and not measured without workers
// or without growth.
func TestMemCheckArithmetic(t *testing.T) {
	const mb = 1 << 20
	before := DeviceReading{Device: "cuda:0", UsedBytes: 1000 * mb, Procs: map[int]int64{111: 300 * mb}}
	after := DeviceReading{Device: "cuda:0", UsedBytes: 1700 * mb, Procs: map[int]int64{111: 350 * mb, 222: 320 * mb, 333: 330 * mb}}
	for _, c := range []struct {
		workers map[int]int64
		verdict string
		device  int64
	}{
		{map[int]int64{222: 320 * mb, 333: 330 * mb}, "ok", 650 * mb},
		{map[int]int64{222: 300 * mb, 333: 290 * mb}, "ok", 650 * mb},          // 9.2% below
		{map[int]int64{222: 200 * mb, 333: 200 * mb}, "off by more", 650 * mb}, // the device grew by more than they say
		{map[int]int64{}, "not measured: no worker", 0},
	} {
		m := checkDeviceMemory(before, after, c.workers)
		if !strings.HasPrefix(m.Verdict, c.verdict) || (c.device != 0 && (m.DeviceBytes != c.device || m.ForeignAfter != 350*mb || m.ForeignBefore != 300*mb)) {
			t.Errorf("workers %v: %+v, want %q with the device's %d MiB", c.workers, m, c.verdict, c.device/mb)
		}
	}
	flat := checkDeviceMemory(before, DeviceReading{UsedBytes: 1000 * mb, Procs: map[int]int64{111: 300 * mb, 222: 10 * mb}}, map[int]int64{222: 10 * mb})
	if !strings.HasPrefix(flat.Verdict, "not measured: the device's used memory did not grow") || flat.OK() {
		t.Errorf("no growth: %+v", flat)
	}
}

// standInSMI puts first on PATH an nvidia-smi whose GPU 0 (GPU-fake) has the used memory
// in dir/used (MiB) and the compute apps in dir/apps (gpu_uuid, pid, MiB lines).
func standInSMI(t *testing.T) (set func(used string, apps ...string)) {
	t.Helper()
	dir := t.TempDir()
	script := "#!/bin/sh\ncase \"$*\" in\n" +
		"*--query-gpu=memory.total,memory.used*) echo \"143771, $(cat '" + dir + "/used')\" ;;\n" +
		"*--query-gpu=index,uuid*) echo '0, GPU-fake' ;;\n" +
		"*--query-compute-apps=*) cat '" + dir + "/apps' ;;\n" +
		"*) exit 2 ;;\nesac\n"
	if err := os.WriteFile(filepath.Join(dir, "nvidia-smi"), []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Setenv("PATH", dir+string(os.PathListSeparator)+os.Getenv("PATH"))
	return func(used string, apps ...string) {
		t.Helper()
		var b strings.Builder
		for _, a := range apps {
			b.WriteString("GPU-fake, " + a + "\n")
		}
		if os.WriteFile(filepath.Join(dir, "used"), []byte(used+"\n"), 0o644) != nil || os.WriteFile(filepath.Join(dir, "apps"), []byte(b.String()), 0o644) != nil {
			t.Fatal("stand-in nvidia-smi's files")
		}
	}
}

// TestMemCheckMain: `ortbus bench memcheck` under a stand-in nvidia-smi: a reading saved
// before the workers, then the check against a status whose workers' device_bytes sum
// to the device's growth (another process's growth subtracted) passes, exit 0, writing
// its figures; a status claiming less than the device grew fails, exit 1, naming both
// figures; a status with no worker of the device is not measured, exit 1.
func TestMemCheckMain(t *testing.T) {
	set := standInSMI(t)
	dir := t.TempDir()
	run := func(args ...string) (int, string) {
		var out, errb bytes.Buffer
		code := MemCheckMain(args, &out, &errb)
		return code, out.String() + errb.String()
	}
	set("1000", "111, 300")
	if code, out := run("-device", "cuda:0", "-save", filepath.Join(dir, "before.json")); code != 0 {
		t.Fatalf("save: %d %s", code, out)
	}
	set("1700", "111, 350", "222, 320", "333, 330")
	status := func(name string, mibs ...int64) string {
		st := codec.StatusReply{}
		for i, m := range mibs {
			st.Workers = append(st.Workers, codec.WorkerStatus{Heartbeat: codec.Heartbeat{PID: 222 + 111*i, State: codec.StateReady, Device: "cuda:0", DeviceSource: "nvidia-smi", DeviceBytes: m << 20}})
		}
		st.Workers = append(st.Workers, codec.WorkerStatus{Heartbeat: codec.Heartbeat{PID: 999, State: codec.StateReady, Device: "cpu"}})
		b, _ := json.Marshal(st)
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, b, 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	check := filepath.Join(dir, "check.json")
	code, out := run("-device", "cuda:0", "-before", filepath.Join(dir, "before.json"), "-status", status("ok.json", 320, 330), "-out", check)
	var m MemCheck
	if code != 0 || !strings.Contains(out, "the workers put 650.0 MiB there") || readJSON(check, &m) != nil || !m.OK() || m.WorkersBytes != 650<<20 {
		t.Errorf("a matching sum: exit %d, %+v\n%s", code, m, out)
	}
	if code, out := run("-device", "cuda:0", "-before", filepath.Join(dir, "before.json"), "-status", status("low.json", 200, 200)); code != 1 || !strings.Contains(out, "workers' sum 400.0 MiB") || !strings.Contains(out, "off by more than 10%") {
		t.Errorf("a sum below the growth: exit %d\n%s", code, out)
	}
	if code, out := run("-device", "cuda:0", "-before", filepath.Join(dir, "before.json"), "-status", status("none.json")); code != 1 || !strings.Contains(out, "not measured") {
		t.Errorf("no worker: exit %d\n%s", code, out)
	}
	if code, _ := run("-device", "cuda:0"); code != 2 {
		t.Errorf("no -save nor -before: exit %d, want 2", code)
	}
}

// judge: a check within 10% adds nothing to the report, one off by more is a missed
// target naming both sums, one not measured a note saying so (which gpu-check fails);
// printTune prints each layout's check on a "memory check" line, the verdict last (what
// gpu-check's tune step reads).
func TestMemCheckJudge(t *testing.T) {
	before := DeviceReading{Device: "cuda:0", UsedBytes: 1000 << 20, Procs: map[int]int64{7: 100 << 20}}
	after := DeviceReading{Device: "cuda:0", UsedBytes: 1400 << 20, Procs: map[int]int64{7: 100 << 20, 11: 390 << 20}}
	for _, tc := range []struct {
		workers map[int]int64
		want    string
	}{
		{map[int]int64{11: 390 << 20}, ""},
		{map[int]int64{11: 200 << 20}, "target missed: run: the workers' device_bytes sum to 200.0 MiB, the device grew by 400.0 MiB"},
		{map[int]int64{}, "run: the workers' device memory against the device's: not measured: no worker reports device_bytes"},
	} {
		m := checkDeviceMemory(before, after, tc.workers)
		m.Run = "run"
		rep := &Report{}
		m.judge(rep)
		switch {
		case tc.want == "" && len(rep.Notes) != 0:
			t.Errorf("%v: notes %q, want none", tc.workers, rep.Notes)
		case tc.want != "" && (len(rep.Notes) != 1 || !strings.HasPrefix(rep.Notes[0], tc.want)):
			t.Errorf("%v: notes %q, want one starting %q", tc.workers, rep.Notes, tc.want)
		}
	}
	var out strings.Builder
	off := checkDeviceMemory(before, after, map[int]int64{11: 200 << 20})
	printTune(&out, &TuneResults{Rows: []TuneRow{{Layout: Layout{Workers: 1, Threads: 1}, ItemsPerSec: 1, MemoryCheck: off}, {Layout: Layout{Workers: 2, Threads: 1}, ItemsPerSec: 1}}})
	lines := regexp.MustCompile(`(?m)^memory check, .*$`).FindAllString(out.String(), -1)
	if len(lines) != 1 || !strings.HasSuffix(lines[0], ": off by more than 10%") {
		t.Errorf("printTune's memory check lines %q, want one ending with its verdict:\n%s", lines, out.String())
	}
}
