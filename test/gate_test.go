package test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/ortbus/ortbus/codec"
	"github.com/ortbus/ortbus/config"
	"github.com/ortbus/ortbus/internal/gate"
	"github.com/ortbus/ortbus/internal/testkit/testenv"
	"github.com/ortbus/ortbus/models/onnxgen"
	"github.com/ortbus/ortbus/natsd"
	"github.com/ortbus/ortbus/subjects"
)

// gateTenant is `ortbus lease ... -- sh counter.sh` running: a tenant whose progress is a
// counter it rewrites every 20 ms in its own file, and the wrapper's stderr lines, in a
// file: a line is there as soon as the wrapper has written it (it writes "resuming"
// before it resumes), with no reader's lag.
type gateTenant struct {
	cmd    *exec.Cmd
	file   string
	stderr string
	exited chan struct{} // closed when the wrapper has exited; then err is its Wait's
	err    error
}

// counterScript counts in the file "$1" (atomically rewritten), writes its pid to "$1.pid"
// and, on SIGTERM, writes "$1.term" and exits 0 (only a running process can).
const counterScript = `trap 'echo term > "$1.term"; exit 0' TERM
echo $$ > "$1.pid.tmp" && mv "$1.pid.tmp" "$1.pid"
i=0
while :; do i=$((i+1)); echo $i > "$1.tmp"; mv "$1.tmp" "$1"; sleep 0.02; done
`

// startTenant runs the wrapper with args (before "--") around the counter, and waits
// until the counter counts. The test stops it (SIGTERM) when it ends.
func startTenant(t *testing.T, args ...string) *gateTenant {
	t.Helper()
	dir := t.TempDir()
	script := filepath.Join(dir, "counter.sh")
	if err := os.WriteFile(script, []byte(counterScript), 0o644); err != nil {
		t.Fatal(err)
	}
	tn := &gateTenant{file: filepath.Join(dir, "count"), stderr: filepath.Join(dir, "stderr"), exited: make(chan struct{})}
	tn.cmd = exec.Command(testBinary(t, "ortbus"), append(append([]string{"lease"}, args...), "--", "sh", script, tn.file)...)
	tn.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	stderr, err := os.Create(tn.stderr)
	if err != nil {
		t.Fatal(err)
	}
	defer stderr.Close()
	tn.cmd.Stderr = stderr
	if err := tn.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { tn.err = tn.cmd.Wait(); close(tn.exited) }()
	t.Cleanup(func() {
		tn.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-tn.exited:
		case <-time.After(gwStopBound):
			tn.cmd.Process.Kill()
			<-tn.exited
		}
		// The tenant's own processes, were the wrapper gone before them.
		if pid := tn.pid(); pid > 0 {
			syscall.Kill(-pid, syscall.SIGCONT)
			syscall.Kill(pid, syscall.SIGKILL)
		}
		if t.Failed() {
			t.Logf("wrapper stderr:\n%s", strings.Join(tn.snapshot(), "\n"))
		}
	})
	tn.waitCount(t, 2)
	return tn
}

// snapshot is the wrapper's stderr lines so far.
func (tn *gateTenant) snapshot() []string {
	b, _ := os.ReadFile(tn.stderr)
	return strings.Split(strings.TrimSuffix(string(b), "\n"), "\n")
}

// has reports whether the wrapper has printed a line containing s.
func (tn *gateTenant) has(s string) bool {
	for _, l := range tn.snapshot() {
		if strings.Contains(l, s) {
			return true
		}
	}
	return false
}

// waitLine waits for a line of the wrapper containing s.
func (tn *gateTenant) waitLine(t *testing.T, s string) {
	t.Helper()
	checkFor(t, "the wrapper printing "+strconv.Quote(s), gwReplyBound, pollEvery, func() error {
		if tn.has(s) {
			return nil
		}
		return fmt.Errorf("not yet; last lines %q", tail(tn.snapshot(), 3))
	})
}

func tail(l []string, n int) []string { return l[max(0, len(l)-n):] }

