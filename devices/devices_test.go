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
	os.Remove(dir + "/nvidia-smi")
	if _, err := ProcessReaderFor("cuda:0").ProcessMemory("cuda:0"); err == nil {
		t.Error("no nvidia-smi: no error")
	}
}
