package main

// `ortbus job ...`: the job API (docs/PROTOCOL.md, Jobs) from the command line. What it
// prints on stdout is JSON, one value a line (but watch's progress bar on a terminal);
// errors go to stderr with exit status 1, bad usage 2.

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/ortbus/ortbus/cli"
	"github.com/ortbus/ortbus/client"
	"github.com/ortbus/ortbus/codec"
	"github.com/ortbus/ortbus/config"
	"github.com/ortbus/ortbus/jobs"
)

const jobUsage = `usage:
  ortbus job submit [-s URL] [--op tag] [--class batch] [--model M] [--pool P] [--job ID] [--recursive] [--incremental] [--anytime] PATH|DIR...
  ortbus job status [-s URL] ID
  ortbus job watch [-s URL] [-interval 1s] [-timeout D] ID
  ortbus job wait [-s URL] [-interval 1s] [-timeout D] ID   exit 0: every item done; 3: done, some items failed; 1: cancelled, failed or an error
  ortbus job results [-s URL] ID
  ortbus job cancel [-s URL] ID
  ortbus job pause [-s URL] ID       its running items finish, no other starts, until resume
  ortbus job resume [-s URL] ID
  ortbus job list [-s URL]
  (each: -inbox-prefix P for a server with per-user inboxes)
`

func jobCmd(args []string) int {
	if len(args) == 0 {
		fmt.Fprint(os.Stderr, jobUsage)
		return 2
	}
	switch args[0] {
	case "submit":
		return jobSubmitCmd(args[1:])
	case "status", "cancel", "pause", "resume":
		return jobRefCmd(args[0], args[1:])
	case "watch":
		return jobWatchCmd(args[1:])
	case "wait":
		return jobWaitCmd(args[1:])
	case "results":
		return jobResultsCmd(args[1:])
	case "list":
		return jobListCmd(args[1:])
	}
	fmt.Fprintf(os.Stderr, "ortbus: unknown job command %q\n%s", args[0], jobUsage)
	return 2
}

// jobFlags are the flags every job command takes.
type jobFlags struct {
	fs     *flag.FlagSet
	url    *string
	prefix *string
}

func newJobFlags(name string) jobFlags {
	fs := flag.NewFlagSet("job "+name, flag.ContinueOnError)
	return jobFlags{fs: fs, url: natsURL(fs), prefix: inboxPrefix(fs)}
}

// parse parses args, flags after the positional arguments too (parseInterspersed), and
// checks that nargs positional arguments remain (-1: at least one).
func (f jobFlags) parse(args []string, nargs int) bool {
	if parseInterspersed(f.fs, args) != nil || nargs >= 0 && f.fs.NArg() != nargs || nargs < 0 && f.fs.NArg() == 0 {
		fmt.Fprint(os.Stderr, jobUsage)
		return false
	}
	return true
}

// connect connects to NATS. A lasting connection (watch, wait) outlives the server:
// it keeps reconnecting, also when the first try fails, so that a gateway restarted at
// the same URL is found again.
func (f jobFlags) connect(lasting bool) (*client.Client, error) {
	opts := connOpts(*f.prefix)
	if lasting {
		opts = append(opts, nats.MaxReconnects(-1), nats.RetryOnFailedConnect(true), nats.ReconnectWait(250*time.Millisecond))
	}
	return client.Connect(*f.url, opts...)
}

// jobFail reports err on stderr and returns the exit status 1.
func jobFail(cmd string, err error) int {
	fmt.Fprintf(os.Stderr, "ortbus job %s: %v\n", cmd, err)
	return 1
}

// printJSON writes v as one JSON line on stdout.
func printJSON(v any) {
	b, err := json.Marshal(v)
	if err != nil {
		b, _ = json.Marshal(map[string]string{"error": err.Error()})
	}
	os.Stdout.Write(append(b, '\n'))
}

