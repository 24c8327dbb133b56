package test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/ortbus/ortbus/codec"
	"github.com/ortbus/ortbus/subjects"
)

// `ortbus job ...` end to end: the built ortbus binary against a real gateway with its
// embedded NATS server running JetStream, real workers and the generated tagger.

// cliBound bounds one run of a one-shot ortbus command.
const cliBound = time.Minute

// ortbusCmd is the ortbus binary run with args in dir, dying with the test process.
func ortbusCmd(t testing.TB, ctx context.Context, dir string, args ...string) (cmd *exec.Cmd, stdout, stderr *bytes.Buffer) {
	t.Helper()
	cmd = exec.CommandContext(ctx, testBinary(t, "ortbus"), args...)
	cmd.Dir = dir
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	stdout, stderr = &bytes.Buffer{}, &bytes.Buffer{}
	cmd.Stdout, cmd.Stderr = stdout, stderr
	return cmd, stdout, stderr
}

// ortbusRun runs ortbus with args in dir to its end and returns its stdout and exit
// status (its stderr logged when not 0), failing t if it could not run or ran past
// cliBound.
func ortbusRun(t testing.TB, dir string, args ...string) (string, int) {
	t.Helper()
	stdout, code, stderr := ortbusRunErr(t, dir, args...)
	if code != 0 && stderr != "" {
		t.Logf("ortbus %v: exit %d; stderr:\n%s", args, code, stderr)
	}
	return stdout, code
}

// ortbusJSON runs ortbus with args, wants exit status 0 and one JSON line, and decodes it
// into out.
func ortbusJSON(t testing.TB, dir string, out any, args ...string) {
	t.Helper()
	stdout, code := ortbusRun(t, dir, args...)
	if code != 0 || strings.Count(stdout, "\n") != 1 {
		t.Fatalf("ortbus %v: exit %d, stdout %q; want exit 0 and one line", args, code, stdout)
	}
	if err := json.Unmarshal([]byte(stdout), out); err != nil {
		t.Fatalf("ortbus %v: %v in %q", args, err, stdout)
	}
}

