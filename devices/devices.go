// Package devices reads what ortbus needs to know of a physical device: its memory
// capacity, the memory in use on it (to measure a model's peak on a GPU), and the memory
// each process uses on it (to count what processes outside ortbus hold, and for a worker
// to measure its own, whatever its EP). A device is named:
//
//   - cpu: the host's memory (/proc/meminfo);
//   - cuda:N: the NVIDIA GPU of index N, read through nvidia-smi when it is installed;
//   - drm:N: the AMD or Intel GPU of /dev/dri/cardN (N the card's index, as the kernel
//     numbered it: /sys/class/drm/cardN), read from sysfs and the DRM fdinfo of its
//     processes (the kernel's "DRM client usage stats"): drm.go;
//   - any other KIND:N, whose capacity must then be configured.
package devices

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
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
	case strings.HasPrefix(device, "drm:"):
		card, err := drmCardOf(sysRoot, device)
		if err != nil {
			return 0, "", fmt.Errorf("%w; set devices.%q.capacity in the config", err, device)
		}
		return drmCapacity(sysRoot, procRoot, card)
	}
	return 0, "", fmt.Errorf("device %s: no reader for its memory; set devices.%q.capacity in the config", device, device)
}

// Used returns the memory in use on a GPU device (for measuring a model's peak there);
// ok is false for the CPU and for devices without a reader: cuda:N has one (nvidia-smi),
// drm:N where its driver publishes it (amdgpu's mem_info_vram_used).
func Used(device string) (used int64, ok bool) {
	switch {
	case strings.HasPrefix(device, "cuda:"):
		_, used, err := nvidiaSMI(strings.TrimPrefix(device, "cuda:"))
		return used, err == nil
	case strings.HasPrefix(device, "drm:"):
		card, err := drmCardOf(sysRoot, device)
		if err != nil {
			return 0, false
		}
		return drmUsed(card)
	}
	return 0, false
}

func meminfo(key string) (int64, error) {
	return meminfoAt(procRoot, key)
}

