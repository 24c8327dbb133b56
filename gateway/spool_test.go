package gateway

import (
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"syscall"
	"testing"
	"time"

	"github.com/ortbus/ortbus/config"
)

// spoolTree makes a spool directory with old and new files, and the traps around it, and
// returns the time between the two. Files' ages are their change times (lastChange), which
// cannot be set: the "old" files are made first, the cutoff is just after the latest of
// their change times, and the new ones are made once the filesystem's clock has passed it
// (fsClockPast), however coarse that clock is:
//
//	spool/old.png, spool/sub/old.txt, spool/.x.png.tmp-1   old regular files (removed)
//	spool/new.png, spool/sub/new.txt                       new regular files (kept)
//	spool/copied.png                                       new, with an old mtime (kept)
//	spool/fifo                                             an old FIFO (kept)
//	spool/link_out -> ../outside/victim.txt                an old symlink out (kept, and its target)
//	spool/dir_out -> ../outside                            a symlink to a directory (not walked)
//	outside/victim.txt, outside/old.png                    old files outside the spool (kept)
func spoolTree(t *testing.T) (spool, outside string, cutoff time.Time) {
	t.Helper()
	base := t.TempDir()
	spool, outside = filepath.Join(base, "spool"), filepath.Join(base, "outside")
	for _, d := range []string{filepath.Join(spool, "sub"), outside} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	old := time.Now().Add(-2 * time.Hour)
	put := func(names ...string) {
		for _, name := range names {
			p := filepath.Join(base, name)
			if err := os.WriteFile(p, []byte(name), 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
	put("spool/old.png", "spool/sub/old.txt", "spool/.x.png.tmp-1", "outside/victim.txt", "outside/old.png")
	if err := syscall.Mkfifo(filepath.Join(spool, "fifo"), 0o600); err != nil {
		t.Fatal(err)
	}
	for link, target := range map[string]string{"link_out": "../outside/victim.txt", "dir_out": "../outside"} {
		if err := os.Symlink(target, filepath.Join(spool, link)); err != nil {
			t.Fatal(err)
		}
	}
	for _, name := range []string{"spool/old.png", "spool/sub/old.txt", "spool/.x.png.tmp-1"} {
		if c := changed(t, filepath.Join(base, name)); !c.Before(cutoff) {
			cutoff = c.Add(time.Nanosecond)
		}
	}
	fsClockPast(t, base, cutoff)
	put("spool/new.png", "spool/sub/new.txt", "spool/copied.png")
	if err := os.Chtimes(filepath.Join(spool, "copied.png"), old, old); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"spool/new.png", "spool/sub/new.txt", "spool/copied.png"} {
		if c := changed(t, filepath.Join(base, name)); c.Before(cutoff) {
			t.Fatalf("%s changed at %v, before the cutoff %v it was made after", name, c, cutoff)
		}
	}
	return spool, outside, cutoff
}

// changed is when the file at p last changed, as the sweep sees it.
func changed(t *testing.T, p string) time.Time {
	t.Helper()
	fi, err := os.Lstat(p)
	if err != nil {
		t.Fatal(err)
	}
	return lastChange(fi)
}

// fsClockPast waits until a file made in dir now changes at or after at: the clock that
// stamps files is coarser than time.Now (a few milliseconds), so a file made right after
// another may carry the same change time.
func fsClockPast(t *testing.T, dir string, at time.Time) {
	t.Helper()
	probe := filepath.Join(dir, ".clock")
	deadline := time.Now().Add(5 * time.Second)
	for {
		if err := os.WriteFile(probe, nil, 0o644); err != nil {
			t.Fatal(err)
		}
		c := changed(t, probe)
		if err := os.Remove(probe); err != nil {
			t.Fatal(err)
		}
		if !c.Before(at) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("a file made now changes at %v, still before %v", c, at)
		}
		time.Sleep(time.Millisecond)
	}
}

// names lists every path under dir, relative to it, without following links.
func names(t *testing.T, dir string) []string {
	t.Helper()
	var out []string
	err := filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if p != dir {
			rel, _ := filepath.Rel(dir, p)
			out = append(out, rel)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(out)
	return out
}

func TestSweepSpool(t *testing.T) {
	spool, outside, cutoff := spoolTree(t)
	n, err := sweepSpool(spool, cutoff)
	if err != nil {
		t.Fatal(err)
	}
	if n != 3 {
		t.Errorf("removed %d files, want 3", n)
	}
	want := []string{"copied.png", "dir_out", "fifo", "link_out", "new.png", "sub", "sub/new.txt"}
	if got := names(t, spool); !slices.Equal(got, want) {
		t.Errorf("spool after the sweep: %v, want %v", got, want)
	}
	if got := names(t, outside); !slices.Equal(got, []string{"old.png", "victim.txt"}) {
		t.Errorf("the sweep touched files outside the spool: %v left", got)
	}
	// Nothing more to do the second time.
	if n, err := sweepSpool(spool, cutoff); n != 0 || err != nil {
		t.Errorf("second sweep: %d, %v", n, err)
	}
	if _, err := sweepSpool(filepath.Join(spool, "missing"), time.Now()); err == nil {
		t.Error("sweeping a missing directory reported no error")
	}
}

func TestSpoolSweeperStartStop(t *testing.T) {
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))
	for _, tt := range []struct {
		name    string
		age     time.Duration
		spool   bool
		removed bool
	}{
		{"max age 1ms", time.Millisecond, true, true},
		{"max age 0: never", 0, true, false},
		{"no spool dir", time.Millisecond, false, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			spool := t.TempDir()
			oldFile, newFile := filepath.Join(spool, "old.png"), filepath.Join(spool, "new.png")
			if err := os.WriteFile(oldFile, nil, 0o644); err != nil {
				t.Fatal(err)
			}
			// old.png is past a max age of 1 ms once its change time is more than 1 ms ago.
			for deadline := time.Now().Add(5 * time.Second); !changed(t, oldFile).Before(time.Now().Add(-time.Millisecond)); time.Sleep(time.Millisecond) {
				if time.Now().After(deadline) {
					t.Fatalf("old.png changed at %v, not yet 1 ms ago", changed(t, oldFile))
				}
			}
			// new.png changes an hour from now (its modification time), so no sweep of this
			// test takes it for an old file.
			if err := os.WriteFile(newFile, nil, 0o644); err != nil {
				t.Fatal(err)
			}
			later := time.Now().Add(time.Hour)
			if err := os.Chtimes(newFile, later, later); err != nil {
				t.Fatal(err)
			}
			g := gatewayWith(&config.Config{}, &Gateway{log: logger})
			g.conf().Security.SpoolMaxAge = config.Duration(tt.age)
			if tt.spool {
				g.conf().Security.SpoolDir = spool
			}
			stop := startSpoolSweeper(g.conf().Security, g.log)
			done := make(chan struct{})
			go func() { stop(); close(done) }()
			select {
			case <-done:
			case <-time.After(5 * time.Second):
				t.Fatal("stopping the sweeper hung")
			}
			// The first sweep runs at start, before the sweeper looks at its stop.
			_, err := os.Lstat(oldFile)
			if removed := os.IsNotExist(err); removed != tt.removed {
				t.Errorf("old.png removed = %v, want %v", removed, tt.removed)
			}
			if _, err := os.Lstat(newFile); err != nil {
				t.Errorf("new.png: %v", err)
			}
		})
	}
}

func TestSweepInterval(t *testing.T) {
	for age, want := range map[time.Duration]time.Duration{
		time.Hour: 10 * time.Minute, 20 * time.Minute: 5 * time.Minute, 2 * time.Second: time.Second, 24 * time.Hour: 10 * time.Minute,
	} {
		if got := sweepInterval(age); got != want {
			t.Errorf("sweepInterval(%v) = %v, want %v", age, got, want)
		}
	}
}
