package gateway

import (
	"context"
	"errors"
	"io/fs"
	"log/slog"
	"os"
	"syscall"
	"time"

	"github.com/ortbus/ortbus/config"
)

// The spool directory (security.spool_dir) is where clients write images to send and where
// workers write outputs without an out_path. Nothing there is kept: the gateway removes
// what is older than security.spool_max_age, so that the spool cannot fill the disk.

// startSpoolSweeper starts the goroutine that sweeps the spool directory (at once, then
// every sweepInterval) and returns the function that stops it and waits for it. With no
// spool directory, or spool_max_age 0, it starts nothing.
func startSpoolSweeper(sec config.Security, log *slog.Logger) (stop func()) {
	dir, age := sec.SpoolDir, sec.SpoolMaxAge.D()
	if dir == "" || age <= 0 {
		return func() {}
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		runSweeper(ctx, dir, age, sweepInterval(age), log)
	}()
	return func() {
		cancel()
		<-done
	}
}

// sweepInterval is how often a spool whose files live maxAge is swept: a quarter of it,
// between 1 s and 10 min.
func sweepInterval(maxAge time.Duration) time.Duration {
	return min(max(maxAge/4, time.Second), 10*time.Minute)
}

// runSweeper sweeps dir every interval until ctx is done, removing files older than
// maxAge. A failure is logged when it differs from the previous sweep's.
func runSweeper(ctx context.Context, dir string, maxAge, interval time.Duration, log *slog.Logger) {
	t := time.NewTicker(interval)
	defer t.Stop()
	last := ""
	for {
		n, err := sweepSpool(dir, time.Now().Add(-maxAge))
		if n > 0 {
			log.Info("spool swept", "dir", dir, "removed", n, "max_age", maxAge)
		}
		if msg := errString(err); msg != last {
			if err != nil {
				log.Warn("spool sweep", "dir", dir, "err", err)
			}
			last = msg
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

// sweepSpool removes the regular files under dir, at any depth, last changed (lastChange)
// before cutoff, and returns how many it removed. Everything goes through an os.Root at dir:
// symbolic links are neither followed nor removed, directories are kept, and a
// directory swapped for a link during the sweep cannot lead a removal out of dir.
func sweepSpool(dir string, cutoff time.Time) (int, error) {
	r, err := os.OpenRoot(dir)
	if err != nil {
		return 0, err
	}
	defer r.Close()
	removed := 0
	var errs []error
	walkErr := fs.WalkDir(r.FS(), ".", func(name string, d fs.DirEntry, err error) error {
		if err != nil {
			// An unreadable directory is skipped; the rest is still swept.
			errs = append(errs, err)
			return nil
		}
		if !d.Type().IsRegular() {
			return nil // a directory is walked into; a symlink or anything else is left alone
		}
		fi, err := d.Info()
		if err != nil {
			if !errors.Is(err, fs.ErrNotExist) {
				errs = append(errs, err)
			}
			return nil
		}
		if !lastChange(fi).Before(cutoff) {
			return nil
		}
		if err := r.Remove(name); err != nil {
			if !errors.Is(err, fs.ErrNotExist) {
				errs = append(errs, err)
			}
			return nil
		}
		removed++
		return nil
	})
	if walkErr != nil {
		errs = append(errs, walkErr)
	}
	return removed, errors.Join(errs...)
}

// lastChange is when a file last changed: the later of its modification time and its
// inode change time. The change time is set when the file is created, renamed or linked,
// so a file copied into the spool with an old modification time kept (cp -p, rsync -t)
// is not taken for an old one.
func lastChange(fi fs.FileInfo) time.Time {
	t := fi.ModTime()
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		if c := time.Unix(st.Ctim.Unix()); c.After(t) {
			t = c
		}
	}
	return t
}