// pauses counts the wrapper's "paused #N" and "resuming #N" lines, and gives the last
// resuming line.
func (tn *gateTenant) pauses() (paused, resumed int, last string) {
	for _, l := range tn.snapshot() {
		switch {
		case strings.Contains(l, "gate: paused #"):
			paused++
		case strings.Contains(l, "gate: resuming #"):
			resumed++
			last = l
		}
	}
	return paused, resumed, last
}

// waitRunning waits until the wrapper has resumed every pause it made.
func (tn *gateTenant) waitRunning(t *testing.T) {
	t.Helper()
	checkFor(t, "the tenant resumed", gwReplyBound, pollEvery, func() error {
		if p, r, _ := tn.pauses(); p != r {
			return fmt.Errorf("%d pauses, %d resumed", p, r)
		}
		return nil
	})
}

// count is the tenant's counter now (0 before its first write).
func (tn *gateTenant) count() int {
	b, _ := os.ReadFile(tn.file)
	n, _ := strconv.Atoi(strings.TrimSpace(string(b)))
	return n
}

// pid is the tenant's pid (0 before it wrote it).
func (tn *gateTenant) pid() int {
	b, _ := os.ReadFile(tn.file + ".pid")
	n, _ := strconv.Atoi(strings.TrimSpace(string(b)))
	return n
}

// waitCount waits until the counter is at least n.
func (tn *gateTenant) waitCount(t *testing.T, n int) int {
	t.Helper()
	var c int
	checkFor(t, fmt.Sprintf("the tenant counting to %d", n), gwReplyBound, pollEvery, func() error {
		if c = tn.count(); c >= n {
			return nil
		}
		return fmt.Errorf("at %d", c)
	})
	return c
}

// urgentLoad keeps two urgent requests of the slow tagger in the gateway (one running, one
// queued) until stop is called, which waits for the senders; replies counts the answers.
type urgentLoad struct {
	stop    func()
	replies atomic.Int64
}

func startUrgentLoad(t *testing.T, g *gatewayProc, path string) *urgentLoad {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	u := &urgentLoad{}
	var wg sync.WaitGroup
	for range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			b, _ := codec.Marshal(&codec.Request{Path: path, Model: gwSlow, Class: "urgent", TimeoutMS: 2000})
			for ctx.Err() == nil {
				// Bounded, and cut short by stop: a request to a killed gateway would
				// otherwise hold stop for its whole timeout.
				rctx, rcancel := context.WithTimeout(ctx, 3*time.Second)
				_, err := g.NC.RequestWithContext(rctx, "ortbus.v1.tag", b)
				rcancel()
				if err != nil && ctx.Err() == nil {
					// The gateway is gone (a test kills it): no more load.
					if !g.alive() {
						return
					}
				}
				u.replies.Add(1)
			}
		}()
	}
	var once sync.Once
	u.stop = func() { once.Do(func() { cancel(); wg.Wait() }) }
	t.Cleanup(u.stop)
	return u
}

// gateGateway starts a gateway whose pool u serves urgent work with the slow tagger on
// device cpu (a declared capacity, so that it can be leased), on natsURL ("" embedded).
func gateGateway(t *testing.T, natsURL string) (*gatewayProc, string) {
	t.Helper()
	root := imageRoot(t)
	red := colourPNG(t, root, "red")
	g := startGateway(t, gwConfig{
		NATSURL: natsURL,
		Root:    root,
		Devices: map[string]config.Device{"cpu": {Capacity: 1 << 30, SafeFraction: 0.5}},
		Pools:   []gwPool{{Name: "u", Version: "1.30.0", Workers: 1, Slots: 1, Classes: []string{"urgent"}, Models: []string{gwSlow}}},
		Classes: []gwClass{{Name: "urgent", Chain: []string{"u"}}},
	}.write(t))
	g.waitLive(t, "u", 1)
	return g, red
}

// pauseWays are the ways of pausing this machine allows: signals always; the freezer
// where the test can make a cgroup v2.
func pauseWays(t *testing.T) []string {
	ways := []string{gate.BySignal}
	cmd := exec.Command("true")
	if start, err := gate.Prepare(cmd, gate.ByFreezer); err == nil {
		if p, err := start(); err == nil {
			cmd.Wait()
			p.Close()
			ways = append(ways, gate.ByFreezer)
		}
	}
	if len(ways) == 1 {
		if testenv.InCI() {
			t.Fatal("no cgroup v2 freezer under CI (.ci/run runs scripts/install-freezer.sh first): the freezer path is untested")
		}
		t.Logf("no cgroup v2 freezer here: only the signal path is tested (as root, scripts/install-freezer.sh mounts one)")
	}
	return ways
}

