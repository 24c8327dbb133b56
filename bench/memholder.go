package bench

import (
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/ortbus/ortbus/config"
)

// The memory holder: a process ortbus does not run (`ortbus bench mem-holder -bytes N`,
// run under `ortbus lease --on-pressure 'kill -USR1 $ORTBUS_LEASE_PID'`) that holds N
// bytes of resident memory and gives them back on demand, as an LLM server unloading its
// model would. It maps N bytes (anonymous, private) and writes every page, so that all
// are resident, then prints JSON lines on stdout:
//
//	{"event":"ready", ...}   N bytes resident
//	{"event":"freed", ...}   on SIGUSR1: the mapping unmapped (MemHolderEvent's times)
//
// It exits 0 on SIGTERM or SIGINT (after a SIGUSR1 or not).

// MemHolderEvent is one line of the memory holder: ready, or freed with the time the
// unmapping began (StartUnixUS: before it, nothing was given back) and ended (UnixUS:
// from then the memory is free).
type MemHolderEvent struct {
	Event       string `json:"event"`
	Bytes       int64  `json:"bytes"`
	PID         int    `json:"pid"`
	StartUnixUS int64  `json:"start_unix_us,omitempty"`
	UnixUS      int64  `json:"unix_us"`
}

// Memory holder events.
const (
	MemHolderReady = "ready"
	MemHolderFreed = "freed"
)

// maxHeld bounds what the memory holder maps: 1 TiB.
const maxHeld = 1 << 40

// MemHolderMain is `ortbus bench mem-holder -bytes SIZE`: it returns the exit status.
func MemHolderMain(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("bench mem-holder", flag.ContinueOnError)
	fs.SetOutput(stderr)
	size := fs.String("bytes", "", "how much memory to hold: bytes, or with a unit (400MiB)")
	ep := fs.String("ep", "cpu", "where: cpu (the host's memory) or webgpu (the GPU's, through ONNX Runtime's WebGPU EP: gpuholder.go)")
	lib := fs.String("runtime", "", "-ep webgpu: the ONNX Runtime library (with the WebGPU EP)")
	child := fs.Bool("child", false, "-ep webgpu: be the process that holds the memory (the holder starts it)")
	if fs.Parse(args) != nil || fs.NArg() != 0 {
		return 2
	}
	n, err := config.ParseBytes(*size)
	if err != nil || n <= 0 || n > maxHeld {
		fmt.Fprintf(stderr, "bench mem-holder: -bytes %q: want a size from 1 byte to 1TiB\n", *size)
		return 2
	}
	if (*ep != "cpu" && *ep != "webgpu") || (*ep == "webgpu") != (*lib != "") || (*child && *ep != "webgpu") {
		fmt.Fprintf(stderr, "bench mem-holder: want -ep cpu, or -ep webgpu with -runtime LIB\n")
		return 2
	}
	if *child {
		return gpuHolderChild(int64(n), *lib, stdout, stderr)
	}
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGUSR1, syscall.SIGTERM, syscall.SIGINT)
	defer signal.Stop(sigs)
	if *ep == "webgpu" {
		return gpuHolderMain(int64(n), *lib, stdout, stderr, sigs)
	}
	mem, err := syscall.Mmap(-1, 0, int(n), syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_ANON|syscall.MAP_PRIVATE)
	if err != nil {
		fmt.Fprintf(stderr, "bench mem-holder: mmap %d bytes: %v\n", n, err)
		return 1
	}
	page := os.Getpagesize()
	for i := 0; i < len(mem); i += page {
		mem[i] = 1
	}
	say := json.NewEncoder(stdout)
	say.Encode(MemHolderEvent{Event: MemHolderReady, Bytes: int64(n), PID: os.Getpid(), UnixUS: time.Now().UnixMicro()})
	for s := range sigs {
		if s != syscall.SIGUSR1 {
			return 0
		}
		if mem == nil {
			continue
		}
		start := time.Now().UnixMicro()
		if err := syscall.Munmap(mem); err != nil {
			fmt.Fprintf(stderr, "bench mem-holder: munmap: %v\n", err)
			return 1
		}
		mem = nil
		say.Encode(MemHolderEvent{Event: MemHolderFreed, Bytes: int64(n), PID: os.Getpid(), StartUnixUS: start, UnixUS: time.Now().UnixMicro()})
	}
	return 0
}
