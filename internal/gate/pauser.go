package gate

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/prometheus/procfs"
)

// The ways of pausing a gated process.
const (
	ByAuto    = "auto"    // the freezer where the wrapper can make a cgroup, else signals
	ByFreezer = "freezer" // the cgroup v2 freezer: CMD and every descendant, atomically
	BySignal  = "signal"  // SIGSTOP / SIGCONT of CMD's process group
)

// Pauser pauses and resumes a started process (and its descendants).
type Pauser interface {
	// Kind is ByFreezer or BySignal.
	Kind() string
	// Pause stops the process, and returns once it is stopped (or after a bound).
	Pause() error
	// Resume lets it run again.
	Resume() error
	// Close resumes it for good and removes what Prepare made (CMD has exited, or the
	// wrapper is going).
	Close() error
}

// Prepare sets cmd up to be paused by way of by (ByAuto, ByFreezer or BySignal) before
// it is started; start runs cmd.Start and returns the pauser. With ByAuto, a freezer
// that cannot be set up, or a start into the cgroup that fails, falls back to signals.
func Prepare(cmd *exec.Cmd, by string) (start func() (Pauser, error), err error) {
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	signals := func() (Pauser, error) {
		cmd.SysProcAttr.UseCgroupFD, cmd.SysProcAttr.CgroupFD = false, 0
		cmd.SysProcAttr.Setpgid, cmd.SysProcAttr.Pgid = true, 0
		if err := cmd.Start(); err != nil {
			return nil, err
		}
		return &signalPauser{pid: cmd.Process.Pid}, nil
	}
	switch by {
	case BySignal:
		return signals, nil
	case ByFreezer, ByAuto, "":
	default:
		return nil, fmt.Errorf("pause by %q: want auto, freezer or signal", by)
	}
	f, ferr := newFreezer()
	if ferr != nil {
		if by == ByFreezer {
			return nil, ferr
		}
		return signals, nil
	}
	return func() (Pauser, error) {
		cmd.SysProcAttr.UseCgroupFD, cmd.SysProcAttr.CgroupFD = true, f.fd
		err := cmd.Start()
		if err == nil {
			return f, nil
		}
		f.Close()
		if by == ByFreezer {
			return nil, fmt.Errorf("start into the cgroup %s: %w", f.dir, err)
		}
		// Start failed before the child ran (exec.Cmd may not be started twice: a copy).
		c2 := exec.Command(cmd.Path, cmd.Args[1:]...)
		c2.Env, c2.Dir, c2.Stdin, c2.Stdout, c2.Stderr = cmd.Env, cmd.Dir, cmd.Stdin, cmd.Stdout, cmd.Stderr
		*cmd = *c2
		cmd.SysProcAttr = &syscall.SysProcAttr{}
		return signals()
	}, nil
}

// pauseWait bounds, in milliseconds, how long Pause waits to see the process stopped (a
// process in the kernel, e.g. in a GPU driver call, stops when it returns): past it,
// Pause returns all the same, so a slow stop never holds up a resume.
const pauseWait = 100

// signalPauser stops and continues a process group (Setpgid: the group is CMD's pid).
type signalPauser struct{ pid int }

func (p *signalPauser) Kind() string { return BySignal }

func (p *signalPauser) Pause() error {
	if err := syscall.Kill(-p.pid, syscall.SIGSTOP); err != nil {
		return err
	}
	// SIGSTOP is delivered asynchronously: wait (bounded) until the leader is stopped,
	// so that "paused" means paused.
	for i := 0; i < pauseWait && procState(p.pid) != 'T' && procState(p.pid) != 0; i++ {
		time.Sleep(time.Millisecond)
	}
	return nil
}

func (p *signalPauser) Resume() error { return ignoreGone(syscall.Kill(-p.pid, syscall.SIGCONT)) }

func (p *signalPauser) Close() error { return p.Resume() }

// procState is the state letter of pid in /proc/pid/stat (0 when gone or unreadable).
func procState(pid int) byte {
	proc, err := procfs.NewProc(pid)
	if err != nil {
		return 0
	}
	st, err := proc.Stat()
	if err != nil || st.State == "" {
		return 0
	}
	return st.State[0]
}

// ProcState is procState, for tests: 'T' stopped, 'S' sleeping, 'R' running, ...
func ProcState(pid int) byte { return procState(pid) }

