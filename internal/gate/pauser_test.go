package gate

import (
	"os/exec"
	"testing"

	"github.com/ortbus/ortbus/internal/testkit/testenv"
)

// TestPausers: each way of pausing stops a started process and lets it run again; the
// freezer only where this machine lets the test make a cgroup v2.
func TestPausers(t *testing.T) {
	for _, by := range []string{BySignal, ByFreezer} {
		t.Run(by, func(t *testing.T) {
			cmd := exec.Command("sleep", "60")
			start, err := Prepare(cmd, by)
			if err != nil {
				if by == ByFreezer {
					testenv.Unavailable(t, "no cgroup v2 freezer here ("+err.Error()+"): as root, scripts/install-freezer.sh mounts one")
				}
				t.Fatal(err)
			}
			p, err := start()
			if err != nil {
				if by == ByFreezer {
					testenv.Unavailable(t, "cannot start into a cgroup here ("+err.Error()+"): as root, scripts/install-freezer.sh mounts one")
				}
				t.Fatal(err)
			}
			t.Cleanup(func() {
				cmd.Process.Kill()
				cmd.Wait()
				if err := p.Close(); err != nil {
					t.Error(err)
				}
			})
			if p.Kind() != by {
				t.Fatalf("kind %s, want %s", p.Kind(), by)
			}
			stopped := func() bool {
				if by == ByFreezer {
					return Frozen(Dir(p))
				}
				return ProcState(cmd.Process.Pid) == 'T'
			}
			if err := p.Pause(); err != nil || !stopped() || !Stopped(cmd.Process.Pid) {
				t.Fatalf("pause: %v, stopped %v", err, stopped())
			}
			if err := p.Resume(); err != nil {
				t.Fatal(err)
			}
			if by == ByFreezer && Frozen(Dir(p)) {
				t.Fatal("still frozen after resume")
			}
			if err := p.Pause(); err != nil || !stopped() {
				t.Fatalf("pause again: %v", err)
			}
			if err := p.Resume(); err != nil {
				t.Fatal(err)
			}
		})
	}
}
