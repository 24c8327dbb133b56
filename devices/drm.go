package devices

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
)

// The roots of procfs and sysfs: every DRM reading goes under them (a test points them at
// a fixture tree).
var (
	procRoot = "/proc"
	sysRoot  = "/sys"
)

// Bounds on what a DRM reading takes in. fdinfo files are a few hundred bytes and sysfs
// numbers a line; anything larger is not what the kernel prints for a DRM client (an
// epoll or inotify fdinfo can be long) and is skipped, never read on.
const (
	maxFdinfoBytes = 64 << 10
	maxFdinfoLine  = 4 << 10
	maxSysfsBytes  = 4 << 10
)

var errTooLong = errors.New("longer than its bound")

// readBounded reads path whole when it holds at most limit bytes, else errTooLong.
func readBounded(path string, limit int) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, int64(limit)+1))
	if err != nil {
		return nil, err
	}
	if len(b) > limit {
		return nil, fmt.Errorf("%s: %w", path, errTooLong)
	}
	return b, nil
}

// readSysfsInt reads a sysfs file holding one decimal count of bytes.
func readSysfsInt(path string) (int64, error) {
	b, err := readBounded(path, maxSysfsBytes)
	if err != nil {
		return 0, err
	}
	n, err := strconv.ParseUint(strings.TrimSpace(string(b)), 10, 63)
	if err != nil {
		return 0, fmt.Errorf("%s: not a count of bytes: %q", path, bytes.TrimSpace(b))
	}
	return int64(n), nil
}

// drmCard is the DRM card a device drm:N names: /dev/dri/cardN, /sys/class/drm/cardN.
type drmCard struct {
	device string // drm:N
	dir    string // SYS/class/drm/cardN
	pdev   string // its PCI address, as fdinfo's drm-pdev prints it: 0000:03:00.0
	driver string // the kernel driver bound to it (amdgpu, i915, xe), "" when unknown
}

// drmCardOf finds the card of device drm:N under sys. N is the card's index, written
// plainly (drm:0, never drm:00). The card's PCI address is the last element of the target
// of its device link (SYS/class/drm/cardN/device -> ../../../0000:03:00.0); a card that
// is not a PCI device has no drm-pdev in its clients' fdinfo and cannot be read.
func drmCardOf(sys, device string) (drmCard, error) {
	idx, ok := strings.CutPrefix(device, "drm:")
	n, err := strconv.Atoi(idx)
	if !ok || err != nil || n < 0 || strconv.Itoa(n) != idx {
		return drmCard{}, fmt.Errorf("device %s: want drm:N, N the index of /dev/dri/cardN", device)
	}
	c := drmCard{device: device, dir: filepath.Join(sys, "class", "drm", "card"+idx)}
	target, err := os.Readlink(filepath.Join(c.dir, "device"))
	if err != nil {
		return drmCard{}, fmt.Errorf("device %s: no DRM card%s: %w", device, idx, err)
	}
	c.pdev = filepath.Base(target)
	if !isPCIAddress(c.pdev) {
		return drmCard{}, fmt.Errorf("device %s: card%s is not a PCI device (%s)", device, idx, c.pdev)
	}
	if b, err := readBounded(filepath.Join(c.dir, "device", "uevent"), maxSysfsBytes); err == nil {
		for line := range strings.Lines(string(b)) {
			if d, ok := strings.CutPrefix(strings.TrimSpace(line), "DRIVER="); ok {
				c.driver = d
			}
		}
	}
	return c, nil
}

// isPCIAddress reports whether s is DOMAIN:BUS:SLOT.FUNCTION (0000:03:00.0).
func isPCIAddress(s string) bool {
	f := strings.Split(s, ":")
	if len(f) != 3 || len(f[1]) != 2 {
		return false
	}
	slot, fn, ok := strings.Cut(f[2], ".")
	if !ok || len(slot) != 2 || len(fn) != 1 {
		return false
	}
	for _, h := range []string{f[0], f[1], slot, fn} {
		if _, err := strconv.ParseUint(h, 16, 32); err != nil {
			return false
		}
	}
	return true
}

