package llmtenant

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// fake starts testdata/fake-tenant.sh in mode under sh, in place of node and tenant.mjs.
func fake(t *testing.T, mode string, onEvent func(Event)) (*Tenant, error) {
	t.Helper()
	return fakeWrapped(t, mode, onEvent, nil)
}

func fakeWrapped(t *testing.T, mode string, onEvent func(Event), wrap []string) (*Tenant, error) {
	t.Helper()
	script, err := filepath.Abs("testdata/fake-tenant.sh")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	tn, err := Start(ctx, Options{Node: "sh", Script: script, Modules: "unused", Model: mode, OnEvent: onEvent, Wrap: wrap})
	if tn != nil {
		t.Cleanup(tn.Close)
	}
	return tn, err
}

// TestStartFails: a tenant that exits before its ready event, or reports a failed load,
// is an error of Start saying why (its stderr, its error event).
func TestStartFails(t *testing.T) {
	if _, err := fake(t, "exit-early", nil); err == nil || !strings.Contains(err.Error(), "cannot find the binding") || !strings.Contains(err.Error(), "exit status 3") {
		t.Errorf("exit before ready: %v, want the exit status and the stderr", err)
	}
	if _, err := fake(t, "load-failed", nil); err == nil || !strings.Contains(err.Error(), "load_failed: NoBinaryFoundError") {
		t.Errorf("failed load: %v, want the error event", err)
	}
}

// TestWrapped: under a wrapper (here a shell that runs the tenant as its child, in a
// process group of its own as ortbus lease --gate does), PID is the tenant's, signals and
// requests reach it, and Close ends both processes.
func TestWrapped(t *testing.T) {
	tn, err := fakeWrapped(t, "serve", nil, []string{"sh", "-c", `setsid "$@"; exit $?`, "wrapper"})
	if err != nil {
		t.Fatal(err)
	}
	wrapper := tn.cmd.Process.Pid
	if tn.PID() == wrapper || tn.PID() <= 0 {
		t.Fatalf("PID %d, the wrapper's %d: want the tenant's own", tn.PID(), wrapper)
	}
	if pgid, _ := syscall.Getpgid(tn.PID()); pgid == wrapper {
		t.Fatalf("the tenant is in the wrapper's group %d: the test wants a group of its own", pgid)
	}
	if _, err := tn.Generate(context.Background(), Request{Prompt: "p"}); err != nil {
		t.Fatal(err)
	}
	if _, err := tn.RSS(); err != nil {
		t.Fatalf("RSS of the tenant: %v", err)
	}
	pid := tn.PID()
	tn.Close()
	if !gone(pid) || !gone(wrapper) {
		t.Fatalf("after Close: tenant %d gone %v, wrapper %d gone %v", pid, gone(pid), wrapper, gone(wrapper))
	}
}

// gone is whether pid is no running process: absent, or a zombie (killed, not yet reaped
// by its new parent).
func gone(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return true
	}
	i := bytes.LastIndexByte(b, ')')
	return i > 0 && len(b) > i+2 && b[i+2] == 'Z'
}

func TestMissing(t *testing.T) {
	repo := t.TempDir()
	if why := Missing(repo); !strings.Contains(why, "make llm-tenant") {
		t.Fatalf("empty repo: %q", why)
	}
	for _, p := range []string{Script(repo), filepath.Join(Modules(repo), "node-llama-cpp", "package.json"), InstalledFile(repo)} {
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if why := Missing(repo); why != "" && !strings.Contains(why, "node is not on PATH") {
		t.Fatalf("complete repo: %q", why)
	}
}
