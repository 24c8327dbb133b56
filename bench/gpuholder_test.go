package bench

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/procfs"

	"github.com/ortbus/ortbus/internal/testkit/testenv"
)

// treeRSS is the resident memory of pid and its children (one level: the GPU holder's).
func treeRSS(t *testing.T, pid int) (total int64, kids int) {
	t.Helper()
	procs, err := procfs.AllProcs()
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range procs {
		st, err := p.Stat()
		if err != nil || (p.PID != pid && st.PPID != pid) {
			continue
		}
		total += int64(st.ResidentMemory())
		if p.PID != pid {
			kids++
		}
	}
	return total, kids
}

// TestGPUMemHolder runs the GPU memory holder (`ortbus bench mem-holder -ep webgpu`) on
// the WebGPU EP for real, on lavapipe, where the device's buffers are the host's memory:
// at its ready line its child holds the 128 MiB (the tree's resident memory is at least
// that: the initializers went to the device, and ORT's placement said every node ran on
// webgpu, else the child fails); SIGUSR1 ends the child (freed, after its start) and the
// memory goes with it; SIGTERM ends the holder with status 0. A flag set that names no
// runtime is a usage error.
func TestGPUMemHolder(t *testing.T) {
	testenv.RequireVulkan(t)
	if code := MemHolderMain([]string{"-ep", "webgpu", "-bytes", "1MiB"}, io.Discard, io.Discard); code != 2 {
		t.Errorf("-ep webgpu without -runtime: exit %d, want 2", code)
	}
	root := testenv.RepoRoot(t)
	bin := buildSystem(t, root)
	const size = 128 << 20
	cmd := exec.Command(filepath.Join(bin, "ortbus"), "bench", "mem-holder", "-ep", "webgpu", "-runtime", testenv.RuntimeLib(t, "1.30.0"), "-bytes", "128MiB")
	cmd.Env = os.Environ()
	for k, v := range testenv.WebGPUEnv(t) {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	lines := make(chan MemHolderEvent, 4)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			var ev MemHolderEvent
			if json.Unmarshal(sc.Bytes(), &ev) == nil {
				lines <- ev
			}
		}
		exited <- cmd.Wait()
	}()
	t.Cleanup(func() { cmd.Process.Kill() })
	next := func(want string) MemHolderEvent {
		t.Helper()
		select {
		case ev := <-lines:
			if ev.Event != want {
				t.Fatalf("the holder said %+v, want %s; stderr:\n%s", ev, want, stderr.String())
			}
			return ev
		case err := <-exited:
			t.Fatalf("the holder exited (%v) before %s; stderr:\n%s", err, want, stderr.String())
		case <-time.After(2 * time.Minute):
			t.Fatalf("no %s within 2 minutes; stderr:\n%s", want, stderr.String())
		}
		return MemHolderEvent{}
	}
	ready := next(MemHolderReady)
	held, kids := treeRSS(t, cmd.Process.Pid)
	if ready.PID != cmd.Process.Pid || ready.Bytes != size || kids != 1 || held < size {
		t.Fatalf("ready %+v; the tree holds %d MiB in %d children, want its child holding at least 128 MiB", ready, held>>20, kids)
	}
	cmd.Process.Signal(syscall.SIGUSR1)
	freed := next(MemHolderFreed)
	after, kids := treeRSS(t, cmd.Process.Pid)
	if freed.StartUnixUS <= 0 || freed.StartUnixUS > freed.UnixUS || kids != 0 || held-after < size {
		t.Fatalf("freed %+v; the tree holds %d MiB in %d children (was %d MiB), want the child gone with its 128 MiB", freed, after>>20, kids, held>>20)
	}
	cmd.Process.Signal(syscall.SIGTERM)
	if err := <-exited; err != nil {
		t.Fatalf("after SIGTERM: %v; stderr:\n%s", err, stderr.String())
	}
}

// TestLeaseWebGPUSmall is TestLeaseSmall's waiting way with the GPU holder (-ep webgpu)
// on lavapipe: the holder's memory is a WebGPU session's, measured as its tree's resident
// memory (the cpu device), and the urgent lease is granted once its child is gone. It
// says it is a smoke (no GPU): the one note.
func TestLeaseWebGPUSmall(t *testing.T) {
	testenv.RequireVulkan(t)
	root := testenv.RepoRoot(t)
	bin := buildSystem(t, root)
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	var table bytes.Buffer
	rep, err := Lease(ctx, Options{Repo: root, BinDir: bin, N: 1, EP: "webgpu", Out: &table})
	t.Logf("lease -ep webgpu, one round each:\n%s", table.String())
	if err != nil {
		t.Fatal(err)
	}
	res := rep.Results.(*LeaseResults)
	if res.EP != "webgpu" || res.Device != "cpu" || res.HeldBytes != leaseBenchSmokeHeld || !strings.Contains(res.Adapter, "llvmpipe") {
		t.Errorf("results %+v: want the webgpu holder on lavapipe (device cpu)", res)
	}
	for _, r := range append(res.Wait.Rounds, res.Polling.Rounds...) {
		if r.FreeStartToGrantMS <= 0 || r.ShrunkTo <= 0 || r.ShrunkTo >= res.HolderBytes {
			t.Errorf("round %+v: want the grant after the free began, the holder's lease shrunk to what it measures", r)
		}
	}
	if len(rep.Notes) != 1 || !strings.Contains(rep.Notes[0], SmokeLabel) {
		t.Errorf("notes %q: want the one saying it is a smoke", rep.Notes)
	}
}
