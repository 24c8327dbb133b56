package bench

// What `bench profile` measures of one service's processes while it runs alone: their
// CPU time, their memory (on the service's device where it has a per-process reader, else
// resident), and the power drawn (RAPL for the CPU, nvidia-smi for an NVIDIA GPU).

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/procfs"

	"github.com/ortbus/ortbus/devices"
)

// sampleEvery is how often the sampler reads the service's processes: often enough for a
// peak over a run of seconds; a device read through nvidia-smi (tens of ms a call) every
// sampleEveryDevice.
const (
	sampleEvery       = 50 * time.Millisecond
	sampleEveryDevice = 200 * time.Millisecond
)

// procSampler samples the processes pids() names (read again at each sample: a tenant's
// processes come and go) for their CPU time and memory.
type procSampler struct {
	pids   func() []int
	device string // "" or cpu: resident memory; else the device's per-process reader
	every  time.Duration
	source string // where the memory figure comes from

	mu      sync.Mutex
	first   map[int]float64 // CPU seconds of each pid when first seen
	last    map[int]float64 // and when last seen
	peak    int64
	idle    int64
	samples int
	readErr error
	lastMem int64 // the last sample's memory
}

// newProcSampler samples pids' memory on device: a GPU device with a per-process reader
// (devices.ProcessReaderFor: nvidia-smi for cuda:N, DRM fdinfo for drm:N) gives each
// process's memory there, any other its resident set (host memory: the CPU's, and
// lavapipe's, whose "GPU" memory is host memory).
func newProcSampler(pids func() []int, device string) *procSampler {
	s := &procSampler{pids: pids, every: sampleEvery, first: map[int]float64{}, last: map[int]float64{}, source: "host RSS of the service's processes (/proc/PID/stat)"}
	if device != "" && device != "cpu" && devices.ProcessReaderFor(device) != nil {
		s.device, s.every = device, sampleEveryDevice
		s.source = device + " per-process memory (" + devices.ProcessSource(device) + ")"
	}
	return s
}

