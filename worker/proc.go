package worker

import (
	"bufio"
	"os"
	"strconv"
	"strings"
)

// rssBytes is this process's resident set size, from /proc/self/status (0 if unknown).
func rssBytes() int64 { return procStatus("VmRSS:") }

// hwmBytes is this process's peak resident set size so far (VmHWM).
func hwmBytes() int64 { return procStatus("VmHWM:") }

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