// TestGatedPausedForUrgent: a gated tenant (max-pause and min-share out of the way) is
// paused while urgent work runs on its device — its counter stands still from the
// wrapper's "paused" line to its "resuming" line, and, by signals, its process is
// stopped — and resumed when the work is done: it counts again; status shows the gate
// and its share of the last minute.
func TestGatedPausedForUrgent(t *testing.T) {
	g, red := gateGateway(t, "")
	for _, by := range pauseWays(t) {
		t.Run(by, func(t *testing.T) {
			tn := startTenant(t, "-s", g.Ready.NATSURL, "--device", "cpu", "--bytes", "1MiB", "--class", "batch",
				"--gate", "--max-pause", "60s", "--min-share", "0", "--pause-by", by)
			if !tn.has("CMD paused by " + by) {
				t.Fatalf("the wrapper does not pause by %s: %q", by, tn.snapshot())
			}
			load := startUrgentLoad(t, g, red)
			tn.waitLine(t, "paused #1")
			// Stopped (SIGSTOP: state T; the freezer: its cgroup frozen) from here to its
			// "resuming" line.
			checkFor(t, "the tenant stopped", gwReplyBound, pollEvery, func() error {
				if !gate.Stopped(tn.pid()) && !tn.has("resuming #1") {
					return fmt.Errorf("its state is %q while paused", gate.ProcState(tn.pid()))
				}
				return nil
			})
			c1 := tn.count()
			// Urgent answers come while it is paused: the counter stands still.
			n := load.replies.Load() + 3
			checkFor(t, "three urgent answers more", gwReplyBound, pollEvery, func() error {
				if got := load.replies.Load(); got < n {
					return fmt.Errorf("%d answers", got)
				}
				return nil
			})
			c2 := tn.count()
			if !tn.has("resuming #1") && c2 != c1 {
				t.Errorf("the counter went from %d to %d while the tenant was paused", c1, c2)
			}
			g.waitStatus(t, "the gate in status", func(st *codec.StatusReply) bool {
				return len(st.Gates) == 1 && st.Gates[0].Device == "cpu" && st.Gates[0].Class == "urgent" && st.Gates[0].Tenants == 1 && st.Gates[0].PausedShare1m > 0
			})
			if out, code := ortbusRun(t, t.TempDir(), "status", "-s", g.Ready.NATSURL); code != 0 || !strings.Contains(out, "GATE ON") {
				t.Errorf("ortbus status (exit %d) shows no gate:\n%s", code, out)
			}
			load.stop()
			tn.waitRunning(t)
			tn.waitCount(t, c2+3)
			g.waitStatus(t, "the gate open in status", func(st *codec.StatusReply) bool {
				return len(st.Gates) == 1 && !st.Gates[0].Paused
			})
		})
	}
}

// TestGatedMaxPause: under urgent work that does not stop, a pause ends at max-pause and
// the tenant keeps counting (min-share 0.5): the gate's limits are the tenant's, not the
// urgent work's. (The exact bounds, max-pause and min-share over every second, are the
// state machine's unit tests: internal/gate.)
func TestGatedMaxPause(t *testing.T) {
	g, red := gateGateway(t, "")
	tn := startTenant(t, "-s", g.Ready.NATSURL, "--device", "cpu", "--bytes", "1MiB", "--class", "batch",
		"--gate", "--max-pause", "100ms", "--min-share", "0.5")
	load := startUrgentLoad(t, g, red)
	tn.waitLine(t, "paused #1")
	c1 := tn.count()
	tn.waitLine(t, "(max-pause)")
	tn.waitLine(t, "paused #3")
	// Still under load: the tenant counts on between its pauses.
	tn.waitCount(t, c1+2)
	load.stop()
}

