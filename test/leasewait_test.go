package test

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/ortbus/ortbus/bench"
	"github.com/ortbus/ortbus/codec"
	"github.com/ortbus/ortbus/config"
	"github.com/ortbus/ortbus/subjects"
)

// heldProc is `ortbus lease ARGS -- ortbus bench mem-holder -bytes SIZE` running: the
// holder's event lines (ready, freed) as they come, the wrapper's stderr in a file. The
// test stops it (SIGTERM to the wrapper, which passes it on and releases its lease).
type heldProc struct {
	cmd    *exec.Cmd
	stderr string
	events chan bench.MemHolderEvent
	exited chan struct{}
}

// startHeld starts the memory holder of size under `ortbus lease` with args on the gateway
// g; the test stops it when it ends.
func startHeld(t *testing.T, g *gatewayProc, size string, args ...string) *heldProc {
	t.Helper()
	ortbus := testBinary(t, "ortbus")
	h := &heldProc{stderr: filepath.Join(t.TempDir(), "stderr"), events: make(chan bench.MemHolderEvent, 8), exited: make(chan struct{})}
	all := append(append([]string{"lease", "-s", g.Ready.NATSURL}, args...), "--", ortbus, "bench", "mem-holder", "-bytes", size)
	h.cmd = exec.Command(ortbus, all...)
	// A group of its own: the holder goes with its wrapper were the wrapper killed.
	h.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	f, err := os.Create(h.stderr)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	h.cmd.Stderr = f
	out, err := h.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := h.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		defer close(h.exited)
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			var ev bench.MemHolderEvent
			if json.Unmarshal(sc.Bytes(), &ev) == nil && ev.Event != "" {
				h.events <- ev
			}
		}
		h.cmd.Wait()
	}()
	t.Cleanup(func() {
		h.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-h.exited:
		case <-time.After(gwStopBound):
			syscall.Kill(-h.cmd.Process.Pid, syscall.SIGKILL)
			<-h.exited
		}
		if t.Failed() {
			b, _ := os.ReadFile(h.stderr)
			t.Logf("ortbus lease %v stderr:\n%s", args, b)
		}
	})
	return h
}

// next waits for the holder's next event, which must be want.
func (h *heldProc) next(t *testing.T, want string) bench.MemHolderEvent {
	t.Helper()
	select {
	case ev := <-h.events:
		if ev.Event != want {
			t.Fatalf("the holder said %+v, want %q", ev, want)
		}
		return ev
	case <-h.exited:
		b, _ := os.ReadFile(h.stderr)
		t.Fatalf("the wrapper exited before the holder said %q; its stderr:\n%s", want, b)
	case <-time.After(gwReplyBound):
		t.Fatalf("the holder did not say %q within %v", want, gwReplyBound)
	}
	return bench.MemHolderEvent{}
}

