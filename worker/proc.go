package worker

import (
	"bufio"
	"os"
	"runtime/debug"
	"strconv"
	"strings"
)

// rssBytes is this process's resident set size, from /proc/self/status (0 if unknown).
func rssBytes() int64 { return procStatus("VmRSS:") }

// hwmBytes is this process's peak resident set size so far (VmHWM).
func hwmBytes() int64 { return procStatus("VmHWM:") }

// resetPeak resets this process's peak resident set size to its resident set size now
// (Linux: "5" written to /proc/self/clear_refs) and returns it, so that the peak a load
// in place reaches is measured from here: the process's earlier peaks (a large batch) are
// not the model's. Where it cannot be reset, the peak so far is returned: the growth past
// it is measured.
//
// First, the memory the process freed but still holds resident — a reloaded model's old
// copy, closed at its swap, and the buffers of earlier loads and warm-ups, kept by the C
// heap (trimC) and Go's heap (debug.FreeOSMemory) for reuse — goes back to the operating
// system. Else the next load reuses those resident pages, its RSS hardly grows, and a
// reload measured its model at about 0 MiB: admission under-counted it.
func resetPeak() int64 {
	debug.FreeOSMemory()
	trimC()
	_ = os.WriteFile("/proc/self/clear_refs", []byte("5"), 0)
	return hwmBytes()
}

func procStatus(key string) int64 {
	f, err := os.Open("/proc/self/status")
	if err != nil {
		return 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		if rest, ok := strings.CutPrefix(line, key); ok {
			kb, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
			return kb << 10
		}
	}
	return 0
}

var pid = os.Getpid()
