//go:build linux && cgo

package worker

/*
#include <stddef.h>

// glibc's malloc_trim, weak: absent from another C library (musl), the call is skipped.
extern int malloc_trim(size_t pad) __attribute__((weak));

static void ortbus_malloc_trim(void) {
	if (malloc_trim) {
		malloc_trim(0);
	}
}
*/
import "C"

// trimC returns the C heap's free memory to the operating system (glibc's malloc_trim:
// ONNX Runtime allocates with malloc); nothing where the C library has no such call.
func trimC() { C.ortbus_malloc_trim() }