// TestJobCLI is the acceptance scenario of `ortbus job`: a directory of 300 images
// submitted as a job, the whole stack (gateway, embedded NATS with its JetStream store,
// workers) killed with SIGKILL mid-job, `job wait` started while it is down, the stack
// restarted on the same config and address: wait reports 300 done, and `job results`
// prints one line per image with the right tags. Then a job too large for one message
// (the gateway walks its directory), cancelled: wait exits 1.
func TestJobCLI(t *testing.T) {
	t.Parallel()
	const n = 300
	root := t.TempDir()
	dir := filepath.Join(root, "lib")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	paths, colours := jobImages(t, dir, n)
	colourOf := map[string]string{}
	for i, p := range paths {
		colourOf[p] = colours[i]
	}
	// ack_wait 2s: items held by the killed gateway come back 2 s after the restart.
	cfg := jobConfig(t, root, t.TempDir(), 2, 2*time.Second)
	testBinary(t, "ortbus") // built before the clock starts
	addr := freeAddr(t)
	url := "nats://" + addr
	var g *gatewayProc // the gateway of the moment
	t.Cleanup(func() {
		if g == nil {
			return
		}
		if t.Failed() {
			t.Logf("last gateway's log:\n%s", g.log())
		}
		g.lp.Kill() // if the test failed before its stop
	})
	// start starts the gateway on the config and NATS address of the test.
	start := func() {
		g = spawnGatewayOn(t, cfg, addr)
		g.awaitReady(t)
		if g.Ready.NATSURL != url {
			t.Fatalf("gateway's NATS at %s, want %s", g.Ready.NATSURL, url)
		}
	}
	start()
	t0 := time.Now()

	// The results as the gateway publishes them: the kill comes right after the first
	// n/5 (a status read may take seconds while results come in).
	nc, err := nats.Connect(url, nats.MaxReconnects(0))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	spy := newGWSpy(t, nc, subjects.JobResultPrefix+".>")

	// A relative directory: the CLI makes it absolute.
	var sub codec.JobSubmitReply
	ortbusJSON(t, root, &sub, "job", "submit", "-s", url, "--op", "tag", "lib")
	if sub.Job == "" || sub.Total != n {
		t.Fatalf("submit: %+v, want a job of %d items", sub, n)
	}
	results := map[string]bool{}
	spy.until(t, fmt.Sprintf("%d results", n/5), func(m *nats.Msg) bool {
		results[m.Subject] = true
		return len(results) >= n/5
	})
	g.lp.Kill()
	t.Logf("killed at %d of %d results after %v", len(results), n, time.Since(t0).Round(time.Millisecond))

	// wait, started while nothing listens at url.
	wait, waitOut, waitErr := ortbusCmd(t, context.Background(), root, "job", "wait", "-s", url, "-interval", "100ms", sub.Job)
	if err := wait.Start(); err != nil {
		t.Fatal(err)
	}
	var waitRes error
	exited := make(chan struct{})
	go func() { waitRes = wait.Wait(); close(exited) }()
	t.Cleanup(func() {
		select {
		case <-exited:
		default:
			wait.Process.Kill()
			<-exited
		}
	})
	select {
	case <-exited:
		t.Fatalf("job wait exited while the gateway was down: %v; stdout %q, stderr %q", waitRes, waitOut, waitErr)
	case <-time.After(time.Second):
	}
	start()
	select {
	case <-exited:
		if waitRes != nil {
			t.Fatalf("job wait: %v; stdout %q, stderr %q", waitRes, waitOut, waitErr)
		}
	case <-time.After(2 * time.Minute):
		t.Fatalf("job wait not done 2 min after the restart; stderr %q", waitErr)
	}
	var st codec.JobStatus
	if err := json.Unmarshal(waitOut.Bytes(), &st); err != nil || strings.Count(waitOut.String(), "\n") != 1 {
		t.Fatalf("job wait printed %q: %v", waitOut, err)
	}
	if st.Job != sub.Job || st.State != codec.JobDone || st.Done != n || st.Failed != 0 {
		t.Fatalf("job wait: %+v, want done with %d done, none failed", st, n)
	}
	if st.Redelivered == 0 {
		t.Errorf("no item was redelivered after a kill mid-job: %+v", st)
	}
	t.Logf("done after %v: %+v", time.Since(t0).Round(time.Millisecond), st)
	var again codec.JobStatus
	ortbusJSON(t, root, &again, "job", "status", "-s", url, sub.Job)
	if again.Job != sub.Job || again.State != codec.JobDone || again.Total != n || again.Done != n || again.Op != "tag" || again.Class != "batch" {
		t.Errorf("job status: %+v, want job %s done, %d of %d items, tag, class batch", again, sub.Job, n, n)
	}

	out, code := ortbusRun(t, root, "job", "results", "-s", url, sub.Job)
	lines := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
	if code != 0 || len(lines) != n {
		t.Fatalf("job results: exit %d, %d lines; want exit 0, %d lines", code, len(lines), n)
	}
	seen := map[string]int{}
	for _, l := range lines {
		var r struct {
			Path   string          `json:"path"`
			Result *codec.TagReply `json:"result"`
			Error  *codec.Error    `json:"error"`
		}
		if err := json.Unmarshal([]byte(l), &r); err != nil {
			t.Fatalf("job results line %q: %v", l, err)
		}
		seen[r.Path]++
		switch colour, ok := colourOf[r.Path]; {
		case !ok:
			t.Errorf("a result for %q, not an item", r.Path)
		case r.Error != nil || r.Result == nil:
			t.Errorf("%s: error %v, result %v; want a tag reply", r.Path, r.Error, r.Result)
		default:
			checkColourTag(t, r.Result, colour)
		}
	}
	for _, p := range paths {
		if seen[p] != 1 {
			t.Errorf("%s: %d result lines, want 1", p, seen[p])
		}
	}

	// Not a terminal: watch of a finished job prints its status once and exits 0.
	var watched codec.JobStatus
	ortbusJSON(t, root, &watched, "job", "watch", "-s", url, sub.Job)
	if watched.State != codec.JobDone || watched.Done != n {
		t.Errorf("job watch: %+v, want done with %d done", watched, n)
	}

	// A job whose paths are over the server's max_payload (1 MiB): one directory alone
	// is walked by the gateway. Cancelled at once; wait then says so with exit 1. Each
	// file holds a PNG signature only: a walk takes a file by its content (images.Sniff),
	// and the items are cancelled before any is read whole.
	big := filepath.Join(root, "big")
	if err := os.Mkdir(big, 0o755); err != nil {
		t.Fatal(err)
	}
	const nBig = 12000
	size := 0
	for i := range nBig {
		p := filepath.Join(big, fmt.Sprintf("an-image-with-a-long-name-so-that-fewer-fill-the-payload-%05d.png", i))
		if err := os.WriteFile(p, []byte("\x89PNG\r\n\x1a\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		size += len(p)
	}
	if size <= 1<<20 {
		t.Fatalf("the big job's paths take %d bytes, want over 1 MiB", size)
	}
	var bigSub codec.JobSubmitReply
	ortbusJSON(t, root, &bigSub, "job", "submit", "-s", url, "--job", "big", big)
	if bigSub.Job != "big" || bigSub.Total != nBig {
		t.Fatalf("submit of %d files: %+v", nBig, bigSub)
	}
	ortbusJSON(t, root, &st, "job", "cancel", "-s", url, "big")
	if st.State != codec.JobCancelled {
		t.Fatalf("job cancel: %+v, want cancelled", st)
	}
	out, code = ortbusRun(t, root, "job", "wait", "-s", url, "big")
	if err := json.Unmarshal([]byte(out), &st); err != nil || code != 1 || st.State != codec.JobCancelled {
		t.Fatalf("job wait of a cancelled job: exit %d, %q (%v); want exit 1 and state cancelled", code, out, err)
	}
	var list codec.JobListReply
	ortbusJSON(t, root, &list, "job", "list", "-s", url)
	if len(list.Jobs) != 2 || list.Jobs[0].Job != "big" || list.Jobs[1].Job != sub.Job {
		t.Errorf("job list: %+v, want big and %s, newest first", list, sub.Job)
	}
	g.stop(t)
}
