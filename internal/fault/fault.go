// Package fault is a fault-injection switch for chaos tests ONLY: with the environment
// variable ORTBUS_FAULT_INJECT=1, a request whose path contains MagicSegv makes the
// process die of a real native SIGSEGV (through cgo), and MagicAbort of a native abort();
// a model whose folder's path contains MagicPanic makes the worker panic (a Go panic)
// while warming it up. It is off by default, and nothing in a normal configuration turns
// it on.
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
)

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

// Panic panics if the switch is on and path asks for it (MagicPanic).
func Panic(path string) {
	if enabled && strings.Contains(path, MagicPanic) {
		panic("fault injection: " + MagicPanic + " in " + path)
	}
}