// integrated reports whether the card sits on PCI bus 00: a GPU built into the processor
// is a root-complex device there (Intel's integrated GPUs are always 0000:00:02.0), while
// a discrete card sits behind a root port, on a bus of its own. (AMD's APUs sit behind an
// internal bridge, off bus 00, but amdgpu publishes their memory: drmCapacity.)
func (c drmCard) integrated() bool {
	f := strings.Split(c.pdev, ":")
	return len(f) == 3 && f[1] == "00"
}

// drmCapacity is the memory of a DRM card, from what its driver publishes in sysfs:
//
//   - amdgpu: device/mem_info_vram_total (bytes; an APU's is its VRAM carve-out, which is
//     also what its clients' fdinfo counts: the vram region, by the rule of fdinfoBytes);
//   - xe, on the kernels that publish it: device/tileT/physical_vram_size_bytes, summed
//     over the tiles;
//   - i915 with Intel's backported driver: lmem_total_bytes (on the card, or its device).
//     Mainline i915 and xe publish no total of a discrete card's memory;
//   - an integrated GPU that publishes nothing has no memory of its own: it allocates the
//     host's, so its capacity is the host's memory (MemTotal), and the source says so.
//
// Anything else is unknown: its capacity must be configured.
func drmCapacity(sys, proc string, c drmCard) (int64, string, error) {
	dev := filepath.Join(c.dir, "device")
	if n, err := readSysfsInt(filepath.Join(dev, "mem_info_vram_total")); err == nil {
		return n, c.driverOr("amdgpu") + " sysfs mem_info_vram_total", nil
	}
	if tiles, _ := filepath.Glob(filepath.Join(dev, "tile[0-9]*", "physical_vram_size_bytes")); len(tiles) > 0 {
		var sum int64
		for _, t := range tiles {
			n, err := readSysfsInt(t)
			if err != nil {
				return 0, "", fmt.Errorf("device %s: %w", c.device, err)
			}
			sum = satAdd(sum, n)
		}
		return sum, c.driverOr("xe") + " sysfs tile*/physical_vram_size_bytes", nil
	}
	for _, p := range []string{filepath.Join(c.dir, "lmem_total_bytes"), filepath.Join(dev, "lmem_total_bytes")} {
		if n, err := readSysfsInt(p); err == nil {
			return n, c.driverOr("i915") + " sysfs lmem_total_bytes", nil
		}
	}
	if c.integrated() {
		kb, err := meminfoAt(proc, "MemTotal")
		src := fmt.Sprintf("host memory (/proc/meminfo): %s is an integrated GPU (PCI %s) that shares it", c.device, c.pdev)
		return kb << 10, src, err
	}
	return 0, "", fmt.Errorf("device %s: its driver (%s, PCI %s) publishes no memory size in sysfs; set devices.%q.capacity in the config", c.device, c.driverOr("unknown"), c.pdev, c.device)
}

// drmUsed is the memory in use on a card, where its driver publishes it (amdgpu's
// mem_info_vram_used); ok is false elsewhere.
func drmUsed(c drmCard) (int64, bool) {
	n, err := readSysfsInt(filepath.Join(c.dir, "device", "mem_info_vram_used"))
	return n, err == nil
}

func (c drmCard) driverOr(def string) string {
	if c.driver != "" {
		return c.driver
	}
	return def
}

// drmClient is one DRM client (an open DRM file, struct drm_file in the kernel) as its
// fdinfo describes it.
type drmClient struct {
	driver string // drm-driver
	pdev   string // drm-pdev
	id     string // drm-client-id, "" when not printed
	bytes  int64  // its memory on the device, by the rule of fdinfoBytes
}

// memStat is one region's figures in a client's fdinfo; a key repeated keeps its first
// value.
type memStat struct {
	resident, total, memory          int64
	hasResident, hasTotal, hasMemory bool
}

