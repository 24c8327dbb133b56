package bench

// The independent check of the workers' device memory (issue 41, item 2). A worker's
// device_bytes is its own process's memory on its device as the driver reports it per
// process (nvidia-smi's compute apps for cuda:N): held against the same per-process
// query it would be checked against itself. The independent figure is the device's own
// used memory (nvidia-smi's memory.used): read before the workers start and again with
// them loaded, its growth less what the other processes on the device (every pid that is
// not a worker's, read per process both times) grew by is what the workers put there.
// Their device_bytes must sum to it within memCheckTolerance.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"slices"
	"strings"

	"github.com/ortbus/ortbus/codec"
	"github.com/ortbus/ortbus/devices"
)

// memCheckTolerance is how far the workers' sum may be from the device's growth, as a
// share of the growth.
const memCheckTolerance = 0.10

// DeviceReading is one reading of a device's memory: its used bytes, and each process's
// on it (pid -> bytes).
type DeviceReading struct {
	Device    string        `json:"device"`
	UsedBytes int64         `json:"used_bytes"`
	Procs     map[int]int64 `json:"procs"`
}

// readDevice reads device's used memory and its processes' (devices.Used and its
// process reader: nvidia-smi for cuda:N, DRM for drm:N); an error where it has either
// reading missing.
func readDevice(device string) (DeviceReading, error) {
	used, ok := devices.Used(device)
	if !ok {
		return DeviceReading{}, fmt.Errorf("device %s: %s", device, NoMemoryReading)
	}
	r := devices.ProcessReaderFor(device)
	if r == nil {
		return DeviceReading{}, fmt.Errorf("device %s: no reader of its processes' memory", device)
	}
	procs, err := r.ProcessMemory(device)
	if err != nil {
		return DeviceReading{}, fmt.Errorf("device %s: its processes: %w", device, err)
	}
	return DeviceReading{Device: device, UsedBytes: used, Procs: procs}, nil
}

// MemCheck is the check's figures and verdict.
type MemCheck struct {
	// Run names the bench run whose workers were checked ("" in gpu-check's step).
	Run    string `json:"run,omitempty"`
	Device string `json:"device"`
	// Workers is each worker's device_bytes (by pid), WorkersBytes their sum.
	Workers      map[int]int64 `json:"workers"`
	WorkersBytes int64         `json:"workers_bytes"`
	// UsedBefore and UsedAfter are the device's used memory before the workers started
	// and with them loaded; ForeignBefore and ForeignAfter the memory of the other
	// processes on it then; DeviceBytes = (UsedAfter - UsedBefore) - (ForeignAfter -
	// ForeignBefore), what the workers put on the device by the device's own count.
	UsedBefore    int64 `json:"used_before_bytes"`
	UsedAfter     int64 `json:"used_after_bytes"`
	ForeignBefore int64 `json:"foreign_before_bytes"`
	ForeignAfter  int64 `json:"foreign_after_bytes"`
	DeviceBytes   int64 `json:"device_bytes"`
	// Off is |WorkersBytes - DeviceBytes| / DeviceBytes.
	Off float64 `json:"off"`
	// Verdict is "ok", "off by more than 10%", or "not measured: why".
	Verdict string `json:"verdict"`
}

// OK reports whether the workers' sum is within the tolerance of the device's growth.
func (m *MemCheck) OK() bool { return m != nil && m.Verdict == "ok" }

// checkDeviceMemory holds the workers' device_bytes (pid -> bytes) against the device's
// growth from before to after, less the other processes' growth.
func checkDeviceMemory(before, after DeviceReading, workers map[int]int64) *MemCheck {
	m := &MemCheck{Device: after.Device, Workers: workers, UsedBefore: before.UsedBytes, UsedAfter: after.UsedBytes}
	for _, b := range workers {
		m.WorkersBytes += b
	}
	for pid, b := range before.Procs {
		if _, w := workers[pid]; !w {
			m.ForeignBefore += b
		}
	}
	for pid, b := range after.Procs {
		if _, w := workers[pid]; !w {
			m.ForeignAfter += b
		}
	}
	m.DeviceBytes = (m.UsedAfter - m.UsedBefore) - (m.ForeignAfter - m.ForeignBefore)
	switch {
	case len(workers) == 0:
		m.Verdict = "not measured: no worker reports device_bytes"
	case m.DeviceBytes <= 0:
		m.Verdict = fmt.Sprintf("not measured: the device's used memory did not grow with the workers (%s -> %s, other processes %s -> %s)",
			mibText(m.UsedBefore), mibText(m.UsedAfter), mibText(m.ForeignBefore), mibText(m.ForeignAfter))
	default:
		d := float64(m.WorkersBytes - m.DeviceBytes)
		m.Off = max(d, -d) / float64(m.DeviceBytes)
		m.Verdict = "ok"
		if m.Off > memCheckTolerance {
			m.Verdict = fmt.Sprintf("off by more than %.0f%%", 100*memCheckTolerance)
		}
	}
	return m
}

// checkSystem checks the memory of sys's workers on device, loaded, against the device's
// growth since before (read before sys started; beforeErr: it could not be): the check
// of the run named run, or why it was not measured.
func checkSystem(ctx context.Context, run, device string, sys *system, before DeviceReading, beforeErr error) *MemCheck {
	m := &MemCheck{Device: device}
	st, err := sys.status(ctx)
	after, aerr := readDevice(device)
	switch {
	case beforeErr != nil:
		m.Verdict = "not measured: the reading before the workers: " + oneLine(beforeErr.Error())
	case err != nil:
		m.Verdict = "not measured: status: " + oneLine(err.Error())
	case aerr != nil:
		m.Verdict = "not measured: the reading with the workers: " + oneLine(aerr.Error())
	default:
		m = checkDeviceMemory(before, after, workersOn(st, device))
	}
	m.Run = run
	return m
}

