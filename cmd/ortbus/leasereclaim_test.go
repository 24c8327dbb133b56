package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ortbus/ortbus/codec"
	"github.com/ortbus/ortbus/config"
	"github.com/ortbus/ortbus/internal/testkit/testenv"
)

// captureStderr sends os.Stderr to a file for the rest of t, and returns a reader of it.
func captureStderr(t *testing.T) func() string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "stderr")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	stderr := os.Stderr
	os.Stderr = f
	t.Cleanup(func() { os.Stderr = stderr; f.Close() })
	return func() string {
		b, _ := os.ReadFile(path)
		return string(b)
	}
}

// TestLeaseReclaim: a press runs the on-pressure hook once (not again while it lasts);
// after it, while not pressed, renews ask for relief at the lease's bytes; a reply that
// says relief runs the on-relief hook once and asks no more; without --on-relief no
// relief is ever asked for.
func TestLeaseReclaim(t *testing.T) {
	captureStderr(t)
	dir := t.TempDir()
	count := func(name string) string { return "echo x >> '" + filepath.Join(dir, name) + "'" }
	o := &leaseOpts{device: "cpu", bytes: 256 << 20, onPressure: count("pressure"), onRelief: count("relief")}
	r := newLeaseReclaim(o, os.Getpid())
	ran := func(name string, n int) {
		t.Helper()
		testenv.CheckFor(t, name+" hook runs", 10*time.Second, 10*time.Millisecond, func() error {
			b, _ := os.ReadFile(filepath.Join(dir, name))
			if got := strings.Count(string(b), "x"); got != n {
				return os.ErrNotExist
			}
			return nil
		})
	}
	if r.reliefBytes() != 0 {
		t.Fatal("relief asked for before any press")
	}
	r.pressed(true)
	r.pressed(true)
	ran("pressure", 1)
	if r.reliefBytes() != 0 {
		t.Error("relief asked for while pressed")
	}
	r.renewed(&codec.LeaseReply{Bytes: 100 << 20}) // the press over, the lease shrunk
	if r.reliefBytes() != 256<<20 {
		t.Errorf("relief bytes %d after the press, want the lease's 256 MiB", r.reliefBytes())
	}
	r.renewed(&codec.LeaseReply{Bytes: 256 << 20, Relief: true})
	ran("relief", 1)
	r.renewed(&codec.LeaseReply{Bytes: 256 << 20, Relief: true})
	if r.reliefBytes() != 0 {
		t.Error("relief still asked for after it came")
	}
	r.pressed(true) // a second press: the hooks again
	r.pressed(false)
	ran("pressure", 2)
	r.renewed(&codec.LeaseReply{Bytes: 256 << 20, Relief: true})
	ran("relief", 2)
	r.stop()

	plain := newLeaseReclaim(&leaseOpts{device: "cpu", bytes: 1 << 20, onPressure: "true"}, os.Getpid())
	plain.pressed(true)
	plain.pressed(false)
	if plain.reliefBytes() != 0 {
		t.Error("relief asked for without --on-relief")
	}
	plain.stop()
}

// TestLeaseBelowHolderWarns: a lease below CMD's measured memory is warned of once, with
// both figures, and again only after the measure fell back within the lease.
func TestLeaseBelowHolderWarns(t *testing.T) {
	out := captureStderr(t)
	used := int64(117 << 20)
	r := newLeaseReclaim(&leaseOpts{device: "cpu", bytes: config.Bytes(64 << 20)}, 1)
	r.measured = func(string, int) (int64, bool) { return used, true }
	r.measure()
	r.measure()
	if n := strings.Count(out(), "warning"); n != 1 || !strings.Contains(out(), "holds 64.0MiB of cpu, but CMD is measured using 117.0MiB") {
		t.Fatalf("%d warnings: %q", n, out())
	}
	used = 60 << 20
	r.measure()
	used = 120 << 20
	r.measure()
	if n := strings.Count(out(), "warning"); n != 2 {
		t.Errorf("%d warnings after the measure fell and rose again, want 2: %q", n, out())
	}
}

// TestHolderMemory: on cpu, a process tree's resident memory (a started child is in the
// tree); a device without a reader is not measured.
func TestHolderMemory(t *testing.T) {
	child := exec.Command("sleep", "60")
	if err := child.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { child.Process.Kill(); child.Wait() })
	if tree := processTree(os.Getpid()); !slices.Contains(tree, child.Process.Pid) || tree[0] != os.Getpid() {
		t.Errorf("tree %v lacks the child %d", tree, child.Process.Pid)
	}
	self, ok := holderMemory("cpu", os.Getpid())
	alone, _ := holderMemory("cpu", child.Process.Pid)
	if !ok || self <= alone || alone <= 0 {
		t.Errorf("cpu: self and child %d (%v), child alone %d", self, ok, alone)
	}
	if _, ok := holderMemory("tpu:0", os.Getpid()); ok {
		t.Error("a device without a reader measured")
	}
}

// TestLeaseReliefFlag: --on-relief needs --on-pressure.
func TestLeaseReliefFlag(t *testing.T) {
	captureStderr(t)
	base := []string{"--device", "cpu", "--bytes", "1MiB"}
	if o, ok := parseLeaseFlags(append(base, "--on-pressure", "a", "--on-relief", "b", "--", "true")); !ok || o.onRelief != "b" {
		t.Errorf("--on-pressure with --on-relief: %+v %v", o, ok)
	}
	if _, ok := parseLeaseFlags(append(base, "--on-relief", "b", "--", "true")); ok {
		t.Error("--on-relief without --on-pressure accepted")
	}
}