// parseFdinfo reads a DRM client from the text of /proc/PID/fdinfo/FD, following the
// kernel's "DRM client usage stats" (Documentation/gpu/drm-usage-stats.rst): one
// "key: value" a line, numbers with an optional unit (none: bytes; KiB, MiB, GiB). ok is
// false for an fd that is no DRM client (no drm-driver line) and for a text past the
// bounds (a line over maxFdinfoLine). A malformed line, or a memory value that is not a
// number, a unit or fits no int64, is skipped: it counts nothing.
func parseFdinfo(text []byte) (drmClient, bool) {
	var c drmClient
	regions := map[string]*memStat{}
	for line := range strings.Lines(string(text)) {
		if len(line) > maxFdinfoLine {
			return drmClient{}, false
		}
		key, val, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		key, val = strings.TrimSpace(key), strings.TrimSpace(val)
		switch key {
		case "drm-driver":
			c.driver = val
			continue
		case "drm-pdev":
			c.pdev = val
			continue
		case "drm-client-id":
			c.id = val
			continue
		}
		stat, region := memKey(key)
		if stat == "" {
			continue
		}
		n, ok := parseSize(val)
		if !ok {
			continue
		}
		s := regions[region]
		if s == nil {
			s = &memStat{}
			regions[region] = s
		}
		switch {
		case stat == "resident" && !s.hasResident:
			s.resident, s.hasResident = n, true
		case stat == "total" && !s.hasTotal:
			s.total, s.hasTotal = n, true
		case stat == "memory" && !s.hasMemory:
			s.memory, s.hasMemory = n, true
		}
	}
	if c.driver == "" {
		return drmClient{}, false
	}
	c.bytes = fdinfoBytes(regions)
	return c, true
}

// memKey splits a memory key drm-STAT-REGION of the stats read (resident, total, and
// amdgpu's older memory) into STAT and REGION; stat is "" for any other key, and for
// drm-total-cycles-ENGINE, an engine's cycle count that only looks like a region's total.
func memKey(key string) (stat, region string) {
	for _, s := range []string{"resident", "total", "memory"} {
		if r, ok := strings.CutPrefix(key, "drm-"+s+"-"); ok && r != "" && !strings.HasPrefix(r, "cycles-") {
			return s, r
		}
	}
	return "", ""
}

// fdinfoBytes is a client's memory on its device, from its regions' figures. The rule:
//
//   - A device with memory of its own (a client's fdinfo lists every region of its
//     device, and one named vram* or local* is device-local memory: amdgpu's vram, xe's
//     vram0, vram1, i915's local0 on a discrete card) counts those regions only: what a
//     client holds in host memory (gtt, system, cpu) takes nothing from the device.
//   - A device without (an integrated GPU: i915's system0 and stolen-system0, xe's system,
//     gtt and stolen, the core's "memory") allocates the host's memory, and counts every
//     region: each buffer is accounted in one region only.
//   - A region's figure is drm-resident-REGION (what is backed now), else drm-total-REGION
//     (all that is allocated, backed or not), else amdgpu's drm-memory-REGION (its older
//     name of resident).
func fdinfoBytes(regions map[string]*memStat) int64 {
	local := false
	for r := range regions {
		if isDeviceLocal(r) {
			local = true
		}
	}
	var sum int64
	for r, s := range regions {
		if isDeviceLocal(r) != local {
			continue
		}
		switch {
		case s.hasResident:
			sum = satAdd(sum, s.resident)
		case s.hasTotal:
			sum = satAdd(sum, s.total)
		case s.hasMemory:
			sum = satAdd(sum, s.memory)
		}
	}
	return sum
}

func isDeviceLocal(region string) bool {
	return strings.HasPrefix(region, "vram") || strings.HasPrefix(region, "local")
}

// parseSize reads "N" (bytes) or "N UNIT", UNIT KiB, MiB or GiB.
func parseSize(v string) (int64, bool) {
	f := strings.Fields(v)
	if len(f) == 0 || len(f) > 2 {
		return 0, false
	}
	n, err := strconv.ParseUint(f[0], 10, 63)
	if err != nil {
		return 0, false
	}
	var shift uint
	if len(f) == 2 {
		switch f[1] {
		case "KiB":
			shift = 10
		case "MiB":
			shift = 20
		case "GiB":
			shift = 30
		default:
			return 0, false
		}
	}
	if n > math.MaxInt64>>shift {
		return 0, false
	}
	return int64(n) << shift, true
}

// satAdd adds two non-negative counts, stopping at the largest int64.
func satAdd(a, b int64) int64 {
	if a > math.MaxInt64-b {
		return math.MaxInt64
	}
	return a + b
}