func jobSubmitCmd(args []string) int {
	f := newJobFlags("submit")
	op := f.fs.String("op", "tag", "the op run on every item: tag, embed, detect or segment")
	class := f.fs.String("class", "batch", "the class the items are queued in")
	model := f.fs.String("model", "", "the model (default: the op's default)")
	pool := f.fs.String("pool", "", "the pool (default: the class's chain)")
	id := f.fs.String("job", "", "the job's id (default: one the gateway picks); the same submit again adds nothing")
	recursive := f.fs.Bool("recursive", false, "take the images of directories' subdirectories too")
	incremental := f.fs.Bool("incremental", false, "answer items whose result the gateway's cache holds from it, run the rest")
	anytime := f.fs.Bool("anytime", false, "run outside the quiet hours of [jobs] windows too")
	timeout := f.fs.Duration("timeout", time.Minute, "how long to wait for the gateway's reply")
	if !f.parse(args, -1) {
		return 2
	}
	items, dirs, skipped, err := jobItems(f.fs.Args(), *recursive)
	if err != nil {
		return jobFail("submit", err)
	}
	if len(items) == 0 {
		return jobFail("submit", fmt.Errorf("no images in %v; left out: %s", f.fs.Args(), skipLine(skipped)))
	}
	c, err := f.connect(false)
	if err != nil {
		return jobFail("submit", err)
	}
	defer c.Close()
	req := &codec.JobSubmit{Job: *id, Op: *op, Model: *model, Class: *class, Pool: *pool, Items: items, Incremental: *incremental, Anytime: *anytime,
		Skipped: skipped.Skipped, SkippedTotal: skipped.SkippedTotal}
	if b, err := codec.Marshal(req); err == nil && int64(len(b)) > c.Conn().MaxPayload()-4096 {
		// Too many paths for one message: one directory alone is walked by the gateway
		// instead (the same walk, jobs.Expand, up to jobs.max_items).
		if len(dirs) != 1 || len(f.fs.Args()) != 1 {
			return jobFail("submit", fmt.Errorf("%d paths (%d bytes) are over the server's max_payload (%d bytes): submit one directory alone, or fewer paths per job",
				len(items), len(b), c.Conn().MaxPayload()))
		}
		req.Items, req.Dir, req.Skipped, req.SkippedTotal = nil, &dirs[0], nil, 0 // the gateway's walk lists them
	}
	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()
	rep, err := c.SubmitJob(ctx, req)
	if err != nil {
		return jobFail("submit", err)
	}
	printJSON(rep)
	return 0
}

// jobItems lists the items of the arguments: a file is an item, a directory's images
// (jobs.Expand: by content) are items. Paths are made absolute, as the gateway wants
// them. dirs are the directory arguments; skipped what their walks left out, and why.
func jobItems(args []string, recursive bool) (items []string, dirs []codec.JobDir, skipped jobs.Listing, err error) {
	for _, a := range args {
		p, err := filepath.Abs(a)
		if err != nil {
			return nil, nil, skipped, err
		}
		fi, err := os.Stat(p)
		if err != nil {
			return nil, nil, skipped, err
		}
		if !fi.IsDir() {
			items = append(items, p)
			continue
		}
		d := codec.JobDir{Path: p, Recursive: recursive}
		l, e := jobs.Expand(d, config.DefaultJobMaxItems-len(items))
		if e != nil {
			return nil, nil, skipped, e
		}
		items = append(items, l.Items...)
		dirs = append(dirs, d)
		skipped.SkippedTotal += l.SkippedTotal
		skipped.Skipped = append(skipped.Skipped, l.Skipped[:min(len(l.Skipped), codec.MaxJobSkipsListed-len(skipped.Skipped))]...)
	}
	if len(items) > config.DefaultJobMaxItems {
		return nil, nil, skipped, fmt.Errorf("%d items, over %d", len(items), config.DefaultJobMaxItems)
	}
	return items, dirs, skipped, nil
}

// skipLine is what a walk left out, in a line: each path and its reason, then how many
// more.
func skipLine(l jobs.Listing) string {
	if l.SkippedTotal == 0 {
		return "nothing"
	}
	var parts []string
	for _, s := range l.Skipped[:min(len(l.Skipped), 10)] {
		parts = append(parts, s.Path+" ("+s.Reason+")")
	}
	if more := l.SkippedTotal - len(parts); more > 0 {
		parts = append(parts, fmt.Sprintf("and %d more", more))
	}
	return strings.Join(parts, ", ")
}

