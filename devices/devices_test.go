package devices

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

func TestCPUCapacity(t *testing.T) {
	b, src, err := Capacity("cpu")
	if err != nil || b < 64<<20 || !strings.Contains(src, "meminfo") {
		t.Fatalf("cpu capacity %d from %q: %v", b, src, err)
	}
	if _, ok := Used("cpu"); ok {
		t.Fatal("Used(cpu) should have no reader")
	}
	if _, _, err := Capacity("gpu.intel:0"); err == nil || !strings.Contains(err.Error(), "capacity") {
		t.Fatalf("unknown device: %v", err)
	}
}

// fakeSMI puts an nvidia-smi first on PATH that prints gpus.csv for --query-gpu=index,uuid
// and apps.csv for --query-compute-apps (both in the returned directory), and fails for
// anything else; it counts its runs in calls.
func fakeSMI(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	script := "#!/bin/sh\necho x >> " + dir + "/calls\ncase \"$*\" in\n" +
		"*--query-gpu=index,uuid*) cat " + dir + "/gpus.csv ;;\n" +
		"*--query-compute-apps=gpu_uuid,pid,used_memory*) cat " + dir + "/apps.csv ;;\n" +
		"*) echo unexpected \"$*\" >&2; exit 9 ;;\nesac\n"
	if err := os.WriteFile(filepath.Join(dir, "nvidia-smi"), []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Setenv("PATH", dir+string(os.PathListSeparator)+os.Getenv("PATH"))
	return dir
}

func write(t *testing.T, path, s string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(s), 0o644); err != nil {
		t.Fatal(err)
	}
}

// TestProcessMemory: the nvidia-smi reader maps cuda:N to its GPU's uuid (read once) and
// sums the rows of that GPU per pid; a row without a reported size counts nothing.
func TestProcessMemory(t *testing.T) {
	dir := fakeSMI(t)
	write(t, dir+"/gpus.csv", "0, GPU-aaaa\n1, GPU-bbbb\n")
	write(t, dir+"/apps.csv", "GPU-aaaa, 100, 512\nGPU-bbbb, 200, 1024\nGPU-aaaa, 300, [N/A]\nGPU-aaaa, 100, 10\n")
	if ProcessReaderFor("cpu") != nil || ProcessReaderFor("gpu.intel:0") != nil {
		t.Fatal("a per-process reader for a device without nvidia-smi")
	}
	r0, r1 := ProcessReaderFor("cuda:0"), ProcessReaderFor("cuda:1")
	got, err := r0.ProcessMemory("cuda:0")
	if err != nil || !reflect.DeepEqual(got, map[int]int64{100: 522 << 20, 300: 0}) {
		t.Fatalf("cuda:0 processes %v %v", got, err)
	}
	if got, err := r1.ProcessMemory("cuda:1"); err != nil || !reflect.DeepEqual(got, map[int]int64{200: 1 << 30}) {
		t.Fatalf("cuda:1 processes %v %v", got, err)
	}
	// A process appears; the uuid is not asked again.
	write(t, dir+"/apps.csv", "GPU-aaaa, 100, 512\nGPU-aaaa, 400, 2048\n")
	if got, err := r0.ProcessMemory("cuda:0"); err != nil || !reflect.DeepEqual(got, map[int]int64{100: 512 << 20, 400: 2 << 30}) {
		t.Fatalf("cuda:0 processes after a new one %v %v", got, err)
	}
	calls, _ := os.ReadFile(dir + "/calls")
	if n := strings.Count(string(calls), "x"); n != 5 {
		t.Errorf("nvidia-smi ran %d times, want 5 (one uuid query per reader, one per reading)", n)
	}
	// No process: an empty map.
	write(t, dir+"/apps.csv", "")
	if got, err := r0.ProcessMemory("cuda:0"); err != nil || len(got) != 0 {
		t.Fatalf("no processes: %v %v", got, err)
	}
	// Failures are errors, never a guess.
	for _, c := range []struct{ device, apps string }{
		{"cuda:7", "GPU-aaaa, 100, 512\n"}, // no such GPU
		{"cuda:0", "GPU-aaaa, pid, 512\n"}, // not a pid
		{"cuda:0", "GPU-aaaa 100 512\n"},   // not CSV
	} {
		write(t, dir+"/apps.csv", c.apps)
		if got, err := ProcessReaderFor(c.device).ProcessMemory(c.device); err == nil {
			t.Errorf("%s with %q: %v, want an error", c.device, c.apps, got)
		}
	}
	// No nvidia-smi on PATH (nor a real one behind the fake: PATH is the fake's directory
	// only, now empty).
	os.Remove(dir + "/nvidia-smi")
	t.Setenv("PATH", dir)
	if _, err := ProcessReaderFor("cuda:0").ProcessMemory("cuda:0"); err == nil {
		t.Error("no nvidia-smi: no error")
	}
}

