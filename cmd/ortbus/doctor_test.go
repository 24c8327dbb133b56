package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// buildOrtbus builds this command into a temporary folder, once for the package's tests
// (TestMain removes it).
func buildOrtbus(t *testing.T) string {
	t.Helper()
	built.once.Do(func() {
		if built.dir, built.err = os.MkdirTemp("", "ortbus-cmd-test-"); built.err != nil {
			return
		}
		bin := filepath.Join(built.dir, "ortbus")
		if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
			built.err = fmt.Errorf("go build: %v\n%s", err, out)
			return
		}
		built.bin = bin
	})
	if built.err != nil {
		t.Fatal(built.err)
	}
	return built.bin
}

// built is what buildOrtbus built.
var built struct {
	once     sync.Once
	dir, bin string
	err      error
}

func TestMain(m *testing.M) {
	code := m.Run()
	if built.dir != "" {
		os.RemoveAll(built.dir)
	}
	os.Exit(code)
}

// TestDoctorMissingLibrary: a pool whose runtime library is missing is reported with the
// pool's name and every searched path, and doctor exits non-zero within 2 s.
func TestDoctorMissingLibrary(t *testing.T) {
	bin := buildOrtbus(t)
	dir := t.TempDir()
	libDir := filepath.Join(dir, "nowhere")
	cfg := filepath.Join(dir, "ortbus.toml")
	os.WriteFile(filepath.Join(dir, "m.onnx"), []byte("x"), 0o644)
	err := os.WriteFile(cfg, []byte(`
[nats]
url = "nats://127.0.0.1:1"
[models.tiny]
kind = "raw"
dir = "."
[pools.ghost]
runtime = "`+filepath.Join(libDir, "libonnxruntime.so.1")+`"
runtime_dirs = ["`+filepath.Join(dir, "prefix")+`"]
classes = ["interactive"]
models = ["tiny"]
`), 0o644)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	start := time.Now()
	out, err := exec.CommandContext(ctx, bin, "doctor", "-config", cfg).CombinedOutput()
	elapsed := time.Since(start)
	ee, ok := err.(*exec.ExitError)
	if !ok || ee.ExitCode() == 0 {
		t.Fatalf("doctor did not fail: %v\n%s", err, out)
	}
	if elapsed > 2*time.Second {
		t.Fatalf("doctor took %s (limit 2 s)", elapsed)
	}
	text := string(out)
	for _, want := range []string{
		"pool ghost", "FAIL", "runtime_missing",
		filepath.Join(libDir, "libonnxruntime.so.1"),
		filepath.Join(dir, "prefix", "libonnxruntime.so.1"),
		filepath.Join(dir, "prefix", "lib", "libonnxruntime.so.1"),
	} {
		if !strings.Contains(text, want) {
			t.Errorf("doctor output lacks %q:\n%s", want, text)
		}
	}
	t.Logf("doctor failed in %s as it should:\n%s", elapsed.Round(time.Millisecond), text)
}

// TestDoctorLocal: on the single-machine default, doctor finds each pool's own runtime,
// reports the version that library says it is, and that cpu works while cuda does not.
func TestDoctorLocal(t *testing.T) {
	bin := buildOrtbus(t)
	out, err := exec.Command(bin, "doctor", "-json", "-config", "../../deploy/local.toml").CombinedOutput()
	if err != nil {
		t.Fatalf("doctor: %v\n%s", err, out)
	}
	var reports []struct {
		Pool, Found, Version, Usable string
		EPs                          map[string]string
	}
	if err := json.Unmarshal(out, &reports); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	want := map[string]string{"fast": "1.30.0", "bulk": "1.24.3"}
	for _, r := range reports {
		if v, ok := want[r.Pool]; !ok || r.Version != v || !strings.Contains(r.Found, "ort-"+v) {
			t.Errorf("pool %s: found %s version %s", r.Pool, r.Found, r.Version)
		}
		if r.EPs["cpu"] != "ok" || r.Usable != "cpu" || r.EPs["cuda"] == "ok" || r.EPs["cuda"] == "" {
			t.Errorf("pool %s: EPs %v usable %s", r.Pool, r.EPs, r.Usable)
		}
		delete(want, r.Pool)
	}
	if len(want) != 0 {
		t.Errorf("pools not reported: %v", want)
	}
}