// meminfoAt reads key of PROC/meminfo, in kB.
func meminfoAt(proc, key string) (int64, error) {
	f, err := os.Open(filepath.Join(proc, "meminfo"))
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

// smiCommand is the nvidia-smi that is run, looked up on PATH at each run (a test points
// it at a fake).
var smiCommand = "nvidia-smi"

// nvidiaSMI reads total and used memory of GPU index in bytes.
func nvidiaSMI(index string) (total, used int64, err error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, smiCommand, "--query-gpu=memory.total,memory.used", "--format=csv,noheader,nounits", "-i", index).Output()
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

// ProcessReader reads how much of a device's memory each process uses: the pids of the
// processes with memory on it, and their bytes. The gateway polls it to learn what
// processes outside ortbus hold on the device (gateway/foreign.go).
type ProcessReader interface {
	ProcessMemory(device string) (map[int]int64, error)
}

// ProcessReaderFor returns the reader of device's memory per process, or nil where there
// is none: cuda:N has one (nvidia-smi), drm:N another (the DRM fdinfo of every process:
// drmProcesses).
func ProcessReaderFor(device string) ProcessReader {
	switch {
	case strings.HasPrefix(device, "cuda:"):
		return &smiProcesses{}
	case strings.HasPrefix(device, "drm:"):
		return &drmProcesses{proc: procRoot, sys: sysRoot}
	}
	return nil
}

// selfSMI is the nvidia-smi reader of ProcessUsage, kept for the uuid of each GPU index it
// has read.
var selfSMI = &smiProcesses{}

// ProcessUsage returns the memory process pid uses on device, as the device's driver
// reports it for that process, whatever put it there (the CUDA EP, the WebGPU EP on
// Vulkan, ...): a worker measures itself with it.
//
//   - cuda:N: nvidia-smi's used_memory of pid on that GPU (--query-compute-apps, summed
//     over its rows). A Vulkan process (the WebGPU EP) has a compute context on the GPU
//     (type C+G in nvidia-smi's table), and is listed there too. A process not listed
//     (yet) uses 0; a row whose memory is not reported ([N/A]) counts 0.
//   - drm:N: the DRM clients in pid's own fdinfo on that card (drm.go, fdinfoBytes).
//
// ok is false where device has no such reader (cpu, or a KIND ortbus cannot read); err
// is a reading that failed where there is one.
func ProcessUsage(device string, pid int) (bytes int64, ok bool, err error) {
	reader := strings.HasPrefix(device, "cuda:") || strings.HasPrefix(device, "drm:")
	if !reader {
		return 0, false, nil
	}
	if pid <= 0 {
		return 0, true, fmt.Errorf("device %s: pid %d is not a process", device, pid)
	}
	if strings.HasPrefix(device, "drm:") {
		b, err := drmProcessUsage(procRoot, sysRoot, device, pid)
		return b, true, err
	}
	by, err := selfSMI.ProcessMemory(device)
	if err != nil {
		return 0, true, err
	}
	return by[pid], true, nil
}

// smiProcesses reads the compute processes of an NVIDIA GPU through nvidia-smi: the GPU
// index of cuda:N is mapped to its uuid (--query-gpu=index,uuid, kept once read: it does
// not change while the machine runs), and the rows of --query-compute-apps whose gpu_uuid
// is that one are its processes. A row whose used_memory is not a number ([N/A]: not
// reported, e.g. in MIG mode or without the rights) counts no bytes.
type smiProcesses struct {
	mu   sync.Mutex
	uuid map[string]string // GPU index -> uuid
}

func (s *smiProcesses) ProcessMemory(device string) (map[int]int64, error) {
	index, ok := strings.CutPrefix(device, "cuda:")
	if !ok {
		return nil, fmt.Errorf("device %s: no per-process memory reader", device)
	}
	uuid, err := s.uuidOf(index)
	if err != nil {
		return nil, err
	}
	out, err := runSMI("--query-compute-apps=gpu_uuid,pid,used_memory", "--format=csv,noheader,nounits")
	if err != nil {
		return nil, err
	}
	return parseComputeApps(out, uuid)
}

func (s *smiProcesses) uuidOf(index string) (string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if u, ok := s.uuid[index]; ok {
		return u, nil
	}
	out, err := runSMI("--query-gpu=index,uuid", "--format=csv,noheader")
	if err != nil {
		return "", err
	}
	m := map[string]string{}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		if line = strings.TrimSpace(line); line == "" {
			continue
		}
		i, u, ok := strings.Cut(line, ",")
		if !ok {
			return "", fmt.Errorf("nvidia-smi --query-gpu=index,uuid: unexpected line %q", line)
		}
		m[strings.TrimSpace(i)] = strings.TrimSpace(u)
	}
	u, ok := m[index]
	if !ok {
		return "", fmt.Errorf("nvidia-smi lists no GPU of index %s", index)
	}
	s.uuid = m
	return u, nil
}

// parseComputeApps sums, per pid, the used memory (MiB) of the rows gpu_uuid, pid,
// used_memory whose uuid is the given one.
func parseComputeApps(out []byte, uuid string) (map[int]int64, error) {
	by := map[int]int64{}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		if line = strings.TrimSpace(line); line == "" {
			continue
		}
		f := strings.Split(line, ",")
		if len(f) != 3 {
			return nil, fmt.Errorf("nvidia-smi --query-compute-apps: unexpected line %q", line)
		}
		pid, err := strconv.Atoi(strings.TrimSpace(f[1]))
		if err != nil || pid <= 0 {
			return nil, fmt.Errorf("nvidia-smi --query-compute-apps: unexpected pid in %q", line)
		}
		if strings.TrimSpace(f[0]) != uuid {
			continue
		}
		mib, err := strconv.ParseInt(strings.TrimSpace(f[2]), 10, 64)
		if err != nil || mib < 0 {
			by[pid] += 0 // listed, its usage not reported
			continue
		}
		by[pid] += mib << 20
	}
	return by, nil
}

// runSMI runs nvidia-smi with args (bounded to 5 s, and a second more for its output).
func runSMI(args ...string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, smiCommand, args...)
	cmd.WaitDelay = time.Second
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("nvidia-smi %s: %w", args[0], err)
	}
	return out, nil
}
