package main

import (
	"github.com/prometheus/procfs"

	"github.com/ortbus/ortbus/devices"
)

// holderMemory is what the process pid and its descendants use on device, measured as
// the gateway measures a pressed lease's holder (gateway/press.go): on cpu their resident
// memory, on a device with a reader of its processes' memory (nvidia-smi for cuda:N, DRM
// fdinfo for drm:N) that reading; ok false where it cannot be measured.
func holderMemory(device string, pid int) (int64, bool) {
	tree := processTree(pid)
	if device == "cpu" {
		var sum int64
		for _, p := range tree {
			if proc, err := procfs.NewProc(p); err == nil {
				if st, err := proc.Stat(); err == nil {
					sum += int64(st.ResidentMemory())
				}
			}
		}
		return sum, sum > 0
	}
	r := devices.ProcessReaderFor(device)
	if r == nil {
		return 0, false
	}
	usage, err := r.ProcessMemory(device)
	if err != nil {
		return 0, false
	}
	var sum int64
	for _, p := range tree {
		sum += usage[p]
	}
	return sum, true
}

// maxTree bounds the processes of one holder's tree.
const maxTree = 4096

// processTree is pid and its descendants (at most maxTree), from /proc.
func processTree(pid int) []int {
	kids := map[int][]int{}
	if procs, err := procfs.AllProcs(); err == nil {
		for _, p := range procs {
			if st, err := p.Stat(); err == nil && st.PPID != p.PID {
				kids[st.PPID] = append(kids[st.PPID], p.PID)
			}
		}
	}
	out := []int{pid}
	for i := 0; i < len(out) && len(out) < maxTree; i++ {
		out = append(out, kids[out[i]]...)
	}
	return out[:min(len(out), maxTree)]
}