// pidClient is a client of one process on a card: key identifies the client (its
// drm-client-id, unique on a card; a client that prints none is its fd, and counts once
// per fd).
type pidClient struct {
	key   string
	bytes int64
}

// pidClients reads the DRM clients of process pid on the card at PCI address pdev: each
// fd whose fdinfo has a drm-driver line and a drm-pdev of that address, in the order of
// the fds, each client once (several fds can share one: dup, or an fd received from
// another process). err is set only when the process's fds cannot be listed (it exited,
// or is not ours to read). An fd that vanishes while it is read (closed, or its process
// exited), or whose fdinfo is past the bounds, is skipped. An fd whose link names no
// /dri/ node (a socket, a pipe, a file) is skipped without reading its fdinfo.
func pidClients(proc string, pid int, pdev string) ([]pidClient, error) {
	dir := filepath.Join(proc, strconv.Itoa(pid))
	ents, err := os.ReadDir(filepath.Join(dir, "fdinfo"))
	if err != nil {
		return nil, err
	}
	fds := make([]int, 0, len(ents))
	for _, e := range ents {
		if fd, err := strconv.Atoi(e.Name()); err == nil && fd >= 0 {
			fds = append(fds, fd)
		}
	}
	slices.Sort(fds)
	var out []pidClient
	seen := map[string]bool{}
	for _, fd := range fds {
		name := strconv.Itoa(fd)
		if target, err := os.Readlink(filepath.Join(dir, "fd", name)); err == nil && !strings.Contains(target, "/dri/") {
			continue
		}
		text, err := readBounded(filepath.Join(dir, "fdinfo", name), maxFdinfoBytes)
		if err != nil {
			continue
		}
		c, ok := parseFdinfo(text)
		if !ok || !strings.EqualFold(c.pdev, pdev) {
			continue
		}
		key := "id:" + c.id
		if c.id == "" {
			key = "fd:" + strconv.Itoa(pid) + "/" + name
		}
		if seen[key] {
			continue
		}
		seen[key] = true
		out = append(out, pidClient{key: key, bytes: c.bytes})
	}
	return out, nil
}

// drmProcesses reads the memory each process uses on a DRM card from the fdinfo of every
// process's DRM fds (DRM client usage stats): the gateway's count of what processes
// outside ortbus hold on an AMD or Intel GPU. It sees the processes whose fdinfo it may
// read (its user's; every process's with CAP_SYS_PTRACE).
type drmProcesses struct {
	proc, sys string
}

// ProcessMemory maps each process holding a DRM client on the card to the bytes of its
// clients. A client shared by several processes (an fd inherited or passed on) is counted
// once, at the lowest of their pids; a process whose clients are all counted elsewhere is
// listed with 0. A process that exits during the scan, or whose fds are not ours to read,
// is left out.
func (r *drmProcesses) ProcessMemory(device string) (map[int]int64, error) {
	card, err := drmCardOf(r.sys, device)
	if err != nil {
		return nil, err
	}
	ents, err := os.ReadDir(r.proc)
	if err != nil {
		return nil, fmt.Errorf("device %s: %w", device, err)
	}
	var pids []int
	for _, e := range ents {
		if pid, err := strconv.Atoi(e.Name()); err == nil && pid > 0 {
			pids = append(pids, pid)
		}
	}
	slices.Sort(pids)
	by := map[int]int64{}
	counted := map[string]bool{}
	for _, pid := range pids {
		clients, err := pidClients(r.proc, pid, card.pdev)
		if err != nil {
			continue
		}
		for _, c := range clients {
			b := by[pid]
			if !counted[c.key] {
				counted[c.key] = true
				b = satAdd(b, c.bytes)
			}
			by[pid] = b
		}
	}
	return by, nil
}

// drmProcessUsage is the memory process pid's own DRM clients hold on the card (its
// fdinfo only, not the whole of /proc).
func drmProcessUsage(proc, sys, device string, pid int) (int64, error) {
	card, err := drmCardOf(sys, device)
	if err != nil {
		return 0, err
	}
	clients, err := pidClients(proc, pid, card.pdev)
	if err != nil {
		return 0, fmt.Errorf("device %s: pid %d: %w", device, pid, err)
	}
	var sum int64
	for _, c := range clients {
		sum = satAdd(sum, c.bytes)
	}
	return sum, nil
}
