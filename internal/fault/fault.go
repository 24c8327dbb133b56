// Package fault is a fault-injection switch for chaos tests ONLY: with the environment
// variable ORTBUS_FAULT_INJECT=1, a request whose path contains MagicSegv makes the
// process die of a real native SIGSEGV (through cgo), and MagicAbort of a native abort();
// a model whose folder's path contains MagicPanic makes the worker panic (a Go panic)
// while warming it up; a request one of whose paths contains MagicAdapterLost makes its
// run fail as a run on a lost GPU device does (worker/adapterlost.go); and MagicSlowClaim
// makes the worker hold its claim of the request's first attempt until it has taken a
// later attempt of the same request (a claim that reaches the gateway after it dispatched
// the request again: worker/verdict.go). It is off by
// default, and nothing in a normal configuration turns it on.
package fault

/*
#include <stdlib.h>
#include <signal.h>
// The Go runtime handles SIGSEGV and SIGABRT itself and turns one raised in C code into
// "fatal error: unexpected signal" and exit status 2; restore the default action first,
// so that the process really dies of the signal (wait status: signaled).
static void ortbus_segv(void) { signal(SIGSEGV, SIG_DFL); volatile int *p = (int*)0; *p = 1; raise(SIGSEGV); }
static void ortbus_abort(void) { signal(SIGABRT, SIG_DFL); abort(); }
*/
import "C"

import (
	"os"
	"strings"
)

// EnvVar turns the switch on when set to 1.
const EnvVar = "ORTBUS_FAULT_INJECT"

// Magic path fragments.
const (
	MagicSegv  = "__ortbus_fault_segv__"
	MagicAbort = "__ortbus_fault_abort__"
	MagicPanic = "__ortbus_fault_panic__"
	// MagicAdapterLost: the run's error is a lost device's (LostDeviceError).
	MagicAdapterLost = "__ortbus_fault_adapter_lost__"
	// MagicSlowClaim: the claim of the first attempt is held until a later attempt of
	// the same request is taken.
	MagicSlowClaim = "__ortbus_fault_slow_claim__"
)

// LostDeviceError is the run error MagicAdapterLost stands in for: what Dawn's WebGPU
// device reports once its GPU is gone (a driver reset, a device removed).
const LostDeviceError = "fault injection: Device lost (VK_ERROR_DEVICE_LOST)"

var enabled = os.Getenv(EnvVar) == "1"

// Check crashes the process natively if the switch is on and path asks for it.
func Check(path string) {
	if !enabled {
		return
	}
	switch {
	case strings.Contains(path, MagicSegv):
		C.ortbus_segv()
	case strings.Contains(path, MagicAbort):
		C.ortbus_abort()
	}
}

// AdapterLost reports whether the switch is on and a request's path or one of its input
// paths asks for a lost device (MagicAdapterLost).
func AdapterLost(path string, inputs map[string]string) bool {
	return anyHas(MagicAdapterLost, path, inputs)
}

// SlowClaim reports whether the switch is on and a request's path or one of its input
// paths asks for a late claim (MagicSlowClaim).
func SlowClaim(path string, inputs map[string]string) bool {
	return anyHas(MagicSlowClaim, path, inputs)
}

// anyHas reports whether the switch is on and path or one of inputs contains magic. Off,
// it costs one test: the hooks sit on every work item's path.
func anyHas(magic, path string, inputs map[string]string) bool {
	if !enabled {
		return false
	}
	if strings.Contains(path, magic) {
		return true
	}
	for _, p := range inputs {
		if strings.Contains(p, magic) {
			return true
		}
	}
	return false
}

// Panic panics if the switch is on and path asks for it (MagicPanic).
func Panic(path string) {
	if enabled && strings.Contains(path, MagicPanic) {
		panic("fault injection: " + MagicPanic + " in " + path)
	}
}