// judge puts m's verdict in rep: a target (the sum within 10% of the device's growth), or
// a note that it was not measured.
func (m *MemCheck) judge(rep *Report) {
	if strings.HasPrefix(m.Verdict, "not measured") {
		rep.note("%s: the workers' device memory against the device's: %s", m.Run, m.Verdict)
		return
	}
	rep.target(m.OK(), "%s: the workers' device_bytes sum to %s, the device grew by %s less its other processes' growth: off by %.1f%% (target within 10%%)",
		m.Run, mibText(m.WorkersBytes), mibText(m.DeviceBytes), 100*m.Off)
}

// workersOn is each live worker of status st on device that reports its device memory,
// by pid: its device_bytes.
func workersOn(st *codec.StatusReply, device string) map[int]int64 {
	out := map[int]int64{}
	for _, w := range st.Workers {
		if w.Device == device && w.State == codec.StateReady && w.DeviceSource != "" && w.PID > 0 {
			out[w.PID] = w.DeviceBytes
		}
	}
	return out
}

// print writes the check's table: each worker, the sums, the verdict.
func (m *MemCheck) print(w io.Writer) {
	fmt.Fprintf(w, "memory check on %s: each worker's device_bytes against the device's own growth (memory.used), other processes subtracted\n", m.Device)
	for _, pid := range slices.Sorted(maps.Keys(m.Workers)) {
		fmt.Fprintf(w, "  worker pid %d: device_bytes %s\n", pid, mibText(m.Workers[pid]))
	}
	fmt.Fprintf(w, "  workers' sum %s; device used %s -> %s, other processes %s -> %s: the workers put %s there; off %.1f%%: %s\n",
		mibText(m.WorkersBytes), mibText(m.UsedBefore), mibText(m.UsedAfter), mibText(m.ForeignBefore), mibText(m.ForeignAfter), mibText(m.DeviceBytes), 100*m.Off, m.Verdict)
}

func mibText(b int64) string { return fmt.Sprintf("%.1f MiB", float64(b)/(1<<20)) }

// MemCheckMain is `ortbus bench memcheck` (scripts/gpu-check.sh's memory step):
//
//	memcheck -device D -save FILE               a reading of D now, written to FILE
//	memcheck -device D -before FILE -status F   the check: FILE's reading, one now, and the
//	         [-out CHECK.json]                  workers of `ortbus status -json` F
//
// It prints the check and exits 1 when the sum is off or not measured, 2 on a usage or
// reading error.
func MemCheckMain(args []string, stdout, stderr io.Writer) int {
	o, err := parseMemCheckArgs(args)
	if err != nil {
		fmt.Fprintf(stderr, "ortbus bench memcheck: %v\nusage: ortbus bench memcheck -device D (-save FILE | -before FILE -status STATUS.json [-out CHECK.json])\n", err)
		return 2
	}
	now, err := readDevice(o["device"])
	if err != nil {
		fmt.Fprintf(stderr, "ortbus bench memcheck: %v\n", err)
		return 2
	}
	if o["save"] != "" {
		return writeJSON(stderr, o["save"], now)
	}
	var before DeviceReading
	var st codec.StatusReply
	if err := readJSON(o["before"], &before); err != nil {
		fmt.Fprintf(stderr, "ortbus bench memcheck: %v\n", err)
		return 2
	}
	if err := readJSON(o["status"], &st); err != nil {
		fmt.Fprintf(stderr, "ortbus bench memcheck: %v\n", err)
		return 2
	}
	m := checkDeviceMemory(before, now, workersOn(&st, o["device"]))
	m.print(stdout)
	if o["out"] != "" {
		if code := writeJSON(stderr, o["out"], m); code != 0 {
			return code
		}
	}
	if !m.OK() {
		return 1
	}
	return 0
}

// parseMemCheckArgs reads memcheck's flags (-name value pairs).
func parseMemCheckArgs(args []string) (map[string]string, error) {
	o := map[string]string{}
	for i := 0; i < len(args); i += 2 {
		name := strings.TrimPrefix(args[i], "-")
		if !slices.Contains([]string{"device", "save", "before", "status", "out"}, name) || i+1 >= len(args) {
			return nil, fmt.Errorf("unknown flag or no value: %q", args[i])
		}
		o[name] = args[i+1]
	}
	switch {
	case o["device"] == "":
		return nil, errors.New("-device is needed")
	case (o["save"] == "") == (o["before"] == "" || o["status"] == ""):
		return nil, errors.New("-save, or -before with -status")
	}
	return o, nil
}

// readJSON decodes the JSON file path into v.
func readJSON(path string, v any) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	if err := json.Unmarshal(b, v); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	return nil
}

// writeJSON writes v to path as JSON: 0, or 2 with the error said on stderr.
func writeJSON(stderr io.Writer, path string, v any) int {
	b, _ := json.MarshalIndent(v, "", "  ")
	if err := os.WriteFile(path, append(b, '\n'), 0o644); err != nil {
		fmt.Fprintf(stderr, "ortbus bench memcheck: %v\n", err)
		return 2
	}
	return 0
}
