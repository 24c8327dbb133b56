package vips_test

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ortbus/ortbus/images/vips"
)

// TestTuneMalloc: with glibc's defaults a decode-sized buffer (20 MiB) is a fresh mapping,
// given back when freed (the next item faults its pages in again); after TuneMalloc it
// comes from the heap and stays there for the next item. Checked in a child process
// (testdata/mallocchild, built here without the race detector, whose allocator replaces
// glibc's) from glibc's own accounting (mallinfo2).
func TestTuneMalloc(t *testing.T) {
	bin := mallocChild(t)
	const n = 20 << 20
	run := func(mode string) (mmapped, kept uint64) {
		cmd := exec.Command(bin, mode)
		cmd.Env = withoutMalloc()
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("child %s: %v", mode, err)
		}
		if _, err := fmt.Sscan(string(out), &mmapped, &kept); err != nil {
			t.Fatalf("child %s printed %q", mode, out)
		}
		return mmapped, kept
	}
	if mm, kept := run("default"); mm < n || kept >= n {
		t.Errorf("glibc's defaults: %d bytes mmapped while the buffer lived, %d kept after (want a mapping, given back)", mm, kept)
	}
	if mm, kept := run("tuned"); mm >= n || kept < n {
		t.Errorf("tuned: %d bytes mmapped while the buffer lived, %d kept after (want the heap, kept)", mm, kept)
	}
}

// mallocChild builds testdata/mallocchild without the race detector.
func mallocChild(t *testing.T) string {
	bin := filepath.Join(t.TempDir(), "mallocchild")
	if out, err := exec.Command("go", "build", "-o", bin, "./testdata/mallocchild").CombinedOutput(); err != nil {
		t.Fatalf("building the child: %v\n%s", err, out)
	}
	return bin
}

// withoutMalloc is this process's environment less what sets glibc's allocator.
func withoutMalloc() []string {
	var env []string
	for _, kv := range os.Environ() {
		if k, _, _ := strings.Cut(kv, "="); !strings.HasPrefix(k, "MALLOC_") && k != "GLIBC_TUNABLES" && k != "ORTBUS_MALLOC_REEXEC" {
			env = append(env, kv)
		}
	}
	return env
}

// TestReexecWithTunables: the process starts itself again in place (the same pid) with
// the huge-page tunable, once, and then tunes the rest; the user's tunables of other
// parts of glibc are kept beside it; a user's glibc.malloc tunable is kept, and nothing is
// tuned over it.
func TestReexecWithTunables(t *testing.T) {
	bin := mallocChild(t)
	run := func(env []string) (pid int, line string) {
		cmd := exec.Command(bin, "reexec")
		cmd.Env = env
		var out strings.Builder
		cmd.Stdout = &out
		if err := cmd.Run(); err != nil {
			t.Fatalf("child: %v", err)
		}
		return cmd.Process.Pid, strings.TrimSpace(out.String())
	}
	pid, line := run(withoutMalloc())
	if want := fmt.Sprintf("%d %s glibc malloc tuned", pid, vips.MallocTunables); !strings.HasPrefix(line, want) {
		t.Errorf("started again: %q, want it to begin %q", line, want)
	}
	pid, line = run(append(withoutMalloc(), "GLIBC_TUNABLES=glibc.cpu.x86_rep_movsb_threshold=4096"))
	if want := fmt.Sprintf("%d glibc.cpu.x86_rep_movsb_threshold=4096:%s glibc malloc tuned", pid, vips.MallocTunables); !strings.HasPrefix(line, want) {
		t.Errorf("with the user's tunables of another part of glibc: %q, want it to begin %q", line, want)
	}
	pid, line = run(append(withoutMalloc(), "GLIBC_TUNABLES=glibc.malloc.arena_max=2"))
	if want := fmt.Sprintf("%d glibc.malloc.arena_max=2 glibc malloc as the environment sets it (GLIBC_TUNABLES)", pid); line != want {
		t.Errorf("with the user's tunables: %q, want %q", line, want)
	}
}

// TestTuneMallocLeavesTheUsersChoice: any MALLOC_* variable or glibc.malloc tunable set
// by the user leaves the allocator as they set it.
func TestTuneMallocLeavesTheUsersChoice(t *testing.T) {
	t.Setenv("MALLOC_ARENA_MAX", "4")
	if got := vips.TuneMalloc(); !strings.Contains(got, "MALLOC_ARENA_MAX") {
		t.Errorf("with MALLOC_ARENA_MAX set: %q", got)
	}
	os.Unsetenv("MALLOC_ARENA_MAX")
	t.Setenv("GLIBC_TUNABLES", "glibc.malloc.arena_max=2")
	if got := vips.TuneMalloc(); !strings.Contains(got, "GLIBC_TUNABLES") {
		t.Errorf("with GLIBC_TUNABLES set: %q", got)
	}
}