// sample reads every process once: CPU seconds, and memory summed (its peak kept).
func (s *procSampler) sample() {
	var mem int64
	seen := 0
	cpu := map[int]float64{}
	for _, pid := range s.pids() {
		p, err := procfs.NewProc(pid)
		if err != nil {
			continue // gone
		}
		st, err := p.Stat()
		if err != nil {
			continue
		}
		seen++
		cpu[pid] = st.CPUTime()
		if s.device == "" {
			mem += int64(st.ResidentMemory())
			continue
		}
		b, ok, err := devices.ProcessUsage(s.device, pid)
		if err != nil {
			s.mu.Lock()
			s.readErr = err
			s.mu.Unlock()
		}
		if ok {
			mem += b
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for pid, c := range cpu {
		if _, ok := s.first[pid]; !ok {
			s.first[pid] = c
		}
		s.last[pid] = c
	}
	s.lastMem = mem
	if seen > 0 {
		s.samples++
		s.peak = max(s.peak, mem)
	}
}

// takeIdle samples now and keeps the figure as the idle memory.
func (s *procSampler) takeIdle() {
	s.sample()
	s.mu.Lock()
	defer s.mu.Unlock()
	s.idle = s.lastMem
}

// run samples until ctx ends, then once more.
func (s *procSampler) run(ctx context.Context) {
	t := time.NewTicker(s.every)
	defer t.Stop()
	for {
		s.sample()
		select {
		case <-ctx.Done():
			s.sample()
			return
		case <-t.C:
		}
	}
}

// cpuSeconds is the CPU time the processes used between their first and last samples.
func (s *procSampler) cpuSeconds() float64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	var sum float64
	for pid, l := range s.last {
		sum += max(0, l-s.first[pid])
	}
	return sum
}

// powerMeter reads the power a service's device draws over a run: an NVIDIA GPU's
// power.draw (nvidia-smi, sampled), else the CPU packages' energy counters (RAPL, the
// powercap sysfs), else nothing, saying why.
type powerMeter struct {
	source string
	note   string
	// RAPL: the packages' counters at the start, and their wrap-around ranges.
	rapl      []string
	raplStart []int64
	raplRange []int64
	t0        time.Time
	// nvidia-smi: the GPU's index and the readings.
	gpu     string
	mu      sync.Mutex
	watts   []float64
	smiErr  error
	stopped chan struct{}
	wg      sync.WaitGroup
}

// raplRoot is where the powercap sysfs lists RAPL zones (a variable for the tests).
var raplRoot = "/sys/class/powercap"

// newPowerMeter picks the reading for device: cuda:N an NVIDIA GPU's board power, drm:N
// none (said in the note), any other device (cpu, lavapipe's logical GPU, which is the
// CPU) the CPU packages' RAPL energy. The figure is the whole device's, every process on it included:
// run a profile on an otherwise idle machine.
func newPowerMeter(device string) *powerMeter {
	m := &powerMeter{stopped: make(chan struct{})}
	if idx, ok := strings.CutPrefix(device, "cuda:"); ok {
		if _, err := smiPower(idx); err == nil {
			m.gpu, m.source = idx, "nvidia-smi power.draw of GPU "+idx+" (the whole board, sampled)"
			return m
		} else {
			m.note = "no power reading: nvidia-smi power.draw of GPU " + idx + ": " + oneLine(err.Error())
			return m
		}
	}
	if strings.HasPrefix(device, "drm:") {
		// RAPL is the CPU's: it says nothing of an AMD or Intel GPU's draw.
		m.note = "no power reading for " + device + ": ortbus reads nvidia-smi's power.draw for NVIDIA GPUs and RAPL for the CPU, not yet a DRM GPU's hwmon"
		return m
	}
	zones, _ := filepath.Glob(filepath.Join(raplRoot, "intel-rapl:*"))
	var why []string
	for _, z := range zones {
		if strings.Count(filepath.Base(z), ":") != 1 {
			continue // a subzone (core, uncore, dram): counted in its package
		}
		e, err := readInt(filepath.Join(z, "energy_uj"))
		if err != nil {
			why = append(why, oneLine(err.Error()))
			continue
		}
		r, err := readInt(filepath.Join(z, "max_energy_range_uj"))
		if err != nil {
			r = 0
		}
		m.rapl, m.raplStart, m.raplRange = append(m.rapl, z), append(m.raplStart, e), append(m.raplRange, r)
	}
	switch {
	case len(m.rapl) > 0:
		m.source = fmt.Sprintf("RAPL package energy (%d package(s), %s: the whole CPU, every process)", len(m.rapl), raplRoot)
	case len(zones) == 0:
		m.note = "no power reading: no RAPL zone under " + raplRoot + " (no Intel/AMD RAPL exposed here: a VM, a container without /sys/class/powercap, or another CPU)"
	default:
		m.note = "no power reading: RAPL energy not readable (" + strings.Join(why, "; ") + "; energy_uj is root-only on recent kernels)"
	}
	return m
}

// start begins the measurement.
func (m *powerMeter) start() {
	m.t0 = time.Now()
	if m.gpu == "" {
		return
	}
	m.wg.Go(func() {
		t := time.NewTicker(sampleEveryDevice)
		defer t.Stop()
		for {
			w, err := smiPower(m.gpu)
			m.mu.Lock()
			if err != nil {
				m.smiErr = err
			} else {
				m.watts = append(m.watts, w)
			}
			m.mu.Unlock()
			select {
			case <-m.stopped:
				return
			case <-t.C:
			}
		}
	})
}

// stop ends the measurement: the mean power in watts, or a note saying why there is none.
func (m *powerMeter) stop() (watts *float64, note string) {
	if m.gpu != "" {
		close(m.stopped)
		m.wg.Wait()
		m.mu.Lock()
		defer m.mu.Unlock()
		if len(m.watts) == 0 {
			return nil, fmt.Sprintf("no power reading: nvidia-smi power.draw gave none (%v)", m.smiErr)
		}
		var sum float64
		for _, w := range m.watts {
			sum += w
		}
		v := sum / float64(len(m.watts))
		return &v, ""
	}
	if len(m.rapl) == 0 {
		return nil, m.note
	}
	secs := time.Since(m.t0).Seconds()
	var uj int64
	for i, z := range m.rapl {
		e, err := readInt(filepath.Join(z, "energy_uj"))
		if err != nil {
			return nil, "no power reading: RAPL energy not readable at the end (" + oneLine(err.Error()) + ")"
		}
		d := e - m.raplStart[i]
		if d < 0 && m.raplRange[i] > 0 { // the counter wrapped
			d += m.raplRange[i]
		}
		uj += max(0, d)
	}
	if secs <= 0 {
		return nil, "no power reading: the run took no time"
	}
	v := float64(uj) / 1e6 / secs
	return &v, ""
}

// smiPower is GPU idx's power.draw in watts.
func smiPower(idx string) (float64, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, "nvidia-smi", "--query-gpu=power.draw", "--format=csv,noheader,nounits", "-i", idx).Output()
	if err != nil {
		return 0, err
	}
	s := strings.TrimSpace(string(out))
	v, err := strconv.ParseFloat(s, 64)
	if err != nil || v < 0 || v > 1e5 {
		return 0, fmt.Errorf("power.draw %q is not a figure (a GPU without power readings says [N/A])", s)
	}
	return v, nil
}

// readInt reads a sysfs file holding one decimal integer.
func readInt(path string) (int64, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	v, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("%s: %w", path, err)
	}
	if v < 0 {
		return 0, errors.New(path + ": negative")
	}
	return v, nil
}

// descendants are the processes under root (its children, theirs, …) but not under any
// of skip: /proc/*/stat's parent links.
func descendants(root int, skip ...int) []int {
	procs, err := procfs.AllProcs()
	if err != nil {
		return nil
	}
	parent := map[int]int{}
	for _, p := range procs {
		if st, err := p.Stat(); err == nil {
			parent[p.PID] = st.PPID
		}
	}
	var out []int
	for pid := range parent {
		for q, hops := pid, 0; q > 1 && hops < 64; q, hops = parent[q], hops+1 {
			if q != pid && q == root {
				out = append(out, pid)
				break
			}
			if slices.Contains(skip, q) {
				break
			}
		}
	}
	return out
}
