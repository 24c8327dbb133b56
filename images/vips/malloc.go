package vips

/*
#include "vips.h"
*/
import "C"

import (
	"os"
	"strings"
	"sync/atomic"
	"syscall"
)

// mallocTuned is whether TuneMalloc set the allocator in this process.
var mallocTuned atomic.Bool

// The allocator settings TuneMalloc applies. libvips allocates each item's pixel buffers
// with malloc and frees them when the item is done. With glibc's defaults a buffer over
// the (self-adjusting) mmap threshold is a fresh mapping every time, the heap's top is
// given back above 128 KiB, and each thread that decodes gets its own arena: so every
// item's buffers are new pages, zeroed by the kernel on first touch (the worker's CPU
// profile in docs/BENCHMARKS.md: a fifth of its time in page faults). These keep the
// freed buffers for the next item instead:
const (
	// MallocArenas is M_ARENA_MAX: one arena, whatever the number of decoding threads.
	MallocArenas = 1
	// MallocMmapThreshold is M_MMAP_THRESHOLD: allocations below it come from the heap
	// and are reused (32 MiB, glibc's largest; a 12 MP photo's buffers at its shrink-on-load
	// size are a few MiB).
	MallocMmapThreshold = 32 << 20
	// MallocTrimThreshold is M_TRIM_THRESHOLD: free memory at the heap's top is returned
	// to the system only above it, so at most this much free memory stays held.
	MallocTrimThreshold = 64 << 20
)

// mallocEnv are the environment variables through which a user sets glibc's allocator
// themselves; any of them set makes TuneMalloc leave it as it is.
var mallocEnv = []string{"MALLOC_ARENA_MAX", "MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_"}

// Huge pages: glibc backs its heap with transparent huge pages when the process starts
// with the glibc.malloc.hugetlb=1 tunable (glibc 2.35 and later; nothing where the
// kernel's transparent_hugepage is "never"), which no call can set later: a 2 MiB page
// is one fault where 512 small ones were (a 2K AVIF's first decode: 13,000 faults). So
// the worker starts itself again with it (ReexecWithTunables), once.
const (
	// MallocTunables is the GLIBC_TUNABLES value ReexecWithTunables sets.
	MallocTunables = "glibc.malloc.hugetlb=1"
	// reexecMarker is set in the environment of the process started again, so that it
	// does not start itself again, and so that TuneMalloc knows GLIBC_TUNABLES is ours.
	reexecMarker = "ORTBUS_MALLOC_REEXEC"
)

// ReexecWithTunables starts this process's executable again, in place (syscall.Exec: the
// same pid, arguments and environment), with GLIBC_TUNABLES set to MallocTunables, when
// the user has not set the allocator through the environment and this process is not
// already the one started again. It returns only when it did not (nil) or could not (the
// error: the process goes on as it is). Call it first thing in main, before any thread
// allocates.
func ReexecWithTunables() error {
	if os.Getenv(reexecMarker) != "" || userMalloc() != "" {
		return nil
	}
	exe, err := os.Executable()
	if err != nil {
		return err
	}
	// Tunables of other glibc parts the user set stay: ours is added to theirs, in the
	// one GLIBC_TUNABLES (a second entry of the variable would be ignored).
	tunables := MallocTunables
	var env []string
	for _, kv := range os.Environ() {
		if v, ok := strings.CutPrefix(kv, "GLIBC_TUNABLES="); ok {
			if v != "" {
				tunables = v + ":" + MallocTunables
			}
			continue
		}
		env = append(env, kv)
	}
	env = append(env, "GLIBC_TUNABLES="+tunables, reexecMarker+"=1")
	return syscall.Exec(exe, os.Args, env)
}

// userMalloc names the environment variable through which the user set glibc's
// allocator, or "".
func userMalloc() string {
	for _, k := range mallocEnv {
		if _, ok := os.LookupEnv(k); ok {
			return k
		}
	}
	if os.Getenv(reexecMarker) == "" && strings.Contains(os.Getenv("GLIBC_TUNABLES"), "glibc.malloc.") {
		return "GLIBC_TUNABLES"
	}
	return ""
}

// TuneMalloc sets glibc's allocator for a process that decodes images item after item
// (the worker; the library bench's in-process preprocessing, to time the same path), as
// the constants above say, and returns what it did. It does nothing when the user has
// set the allocator through the environment (MALLOC_* variables, or glibc.malloc
// tunables in GLIBC_TUNABLES), or when the C library is not glibc. Call it at start-up,
// before threads allocate.
func TuneMalloc() string {
	if k := userMalloc(); k != "" {
		return "glibc malloc as the environment sets it (" + k + ")"
	}
	switch C.ob_tune_malloc(C.int(MallocArenas), C.int(MallocMmapThreshold), C.int(MallocTrimThreshold)) {
	case 0:
		mallocTuned.Store(true)
		note := "glibc malloc tuned for decoding: 1 arena, mmap threshold 32 MiB, trim threshold 64 MiB"
		if os.Getenv(reexecMarker) != "" {
			note += ", " + MallocTunables
		}
		return note
	case 1:
		return "malloc left as it is (not glibc)"
	}
	return "glibc malloc left as it is (mallopt refused the settings)"
}