// useSMI points smiCommand at a fake nvidia-smi that prints the files of
// testdata/nvidia-smi, as the real one prints them for a machine with two GPUs, and
// appends its arguments to the returned file at each run; ProcessUsage's uuid cache starts
// empty.
func useSMI(t *testing.T) (calls string) {
	t.Helper()
	fix, err := filepath.Abs("testdata/nvidia-smi")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	calls = filepath.Join(dir, "calls")
	script := "#!/bin/sh\necho \"$*\" >> '" + calls + "'\ncase \"$*\" in\n" +
		"'--query-gpu=index,uuid --format=csv,noheader') cat '" + fix + "/query-gpu-index-uuid.csv' ;;\n" +
		"'--query-compute-apps=gpu_uuid,pid,used_memory --format=csv,noheader,nounits') cat '" + fix + "/query-compute-apps.csv' ;;\n" +
		"'--query-gpu=memory.total,memory.used --format=csv,noheader,nounits -i 0') cat '" + fix + "/query-gpu-memory-0.csv' ;;\n" +
		"'--query-gpu=memory.total,memory.used --format=csv,noheader,nounits -i 1') cat '" + fix + "/query-gpu-memory-1.csv' ;;\n" +
		"*) echo \"No devices were found\" >&2; exit 6 ;;\nesac\n"
	smi := filepath.Join(dir, "nvidia-smi")
	if err := os.WriteFile(smi, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	oldCmd, oldSelf := smiCommand, selfSMI
	smiCommand, selfSMI = smi, &smiProcesses{}
	t.Cleanup(func() { smiCommand, selfSMI = oldCmd, oldSelf })
	return calls
}

// TestProcessUsageSMI: a process's own memory on cuda:N is the sum of its rows of that
// GPU in --query-compute-apps (the uuid of index N read once, then kept); a process not
// listed uses 0, a row without a reported size counts 0; a device without a reader says
// so, and a failed reading is an error.
func TestProcessUsageSMI(t *testing.T) {
	calls := useSMI(t)
	for _, c := range []struct {
		device string
		pid    int
		want   int64
	}{
		{"cuda:0", 21034, 1873 << 20},
		{"cuda:1", 21034, 260 << 20}, // the same process on the other GPU
		{"cuda:0", 21877, 412 << 20},
		{"cuda:1", 22410, 15872 << 20},
		{"cuda:1", 23001, 0}, // [N/A]
		{"cuda:0", 22410, 0}, // listed on the other GPU only
		{"cuda:0", 99999, 0}, // not listed (yet)
	} {
		b, ok, err := ProcessUsage(c.device, c.pid)
		if err != nil || !ok || b != c.want {
			t.Errorf("%s pid %d: %d %v %v, want %d", c.device, c.pid, b, ok, err, c.want)
		}
	}
	log, _ := os.ReadFile(calls)
	if n := strings.Count(string(log), "--query-gpu=index,uuid"); n != 1 {
		t.Errorf("the index -> uuid map read %d times, want once:\n%s", n, log)
	}
	for _, d := range []string{"cpu", "gpu.intel:0", "rocm:0"} {
		if b, ok, err := ProcessUsage(d, 21034); ok || err != nil || b != 0 {
			t.Errorf("%s: %d %v %v, want no reader", d, b, ok, err)
		}
	}
	if b, ok, err := ProcessUsage("cuda:0", 0); err == nil || !ok {
		t.Errorf("pid 0: %d %v %v, want an error", b, ok, err)
	}
	if b, ok, err := ProcessUsage("cuda:2", 21034); err == nil || !ok {
		t.Errorf("no GPU 2: %d %v %v, want an error", b, ok, err)
	}
	got, err := ProcessReaderFor("cuda:1").ProcessMemory("cuda:1")
	if want := map[int]int64{22410: 15872 << 20, 23001: 0, 21034: 260 << 20}; err != nil || !reflect.DeepEqual(got, want) {
		t.Errorf("cuda:1 processes %v %v, want %v", got, err, want)
	}
	if b, src, err := Capacity("cuda:1"); err != nil || b != 81559<<20 || src != "nvidia-smi" {
		t.Errorf("cuda:1 capacity %d %q %v", b, src, err)
	}
	if u, ok := Used("cuda:0"); !ok || u != 2669<<20 {
		t.Errorf("cuda:0 used %d %v", u, ok)
	}
	if _, ok := Used("cuda:3"); ok {
		t.Error("cuda:3: used without a GPU")
	}
	// nvidia-smi gone: an error, from a device that has a reader.
	smiCommand = filepath.Join(t.TempDir(), "nvidia-smi")
	selfSMI = &smiProcesses{}
	if b, ok, err := ProcessUsage("cuda:0", 21034); err == nil || !ok {
		t.Errorf("no nvidia-smi: %d %v %v, want an error", b, ok, err)
	}
}