// jobRefCmd is status, cancel, pause and resume: one request naming the job, its status
// printed.
func jobRefCmd(verb string, args []string) int {
	f := newJobFlags(verb)
	timeout := f.fs.Duration("timeout", 30*time.Second, "how long to wait for the gateway's reply")
	if !f.parse(args, 1) {
		return 2
	}
	c, err := f.connect(false)
	if err != nil {
		return jobFail(verb, err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()
	call := map[string]func(context.Context, string) (*codec.JobStatus, error){
		"status": c.JobStatus, "cancel": c.CancelJob, "pause": c.PauseJob, "resume": c.ResumeJob}[verb]
	st, err := call(ctx, f.fs.Arg(0))
	if err != nil {
		return jobFail(verb, err)
	}
	printJSON(st)
	return 0
}

func jobListCmd(args []string) int {
	f := newJobFlags("list")
	timeout := f.fs.Duration("timeout", 30*time.Second, "how long to wait for the gateway's reply")
	if !f.parse(args, 0) {
		return 2
	}
	c, err := f.connect(false)
	if err != nil {
		return jobFail("list", err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()
	l, err := c.ListJobs(ctx)
	if err != nil {
		return jobFail("list", err)
	}
	printJSON(l)
	return 0
}

// jobResultLine is one line of `job results`: the item's path and its result or error,
// and "cached": true when the result came from the result cache.
type jobResultLine struct {
	Path   string       `json:"path"`
	Result any          `json:"result,omitempty"`
	Error  *codec.Error `json:"error,omitempty"`
	// Cached: answered from the result cache (an incremental job).
	Cached bool `json:"cached,omitempty"`
}

func jobResultsCmd(args []string) int {
	f := newJobFlags("results")
	timeout := f.fs.Duration("timeout", 10*time.Minute, "how long reading every result may take")
	if !f.parse(args, 1) {
		return 2
	}
	c, err := f.connect(false)
	if err != nil {
		return jobFail("results", err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()
	err = c.EachJobResult(ctx, f.fs.Arg(0), func(r *codec.JobResult) error {
		printJSON(jobResultLine{Path: r.Path, Result: r.Result, Error: r.Error, Cached: r.Cached})
		return nil
	})
	if err != nil {
		return jobFail("results", err)
	}
	return 0
}

// watchJob follows the job until it is finished, through gateway restarts, calling fn
// with each status read; SIGINT ends it (ctx's error).
func watchJob(f jobFlags, interval, timeout time.Duration, fn func(*codec.JobStatus)) (*codec.JobStatus, error) {
	c, err := f.connect(true)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, timeout)
		defer cancel()
	}
	return c.WatchJob(ctx, f.fs.Arg(0), interval, fn)
}

func jobWatchCmd(args []string) int {
	f := newJobFlags("watch")
	interval := f.fs.Duration("interval", time.Second, "how often to read the status")
	timeout := f.fs.Duration("timeout", 0, "give up after this long (0: never)")
	if !f.parse(args, 1) {
		return 2
	}
	tty := isTerminal(os.Stdout)
	var last *codec.JobStatus
	st, err := watchJob(f, *interval, *timeout, func(st *codec.JobStatus) {
		switch {
		case tty:
			fmt.Print("\r" + cli.JobProgress(st) + "\x1b[K")
		case last == nil || jobChanged(last, st):
			printJSON(st)
		}
		last = st
	})
	if tty && last != nil {
		fmt.Println()
	}
	if err != nil {
		return jobFail("watch", err)
	}
	if tty {
		printJSON(st)
	}
	return waitStatus("watch", st) // as job wait's: a script learns the same from either
}

func jobWaitCmd(args []string) int {
	f := newJobFlags("wait")
	interval := f.fs.Duration("interval", time.Second, "how often to read the status")
	timeout := f.fs.Duration("timeout", 0, "give up after this long (0: never)")
	if !f.parse(args, 1) {
		return 2
	}
	st, err := watchJob(f, *interval, *timeout, nil)
	if err != nil {
		return jobFail("wait", err)
	}
	printJSON(st)
	return waitStatus("wait", st)
}

// Exit statuses of `job wait` and `job watch`: a script that waits for a job learns from the status
// alone whether every item has its result.
const (
	// waitDone: the job is done and every item was answered with the op's reply.
	waitDone = 0
	// waitFinishedBadly: the job was cancelled or failed (or wait itself failed: jobFail).
	waitFinishedBadly = 1
	// waitItemsFailed: the job is done, but at least one item was answered with an error
	// (`job results` prints which, and why).
	waitItemsFailed = 3
)

// waitStatus is the exit status of `job wait` and `job watch` (verb) for the job's final
// status.
func waitStatus(verb string, st *codec.JobStatus) int {
	switch {
	case st.State != codec.JobDone:
		return waitFinishedBadly
	case st.Failed > 0:
		fmt.Fprintf(os.Stderr, "ortbus job %s: %d of %d items failed (ortbus job results %s)\n", verb, st.Failed, st.Total, st.Job)
		return waitItemsFailed
	}
	return waitDone
}

// jobChanged reports whether the job's counts or state differ (its rate and ETA change
// with every read).
func jobChanged(a, b *codec.JobStatus) bool {
	return a.State != b.State || a.Total != b.Total || a.Done != b.Done || a.Failed != b.Failed ||
		a.Running != b.Running || a.Redelivered != b.Redelivered
}

// isTerminal reports whether f is a terminal (a character device).
func isTerminal(f *os.File) bool {
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}
