// Package devices reads what ortbus needs to know of a physical device: its memory
// capacity, and the memory in use on it (to measure a model's peak on a GPU). A device is
// named cpu, cuda:N (NVIDIA, read through nvidia-smi when it is installed) or any
// KIND:N whose capacity must then be configured.
package devices

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"time"
)

// Capacity returns a device's memory capacity in bytes and where the figure came from.
func Capacity(device string) (int64, string, error) {
	switch {
	case device == "cpu":
		kb, err := meminfo("MemTotal")
		return kb << 10, "host memory (/proc/meminfo)", err
	case strings.HasPrefix(device, "cuda:"):
		total, _, err := nvidiaSMI(strings.TrimPrefix(device, "cuda:"))
		return total, "nvidia-smi", err
	}
	return 0, "", fmt.Errorf("device %s: no reader for its memory; set devices.%q.capacity in the config", device, device)
}

// Used returns the memory in use on a GPU device (for measuring a model's peak there);
// ok is false for the CPU and for devices without a reader.
func Used(device string) (used int64, ok bool) {
	if !strings.HasPrefix(device, "cuda:") {
		return 0, false
	}
	_, used, err := nvidiaSMI(strings.TrimPrefix(device, "cuda:"))
	return used, err == nil
}

func meminfo(key string) (int64, error) {
	f, err := os.Open("/proc/meminfo")
	if err != nil {
		return 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), key+":"); ok {
			return strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(rest), "kB")), 10, 64)
		}
	}
	return 0, fmt.Errorf("/proc/meminfo has no %s", key)
}

// nvidiaSMI reads total and used memory of GPU index in bytes.
func nvidiaSMI(index string) (total, used int64, err error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, "nvidia-smi", "--query-gpu=memory.total,memory.used", "--format=csv,noheader,nounits", "-i", index).Output()
	if err != nil {
		return 0, 0, fmt.Errorf("nvidia-smi for GPU %s: %w", index, err)
	}
	f := strings.Split(strings.TrimSpace(string(out)), ",")
	if len(f) != 2 {
		return 0, 0, fmt.Errorf("nvidia-smi: unexpected output %q", out)
	}
	t, err1 := strconv.ParseInt(strings.TrimSpace(f[0]), 10, 64)
	u, err2 := strconv.ParseInt(strings.TrimSpace(f[1]), 10, 64)
	if err1 != nil || err2 != nil {
		return 0, 0, fmt.Errorf("nvidia-smi: unexpected output %q", out)
	}
	return t << 20, u << 20, nil
}
