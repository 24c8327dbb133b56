package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"syscall"
	"time"

	"github.com/ortbus/ortbus/codec"
	"github.com/ortbus/ortbus/config"
)

const leaseUsage = `usage: ortbus lease [-s URL] --device D --bytes SIZE [--class interactive] [--ttl 30s]
                    [--holder NAME] [--wait] [-inbox-prefix P] -- CMD ARGS...
  Holds SIZE (e.g. 6GiB) of device D's memory budget for CMD, a process ortbus does not
  run (an LLM server, a game): acquires a lease, runs CMD, renews the lease while CMD
  lives, releases it when CMD exits, and exits with CMD's status. Refused (the budget
  cannot hold it), it exits 1 without starting CMD, or with --wait tries again until it
  is granted. While an urgent or interactive lease is held, batch work on the device is
  held to one unit.
`

// leaseCmd is `ortbus lease ... -- CMD ARGS...`.
func leaseCmd(args []string) int {
	fs := flag.NewFlagSet("lease", flag.ContinueOnError)
	fs.Usage = func() { fmt.Fprint(os.Stderr, leaseUsage) }
	url := natsURL(fs)
	prefix := inboxPrefix(fs)
	device := fs.String("device", "", "the device whose memory is leased (as the config names it: cpu, cuda:0, ...)")
	size := fs.String("bytes", "", "how much: bytes, or with a unit (512MiB, 6GiB)")
	class := fs.String("class", "interactive", "the lease's class: urgent and interactive leases hold batch work to one unit")
	ttl := fs.Duration("ttl", 30*time.Second, "the lease's ttl; it is renewed every third of it while CMD runs")
	holder := fs.String("holder", "", "a name for status (default: CMD's name)")
	wait := fs.Bool("wait", false, "when refused, try again every ttl/3 until granted")
	if fs.Parse(args) != nil || fs.NArg() == 0 || *device == "" || *size == "" {
		fmt.Fprint(os.Stderr, leaseUsage)
		return 2
	}
	bytes, err := config.ParseBytes(*size)
	if err != nil || bytes <= 0 {
		fmt.Fprintf(os.Stderr, "ortbus lease: --bytes %q: want a size such as 512MiB\n", *size)
		return 2
	}
	cmdArgs := fs.Args()
	if *holder == "" {
		*holder = cmdArgs[0]
	}
	c, err := (jobFlags{url: url, prefix: prefix}).connect(true)
	if err != nil {
		fmt.Fprintf(os.Stderr, "ortbus lease: %v\n", err)
		return 1
	}
	defer c.Close()
	call := func(f func(ctx context.Context) (*codec.LeaseReply, error)) (*codec.LeaseReply, error) {
		ctx, cancel := context.WithTimeout(context.Background(), max(*ttl/3, 2*time.Second))
		defer cancel()
		return f(ctx)
	}
	ttlMS := ttl.Milliseconds()
	acquire := func(ctx context.Context) (*codec.LeaseReply, error) {
		return c.AcquireLease(ctx, *device, int64(bytes), *class, *holder, ttlMS)
	}
	// Signals reach CMD (it shares the terminal's process group); the wrapper waits for
	// it to exit and releases the lease then.
	signal.Ignore(syscall.SIGINT, syscall.SIGQUIT)
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGHUP)
	defer signal.Stop(sigs)
	var lease *codec.LeaseReply
	for {
		lease, err = call(acquire)
		if err == nil {
			break
		}
		if !*wait || codec.CodeOf(err) != codec.CodeOverloaded {
			fmt.Fprintf(os.Stderr, "ortbus lease: refused: %v\n", err)
			return 1
		}
		select {
		case <-sigs:
			return 1
		case <-time.After(max(*ttl/3, 100*time.Millisecond)):
		}
	}
	release := func() {
		if _, err := call(func(ctx context.Context) (*codec.LeaseReply, error) { return c.ReleaseLease(ctx, lease.Lease) }); err != nil {
			fmt.Fprintf(os.Stderr, "ortbus lease: release: %v (it expires within %v)\n", err, *ttl)
		}
	}
	defer release()

	cmd := exec.Command(cmdArgs[0], cmdArgs[1:]...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	if err := cmd.Start(); err != nil {
		fmt.Fprintf(os.Stderr, "ortbus lease: %v\n", err)
		return 127
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	renew := time.NewTicker(max(*ttl/3, 100*time.Millisecond))
	defer renew.Stop()
	for {
		select {
		case err := <-exited:
			var ee *exec.ExitError
			switch {
			case err == nil:
				return 0
			case errors.As(err, &ee):
				if st, ok := ee.Sys().(syscall.WaitStatus); ok && st.Signaled() {
					return 128 + int(st.Signal())
				}
				return ee.ExitCode()
			default:
				fmt.Fprintf(os.Stderr, "ortbus lease: %v\n", err)
				return 1
			}
		case s := <-sigs:
			cmd.Process.Signal(s)
		case <-renew.C:
			if _, err := call(func(ctx context.Context) (*codec.LeaseReply, error) { return c.RenewLease(ctx, lease.Lease, ttlMS) }); err != nil {
				// Not fatal for CMD: the gateway may be restarting; the lease may lapse.
				fmt.Fprintf(os.Stderr, "ortbus lease: renew: %v\n", err)
			}
		}
	}
}