// Stopped reports whether pid is paused by either way: stopped by a signal, or in a
// frozen cgroup v2 (for tests).
func Stopped(pid int) bool {
	if procState(pid) == 'T' {
		return true
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid))
	if err != nil {
		return false
	}
	mnt, err := cgroup2Mount()
	if err != nil {
		return false
	}
	for l := range strings.SplitSeq(string(b), "\n") {
		if p, ok := strings.CutPrefix(l, "0::"); ok {
			return Frozen(filepath.Join(mnt, p))
		}
	}
	return false
}

func ignoreGone(err error) error {
	if errors.Is(err, syscall.ESRCH) {
		return nil
	}
	return err
}

// freezer is a cgroup v2 of CMD's own, under the wrapper's cgroup, frozen and thawed
// through cgroup.freeze.
type freezer struct {
	dir string
	fd  int
}

// newFreezer makes the cgroup: <cgroup2 mount><the wrapper's cgroup>/ortbus-lease-<pid>.
func newFreezer() (*freezer, error) {
	mnt, err := cgroup2Mount()
	if err != nil {
		return nil, err
	}
	own, err := ownCgroup()
	if err != nil {
		return nil, err
	}
	dir := filepath.Join(mnt, own, fmt.Sprintf("ortbus-lease-%d", os.Getpid()))
	if err := os.Mkdir(dir, 0o755); err != nil {
		return nil, fmt.Errorf("cgroup for the freezer: %w", err)
	}
	if _, err := os.Stat(filepath.Join(dir, "cgroup.freeze")); err != nil {
		os.Remove(dir)
		return nil, fmt.Errorf("cgroup %s has no freezer: %w", dir, err)
	}
	fd, err := syscall.Open(dir, syscall.O_RDONLY|syscall.O_DIRECTORY|syscall.O_CLOEXEC, 0)
	if err != nil {
		os.Remove(dir)
		return nil, err
	}
	return &freezer{dir: dir, fd: fd}, nil
}

// Dir is the freezer's cgroup directory (for tests).
func Dir(p Pauser) string {
	if f, ok := p.(*freezer); ok {
		return f.dir
	}
	return ""
}

func (f *freezer) Kind() string { return ByFreezer }

func (f *freezer) write(v string) error {
	return os.WriteFile(filepath.Join(f.dir, "cgroup.freeze"), []byte(v), 0)
}

// Frozen reports whether the cgroup at dir is frozen (cgroup.events: frozen 1).
func Frozen(dir string) bool {
	b, err := os.ReadFile(filepath.Join(dir, "cgroup.events"))
	return err == nil && bytes.Contains(b, []byte("frozen 1"))
}

func (f *freezer) Pause() error {
	if err := f.write("1"); err != nil {
		return err
	}
	// Freezing completes asynchronously: wait (bounded) for cgroup.events to say so.
	for i := 0; i < pauseWait && !Frozen(f.dir); i++ {
		time.Sleep(time.Millisecond)
	}
	return nil
}

func (f *freezer) Resume() error { return f.write("0") }

// Close thaws the cgroup and removes it; a descendant of CMD still in it (CMD gone)
// keeps it, thawed.
func (f *freezer) Close() error {
	err := f.write("0")
	if f.fd > 0 {
		syscall.Close(f.fd)
		f.fd = -1
	}
	if rerr := os.Remove(f.dir); rerr != nil && err == nil && !errors.Is(rerr, os.ErrNotExist) {
		err = fmt.Errorf("cgroup %s left (thawed): %w", f.dir, rerr)
	}
	return err
}

// cgroup2Mount is where the cgroup v2 hierarchy is mounted (/sys/fs/cgroup on a unified
// system, /sys/fs/cgroup/unified on a hybrid one).
func cgroup2Mount() (string, error) {
	fh, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return "", err
	}
	defer fh.Close()
	sc := bufio.NewScanner(fh)
	for sc.Scan() {
		// id parent major:minor root mountpoint options ... - fstype source superoptions
		f := strings.Fields(sc.Text())
		for i, x := range f {
			if x == "-" && i+1 < len(f) && f[i+1] == "cgroup2" && len(f) > 4 {
				return f[4], nil
			}
		}
	}
	return "", errors.New("no cgroup2 hierarchy is mounted")
}

// ownCgroup is the wrapper's own cgroup v2 path ("0::/path" in /proc/self/cgroup).
func ownCgroup() (string, error) {
	b, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		return "", err
	}
	for l := range strings.SplitSeq(string(b), "\n") {
		if p, ok := strings.CutPrefix(l, "0::"); ok {
			return p, nil
		}
	}
	return "", errors.New("no cgroup v2 entry in /proc/self/cgroup")
}
