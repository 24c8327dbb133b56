// Command mallocchild is TestTuneMalloc's child (and TestReexecWithTunables's, with the
// argument "reexec"): it calls vips.TuneMalloc when its
// argument is "tuned", then mallocs, touches and frees one 20 MiB buffer (a decode's
// size) and prints where glibc put it: the bytes held in mmapped chunks while it lived,
// and the free bytes the heap kept after it was freed. It is built without the race
// detector, whose allocator replaces glibc's.
package main

/*
#include <malloc.h>
#include <stdlib.h>
#include <string.h>

void *volatile held; // the buffer escapes: the compiler may not elide malloc and free

static void probe(size_t n, size_t *mmapped, size_t *kept) {
	char *p = malloc(n);
	held = p;
	memset(p, 1, n);
	*mmapped = mallinfo2().hblkhd;
	free(p);
	*kept = mallinfo2().fordblks;
}
*/
import "C"

import (
	"fmt"
	"os"

	"github.com/ortbus/ortbus/images/vips"
)

func main() {
	if len(os.Args) > 1 && os.Args[1] == "reexec" {
		// What the process runs with after vips.ReexecWithTunables: its pid (the same
		// process) and its allocator's environment.
		if err := vips.ReexecWithTunables(); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		fmt.Println(os.Getpid(), os.Getenv("GLIBC_TUNABLES"), vips.TuneMalloc())
		return
	}
	if len(os.Args) > 1 && os.Args[1] == "tuned" {
		fmt.Fprintln(os.Stderr, vips.TuneMalloc())
	}
	var mmapped, kept C.size_t
	C.probe(20<<20, &mmapped, &kept)
	fmt.Println(uint64(mmapped), uint64(kept))
}
