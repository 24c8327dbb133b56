package worker

import (
	"context"
	"os"
	"sync"
	"time"

	"github.com/ortbus/ortbus/devices"
)

// devMem is this worker's own memory on its pool's device, as the device's driver
// reports it for this process (devices.ProcessUsage: nvidia-smi's per-process figure for
// cuda:N, DRM fdinfo for drm:N), whatever the EP that put it there (CUDA, WebGPU, ...).
//
// It serves two readers:
//   - a model's load (measure): the figure read before the model is opened and again after
//     its warm-up runs; the growth is the model's peak on the device (source "device"),
//     what admission counts. Those reads go to the driver directly (now).
//   - the heartbeat: the latest sample (last), taken by run every interval on its own
//     goroutine, so that a slow driver query (nvidia-smi takes ~25 ms, and up to its 5 s
//     bound when the driver hangs) never delays a beat.
//
// A device without a per-process reader (cpu; a KIND:N ortbus cannot read) is not
// measured: ok is false and the heartbeat says nothing of it. A nil devMem (a test's
// worker built without New) measures nothing.
type devMem struct {
	device string
	pid    int
	read   func(device string, pid int) (int64, bool, error) // devices.ProcessUsage; a test's fake

	mu     sync.Mutex
	bytes  int64
	source string // "" until a sample succeeded
}

func newDevMem(device string) *devMem {
	return &devMem{device: device, pid: os.Getpid(), read: devices.ProcessUsage}
}

// now reads the process's memory on the device from the driver (ok false: no reader, or
// the reading failed), and keeps it as the latest sample.
func (d *devMem) now() (int64, bool) {
	if d == nil {
		return 0, false
	}
	b, ok, err := d.read(d.device, d.pid)
	if err != nil || !ok {
		return 0, false
	}
	d.mu.Lock()
	d.bytes, d.source = b, devices.ProcessSource(d.device)
	d.mu.Unlock()
	return b, true
}

// last is the latest sample and its reader's name ("" when none succeeded yet).
func (d *devMem) last() (int64, string) {
	if d == nil {
		return 0, ""
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.bytes, d.source
}

// run samples every interval until ctx ends. A device without a reader is read once,
// then left alone.
func (d *devMem) run(ctx context.Context, every time.Duration) {
	if d == nil {
		return
	}
	if _, ok := d.now(); !ok && devices.ProcessSource(d.device) == "" {
		return
	}
	t := time.NewTicker(max(every, 100*time.Millisecond))
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			d.now()
		}
	}
}
