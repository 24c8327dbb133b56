package llmtenant

import (
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// ownMu guards Tenant.own, which Close (any goroutine, more than once) closes.
var ownMu sync.Mutex

// openOwn is a pidfd of the tenant's process when a wrapper started it (pid is not the
// started process's), or -1: a tenant started directly is this process's child, reaped
// by read, and its group is killed by Close.
func openOwn(pid, started int) int {
	if pid == started {
		return -1
	}
	fd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		return -1 // already gone (ESRCH), or no pidfd: Close falls back to the group
	}
	return fd
}

// closeOwn kills the wrapped tenant through its pidfd and waits, until deadline, for
// it to exit (the pidfd turns readable then), and closes the pidfd.
func (t *Tenant) closeOwn(deadline time.Time) {
	ownMu.Lock()
	fd := t.own
	t.own = -1
	ownMu.Unlock()
	if fd < 0 {
		return
	}
	defer unix.Close(fd)
	unix.PidfdSendSignal(fd, unix.SIGKILL, nil, 0)
	for {
		ms := int(time.Until(deadline) / time.Millisecond)
		if ms <= 0 {
			return
		}
		n, err := unix.Poll([]unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}, ms)
		if err == unix.EINTR {
			continue
		}
		if err != nil || n > 0 {
			return
		}
	}
}
