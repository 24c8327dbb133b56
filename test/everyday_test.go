package test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ortbus/ortbus/codec"
	"github.com/ortbus/ortbus/config"
	"github.com/ortbus/ortbus/internal/testkit/testenv"
)

// Everyday use of the CLI and the job API against a real gateway (issue 34).

// TestJobSubmitRefusals: a job is refused whole at its submit when it could never run as
// asked — an item outside allowed_roots is forbidden_path (with the item's index), as a
// request of that path is, and --incremental with the result cache off is bad_request
// naming [cache] enabled — and `job wait` exits 3 when the job is done but an item
// failed (0 only when every item has its result).
func TestJobSubmitRefusals(t *testing.T) {
	t.Parallel()
	root := imageRoot(t)
	cfg := jobConfig(t, root, t.TempDir(), 1, 30*time.Second) // [cache] off
	testBinary(t, "ortbus")
	g := startGateway(t, cfg)
	url := g.Ready.NATSURL
	red := colourPNG(t, root, "red")
	outside := colourPNG(t, t.TempDir(), "blue") // a readable image, outside every root

	c := jobClient(t, g)
	ctx := context.Background()
	g.awaitJobStore(t)
	_, err := c.SubmitJob(ctx, &codec.JobSubmit{Op: "tag", Items: []string{red, outside}})
	wantCode(t, "a submit with an item outside allowed_roots", err, codec.CodeForbiddenPath)
	if ce := (*codec.Error)(nil); !errors.As(err, &ce) || fmt.Sprint(ce.Details["item"]) != "1" {
		t.Errorf("forbidden_path: %v, want details item 1", err)
	}
	out, code, stderr := ortbusRunErr(t, root, "job", "submit", "-s", url, red, outside)
	if code != 1 || out != "" || !strings.Contains(stderr, "forbidden_path") {
		t.Errorf("job submit of a path outside allowed_roots: exit %d, stdout %q, stderr %q; want exit 1, forbidden_path", code, out, stderr)
	}
	if l, err := c.ListJobs(ctx); err != nil || len(l.Jobs) != 0 {
		t.Errorf("jobs after the refused submits: %+v %v; want none", l, err)
	}

	out, code, stderr = ortbusRunErr(t, root, "job", "submit", "-s", url, "--incremental", red)
	if code != 1 || out != "" || !strings.Contains(stderr, "bad_request") || !strings.Contains(stderr, "[cache] enabled") {
		t.Errorf("job submit --incremental with the cache off: exit %d, stdout %q, stderr %q; want exit 1, bad_request naming [cache] enabled", code, out, stderr)
	}

	// One item answered, one failed (a file that is no image: refused where it is read):
	// wait exits 3. (Removing a file after the submit raced the item's run.)
	broken := filepath.Join(root, "broken.png")
	if err := os.WriteFile(broken, []byte("not an image"), 0o644); err != nil {
		t.Fatal(err)
	}
	var sub codec.JobSubmitReply
	ortbusJSON(t, root, &sub, "job", "submit", "-s", url, "--job", "half", red, broken)
	out, code, _ = ortbusRunErr(t, root, "job", "wait", "-s", url, "-interval", "50ms", "half")
	if code != 3 || !strings.Contains(out, `"failed":1`) {
		t.Errorf("job wait of a job with a failed item: exit %d, stdout %q; want exit 3", code, out)
	}
	// Every item answered: 0.
	ortbusJSON(t, root, &sub, "job", "submit", "-s", url, "--job", "whole", red)
	if out, code, _ = ortbusRunErr(t, root, "job", "wait", "-s", url, "-interval", "50ms", "whole"); code != 0 {
		t.Errorf("job wait of a job done whole: exit %d, stdout %q; want 0", code, out)
	}
}

// TestLocalConfigIncremental: the single-machine default, deploy/local.toml, has the
// result cache on, and on it an incremental rescan of an unchanged folder answers every
// item from the cache (only its ports, store, roots and model files are the test's).
func TestLocalConfigIncremental(t *testing.T) {
	t.Parallel()
	cfg, err := config.Load(filepath.Join("..", "deploy", "local.toml"))
	if err != nil {
		t.Fatal(err)
	}
	if !cfg.Cache.Enabled {
		t.Fatal("deploy/local.toml: [cache] enabled is not true")
	}
	root := imageRoot(t)
	dir := filepath.Join(root, "lib")
	spool := filepath.Join(root, "spool")
	for _, d := range []string{dir, spool} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	cfg.NATS.Listen, cfg.NATS.StoreDir = "127.0.0.1:0", t.TempDir()
	cfg.Gateway.HTTPListen = "127.0.0.1:0"
	cfg.Security.AllowedRoots, cfg.Security.SpoolDir = []string{root}, spool
	for _, m := range cfg.Models {
		m.Dir = filepath.Join(testenv.Models(t), filepath.Base(m.Dir))
	}
	g := startGateway(t, writeConfigFile(t, filepath.Join(t.TempDir(), "local.toml"), cfg))
	c := jobClient(t, g)
	_, colours := jobImages(t, dir, 12)
	checkFor(t, "the job store and the cache open", 2*gwReplyBound, pollEvery, func() error {
		st, err := c.CacheStats(context.Background(), "")
		if err == nil && !st.Enabled {
			return os.ErrNotExist
		}
		return err
	})
	first, _ := cacheJob(t, c, "scan", dir, false, colours)
	if first.Computed == 0 {
		t.Fatalf("first scan: %+v; want items computed", first)
	}
	again, cached := cacheJob(t, c, "rescan", dir, true, colours)
	if again.Cached != len(colours) || again.Computed != 0 || len(cached) != len(colours) {
		t.Fatalf("incremental rescan of the unchanged folder: %+v (%d results cached); want all %d from the cache", again, len(cached), len(colours))
	}
}

// ortbusRunErr runs ortbus with args in dir to its end and returns its stdout, exit
// status and stderr, failing t if it could not run or ran past cliBound (ortbusRun logs
// the stderr instead).
func ortbusRunErr(t testing.TB, dir string, args ...string) (stdout string, code int, stderr string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), cliBound)
	defer cancel()
	cmd, out, errOut := ortbusCmd(t, ctx, dir, args...)
	err := cmd.Run()
	var exit *exec.ExitError
	switch {
	case ctx.Err() != nil:
		t.Fatalf("ortbus %v: not done within %v; stderr:\n%s", args, cliBound, errOut)
	case errors.As(err, &exit):
		return out.String(), exit.ExitCode(), errOut.String()
	case err != nil:
		t.Fatalf("ortbus %v: %v", args, err)
	}
	return out.String(), 0, errOut.String()
}
