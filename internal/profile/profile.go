// Package profile writes a CPU profile of a process when the environment asks for one:
// with ORTBUS_CPUPROFILE=PREFIX, the gateway and each worker write
// PREFIX.<program>.<pid>.pprof from start to exit (for `go tool pprof`). Workers inherit
// the gateway's environment, so one variable profiles the whole stack, a file per process.
package profile

import (
	"fmt"
	"os"
	"runtime/pprof"
)

// EnvVar names the file prefix; unset or empty: no profile.
const EnvVar = "ORTBUS_CPUPROFILE"

// Start starts the CPU profile of program if EnvVar is set, and returns the function that
// stops it and closes its file (a no-op otherwise). A profile that cannot start is
// reported on stderr; the program goes on without it.
func Start(program string) (stop func()) {
	prefix := os.Getenv(EnvVar)
	if prefix == "" {
		return func() {}
	}
	path := fmt.Sprintf("%s.%s.%d.pprof", prefix, program, os.Getpid())
	f, err := os.Create(path)
	if err != nil {
		fmt.Fprintf(os.Stderr, "%s: cpu profile: %v\n", program, err)
		return func() {}
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		fmt.Fprintf(os.Stderr, "%s: cpu profile: %v\n", program, err)
		return func() {}
	}
	return func() {
		pprof.StopCPUProfile()
		f.Close()
	}
}