// countUrgentAcquires counts the urgent acquires sent on ortbus.v1.lease (a plain
// subscription sees each request beside the gateway that answers it).
func countUrgentAcquires(t *testing.T, nc *nats.Conn) *atomic.Int64 {
	t.Helper()
	var n atomic.Int64
	subj, err := subjects.API(subjects.OpLease)
	if err != nil {
		t.Fatal(err)
	}
	sub, err := nc.Subscribe(subj, func(m *nats.Msg) {
		var req codec.LeaseRequest
		if codec.Unmarshal(m.Data, &req) == nil && req.Action == codec.LeaseAcquire && req.Class == subjects.ClassUrgent {
			n.Add(1)
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sub.Unsubscribe() })
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	return &n
}

// leaseOf is holder's lease on device in g's status (found false: none).
func leaseOf(t *testing.T, g *gatewayProc, device, holder string) (codec.LeaseReply, bool) {
	t.Helper()
	for _, l := range deviceOf(t, g, device).Leases {
		if l.Holder == holder {
			return l, true
		}
	}
	return codec.LeaseReply{}, false
}

// TestLeaseWaitGrantedOnFree (issue 32, item 2): on cpu, whose declared budget is 512 MiB,
// a reclaimable batch lease of 300 MiB is held by a real process that allocates it and
// frees it on its hook (`ortbus lease --on-pressure 'kill -USR1 $ORTBUS_LEASE_PID' --
// ortbus bench mem-holder`). An urgent `ortbus lease --wait 2m` of 300 MiB does not fit
// beside it: it waits in the gateway, which presses the batch lease; the holder frees its
// memory, the gateway's measure of its resident memory shrinks the lease, and the urgent
// lease is granted — after the holder began to free (its CMD starts after that), from the
// one acquire its wrapper sent (no asking again).
func TestLeaseWaitGrantedOnFree(t *testing.T) {
	t.Parallel()
	g := startGateway(t, gwConfig{
		Root:    t.TempDir(),
		Devices: map[string]config.Device{"cpu": {Capacity: 1 << 30, SafeFraction: 0.5}}, // budget 512 MiB
	}.write(t))
	urgentAcquires := countUrgentAcquires(t, g.NC)
	holder := startHeld(t, g, "300MiB", "--device", "cpu", "--bytes", "300MiB", "--class", "batch", "--holder", "batch-holder",
		"--on-pressure", "kill -USR1 $ORTBUS_LEASE_PID")
	holder.next(t, bench.MemHolderReady)

	urgent := startHeld(t, g, "4KiB", "--device", "cpu", "--bytes", "300MiB", "--class", "urgent", "--holder", "urgent", "--wait", "2m")
	freed := holder.next(t, bench.MemHolderFreed)
	started := urgent.next(t, bench.MemHolderReady) // its CMD runs once the lease is granted

	if started.UnixUS <= freed.StartUnixUS {
		t.Errorf("the urgent lease's CMD started at %d µs, before the holder began to free its memory at %d µs", started.UnixUS, freed.StartUnixUS)
	}
	if n := urgentAcquires.Load(); n != 1 {
		t.Errorf("%d urgent acquires sent, want 1: the waiting wrapper asked again", n)
	}
	// Shrunk to the measure that made room: the holder gives its pages back as munmap
	// goes, and the gateway grants the waiting lease at the first measure under which it
	// fits (on a loaded machine, before the last pages are gone), so the figure is bounded
	// by the room, not by what the holder keeps at the end.
	if l, ok := leaseOf(t, g, "cpu", "batch-holder"); !ok || l.Bytes >= 300<<20 || l.Bytes+300<<20 > 512<<20 || l.Pressed {
		t.Errorf("the batch lease after the free: %+v (found %v), want shrunk to its holder's measured memory, room for the urgent 300 MiB in the 512 MiB budget, pressed no more", l, ok)
	}
	if l, ok := leaseOf(t, g, "cpu", "urgent"); !ok || l.Bytes != 300<<20 {
		t.Errorf("the urgent lease: %+v (found %v), want held, 300 MiB", l, ok)
	}
	if log := g.log(); !strings.Contains(log, "pressed lease shrunk") || !strings.Contains(log, "waiting lease granted") {
		t.Errorf("the gateway's log does not show the shrink and the waiting lease's grant")
	}
}

// TestLeaseWaitGrantedOnFreeGPU: the same on cuda:0, read through a fake nvidia-smi
// first on the gateway's PATH: the holder's hook rewrites what the fake reports for it
// (300 MiB to 10), and the urgent lease waiting behind its lease is granted after that,
// from its one acquire.
func TestLeaseWaitGrantedOnFreeGPU(t *testing.T) {
	t.Parallel()
	smi := newFakeSMI(t)
	g := launchGateway(t, gwConfig{
		Root:    t.TempDir(),
		Devices: map[string]config.Device{"cuda:0": {Capacity: 1 << 30, SafeFraction: 0.5}}, // budget 512 MiB
	}.write(t), true, smi.path())
	urgentAcquires := countUrgentAcquires(t, g.NC)
	marker := filepath.Join(t.TempDir(), "hook-ran")
	hook := fmt.Sprintf(`touch '%s' && printf 'GPU-fake, %%s, 10\n' "$ORTBUS_LEASE_PID" > '%s/apps.tmp' && mv '%s/apps.tmp' '%s/apps'`, marker, smi.dir, smi.dir, smi.dir)
	holder := startHeld(t, g, "4KiB", "--device", "cuda:0", "--bytes", "300MiB", "--class", "batch", "--holder", "batch-holder", "--on-pressure", hook)
	ready := holder.next(t, bench.MemHolderReady)
	smi.set(t, map[int]int{ready.PID: 300})
	smi.read(t)
	if d := deviceOf(t, g, "cuda:0"); d.LeasedBytes != 300<<20 || d.ForeignBytes != 0 {
		t.Fatalf("cuda:0 before the urgent lease: %+v, want the holder's 300 MiB leased, nothing foreign", d)
	}

	urgent := startHeld(t, g, "4KiB", "--device", "cuda:0", "--bytes", "300MiB", "--class", "urgent", "--holder", "urgent", "--wait", "2m")
	started := urgent.next(t, bench.MemHolderReady)
	st, err := os.Stat(marker)
	if err != nil {
		t.Fatalf("the urgent lease granted, the hook never ran: %v", err)
	}
	if hookRan := st.ModTime().UnixMicro(); started.UnixUS <= hookRan {
		t.Errorf("the urgent lease's CMD started at %d µs, before the hook gave the memory back at %d µs", started.UnixUS, hookRan)
	}
	if n := urgentAcquires.Load(); n != 1 {
		t.Errorf("%d urgent acquires sent, want 1: the waiting wrapper asked again", n)
	}
	if l, ok := leaseOf(t, g, "cuda:0", "batch-holder"); !ok || l.Bytes != 10<<20 || l.Pressed {
		t.Errorf("the batch lease after the hook: %+v (found %v), want shrunk to the 10 MiB read, pressed no more", l, ok)
	}
}