// TestGatedGatewayKilled: a tenant paused (max-pause out of the way) is resumed when its
// gateway is killed with -9 — the bus staying (an external NATS server: the gate's ttl
// expires) or going with it (embedded: the bus is lost) — and stays running.
func TestGatedGatewayKilled(t *testing.T) {
	for _, bus := range []string{"external", "embedded"} {
		t.Run(bus, func(t *testing.T) {
			natsURL := ""
			if bus == "external" {
				opts, err := natsd.ParseArgs([]string{"-p", "-1"})
				if err != nil {
					t.Fatal(err)
				}
				srv, err := natsd.Start(opts)
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(srv.Shutdown)
				natsURL = srv.ClientURL()
			}
			g, red := gateGateway(t, natsURL)
			// A short ttl: the wrapper's release, on a bus gone, gives up after ttl/3.
			tn := startTenant(t, "-s", g.Ready.NATSURL, "--device", "cpu", "--bytes", "1MiB", "--class", "batch", "--ttl", "6s",
				"--gate", "--max-pause", "60s", "--min-share", "0")
			load := startUrgentLoad(t, g, red)
			tn.waitLine(t, "paused #1")
			g.lp.Kill()
			g.lp.Wait(gwStopBound)
			atKill, _, _ := tn.pauses()
			load.stop()
			tn.waitRunning(t)
			if _, _, last := tn.pauses(); bus == "external" && !strings.Contains(last, "(gate expired)") {
				t.Errorf("resumed for another reason than the gate's expiry: %q", last)
			}
			c := tn.count()
			tn.waitCount(t, c+10)
			if p, _, _ := tn.pauses(); p > atKill {
				t.Errorf("paused again with the gateway gone: %q", tn.snapshot())
			}
		})
	}
}

// TestGatedExitResumes: SIGTERM to the wrapper while its tenant is paused reaches a
// running tenant (its trap writes its file and it exits 0), and the wrapper exits with
// its status.
func TestGatedExitResumes(t *testing.T) {
	g, red := gateGateway(t, "")
	for _, by := range pauseWays(t) {
		t.Run(by, func(t *testing.T) {
			tn := startTenant(t, "-s", g.Ready.NATSURL, "--device", "cpu", "--bytes", "1MiB", "--class", "batch",
				"--gate", "--max-pause", "60s", "--min-share", "0", "--pause-by", by)
			load := startUrgentLoad(t, g, red)
			defer load.stop()
			tn.waitLine(t, "paused #1")
			tn.cmd.Process.Signal(syscall.SIGTERM)
			select {
			case <-tn.exited:
			case <-time.After(gwStopBound):
				t.Fatal("the wrapper did not exit after SIGTERM")
			}
			if _, serr := os.Stat(tn.file + ".term"); tn.err != nil || serr != nil {
				t.Fatalf("wrapper exit %v; the tenant's SIGTERM trap ran: %v", tn.err, serr == nil)
			}
			if p, r, _ := tn.pauses(); p != r {
				t.Errorf("%d pauses and %d resumes at the wrapper's exit", p, r)
			}
		})
	}
}

// TestLeaseOnPressure: a batch lease with an on-pressure hook holds most of cuda:0 (a
// fake nvidia-smi measures its holder); an interactive request wakes a lazy pool whose
// declared model does not fit beside it: the gateway presses the lease, the wrapper runs
// the hook (which "unloads": the holder's measured usage falls), the gateway shrinks the
// lease to the measure, and the waiting pool is admitted and answers.
func TestLeaseOnPressure(t *testing.T) {
	root := imageRoot(t)
	red := colourPNG(t, root, "red")
	smi := newFakeSMI(t)
	cfg := admissionConfig(t, root, func(c *config.Config) {
		c.Devices = map[string]config.Device{"cuda:0": {Capacity: 1 << 30, SafeFraction: 0.5}} // budget 512 MiB
		c.Models["declared"] = &config.Model{Kind: config.KindTaggerPixAI, Dir: filepath.Join(testenv.Models(t), onnxgen.TaggerDir), Memory: 100 << 20}
		c.Pools = map[string]*config.Pool{"gpu": {Runtime: testenv.RuntimeLib(t, "1.30.0"), Threads: 1, EP: "cpu", Device: "cuda:0",
			Classes: []string{"interactive"}, Models: []string{"declared"}, LazyLoad: true}}
	})
	g := launchGateway(t, cfg, true, smi.path())
	dir := t.TempDir()
	marker := filepath.Join(dir, "hook-ran")
	hook := fmt.Sprintf(`printf 'GPU-fake, %%s, 50\n' "$ORTBUS_LEASE_PID" > '%s/apps.tmp' && mv '%s/apps.tmp' '%s/apps' && touch '%s'`, smi.dir, smi.dir, smi.dir, marker)
	tn := startTenant(t, "-s", g.Ready.NATSURL, "--device", "cuda:0", "--bytes", "450MiB", "--class", "batch", "--holder", "llm",
		"--on-pressure", hook)
	var pid int
	checkFor(t, "the tenant's pid", gwReplyBound, pollEvery, func() error {
		if pid = tn.pid(); pid == 0 {
			return fmt.Errorf("none yet")
		}
		return nil
	})
	smi.set(t, map[int]int{pid: 450})
	smi.read(t)
	if d := deviceOf(t, g, "cuda:0"); d.LeasedBytes != 450<<20 || d.ForeignBytes != 0 {
		t.Fatalf("cuda:0 before the request: %+v", d)
	}
	// 100 MiB of model beside 450 MiB leased: no room until the lease gives some back.
	r := g.call(t, "tag", &codec.Request{Path: red, Model: "declared", Class: "interactive", TimeoutMS: 60000}, time.Minute)
	if r.Err != nil {
		t.Fatalf("the waiting pool's request: %v", r.Err)
	}
	if _, err := os.Stat(marker); err != nil {
		t.Errorf("the on-pressure hook did not run: %v", err)
	}
	if log := g.log(); !strings.Contains(log, "asking reclaimable leases of lower classes for memory") || !strings.Contains(log, "pressed lease shrunk") {
		t.Errorf("the gateway's log does not show the press and the shrink")
	}
	if !tn.has("running the on-pressure hook") {
		t.Errorf("the wrapper does not say it ran the hook: %q", tn.snapshot())
	}
	d := deviceOf(t, g, "cuda:0")
	if d.LeasedBytes != 50<<20 || len(d.Leases) != 1 || d.Leases[0].Pressed {
		t.Errorf("the lease after the reclaim: %+v, want shrunk to the measured 50 MiB, pressed no more", d)
	}
}

// TestGatedForgedGate: every byte from the bus is hostile. A forger (not the gateway)
// publishing closed gate states with the top seq and the longest ttl on the tenant's gate
// subject, and garbage, pauses the tenant only within its limits — it keeps counting
// while the forgery goes on — and once the forger stops, the tenant runs on.
func TestGatedForgedGate(t *testing.T) {
	g, _ := gateGateway(t, "")
	tn := startTenant(t, "-s", g.Ready.NATSURL, "--device", "cpu", "--bytes", "1MiB", "--class", "batch",
		"--gate", "--max-pause", "100ms", "--min-share", "0.5")
	subj, err := subjects.Gate(g.status(t).Gateway, "cpu")
	if err != nil {
		t.Fatal(err)
	}
	forged, _ := codec.Marshal(&codec.Gate{Gateway: g.status(t).Gateway, Device: "cpu", Seq: ^uint64(0), Closed: true, Class: "urgent", TTLMS: codec.MaxGateTTLMS})
	stop := make(chan struct{})
	forging := make(chan struct{})
	go func() {
		defer close(forging)
		tick := time.NewTicker(20 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tick.C:
				g.NC.Publish(subj, forged)
				g.NC.Publish(subj, []byte("\xc1 not msgpack"))
			}
		}
	}()
	var stopOnce sync.Once
	stopForging := func() { stopOnce.Do(func() { close(stop); <-forging }) }
	t.Cleanup(stopForging)
	tn.waitLine(t, "paused #1")
	c := tn.count()
	tn.waitLine(t, "paused #3")
	tn.waitCount(t, c+3) // it counts on under the forgery
	stopForging()
	tn.waitRunning(t)
	c = tn.count()
	tn.waitCount(t, c+5)
}
