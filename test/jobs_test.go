package test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ortbus/ortbus/client"
	"github.com/ortbus/ortbus/codec"
	"github.com/ortbus/ortbus/config"
	"github.com/ortbus/ortbus/models/onnxgen"
)

// Jobs end to end: a real gateway with its embedded NATS server running JetStream, real
// workers and the generated tagger.

// jobConfig is a gateway with JetStream in storeDir and one batch pool of workers
// tagging with model, items redelivered after ackWait.
func jobConfig(t *testing.T, root, storeDir string, workers int, ackWait time.Duration) string {
	t.Helper()
	return gwConfig{
		Root:     root,
		StoreDir: storeDir,
		Jobs:     config.Jobs{AckWait: config.Duration(ackWait)},
		Pools:    []gwPool{{Name: "bulk", Version: "1.24.3", Workers: workers, Slots: 1, Classes: []string{"interactive", "batch"}, Models: []string{gwTagger}}},
		Classes: []gwClass{
			{Name: "interactive", Chain: []string{"bulk"}},
			{Name: "batch", Chain: []string{"bulk"}, QueueBound: 10000},
		},
	}.write(t)
}

// jobImages writes n small images under a new directory of root, named by their index
// and coloured by index modulo the corner colours, and returns their paths and colours.
func jobImages(t *testing.T, root string, n int) (paths, colours []string) {
	t.Helper()
	for i := range n {
		c := onnxgen.Colours[i%len(onnxgen.Colours)]
		paths = append(paths, writePNG(t, root, fmt.Sprintf("img%04d.png", i), 32, 24, onnxgen.Solid(c.RGB)))
		colours = append(colours, c.Name)
	}
	return paths, colours
}

// jobClient connects a Go client to the gateway's NATS.
func jobClient(t *testing.T, g *gatewayProc) *client.Client {
	t.Helper()
	c, err := client.Connect(g.Ready.NATSURL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c
}

// jobWait waits for the job to finish and returns its final status.
func jobWait(t *testing.T, c *client.Client, job string, bound time.Duration) *codec.JobStatus {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), bound)
	defer cancel()
	st, err := c.WatchJob(ctx, job, 50*time.Millisecond, nil)
	if err != nil {
		t.Fatalf("job %s did not finish within %v: %v", job, bound, err)
	}
	return st
}

// jobCheckResults reads every result of the job and checks there is exactly one per
// item, for the item's path, each a tag reply naming the item's colour.
func jobCheckResults(t *testing.T, c *client.Client, job string, paths, colours []string) {
	t.Helper()
	seen := make([]int, len(paths))
	err := c.EachJobResult(context.Background(), job, func(r *codec.JobResult) error {
		if r.Index < 0 || r.Index >= len(paths) {
			t.Errorf("result for item %d of a %d-item job", r.Index, len(paths))
			return nil
		}
		seen[r.Index]++
		if r.Path != paths[r.Index] {
			t.Errorf("item %d: result for %s, want %s", r.Index, r.Path, paths[r.Index])
		}
		if r.Error != nil {
			t.Errorf("item %d (%s): error %v", r.Index, r.Path, r.Error)
			return nil
		}
		tr, ok := r.Result.(*codec.TagReply)
		if !ok {
			t.Errorf("item %d: result %T, want a tag reply", r.Index, r.Result)
			return nil
		}
		checkColourTag(t, tr, colours[r.Index])
		return nil
	})
	if err != nil {
		t.Fatalf("read results: %v", err)
	}
	for i, n := range seen {
		if n != 1 {
			t.Errorf("item %d (%s): %d results, want exactly 1", i, paths[i], n)
		}
	}
}

// TestJobRunsThroughTheGateway submits a directory as a job (holding symlinks out of the
// allowed root, which are not followed), reads its status and its results, and checks
// the API's answers to bad input.
func TestJobRunsThroughTheGateway(t *testing.T) {
	t.Parallel()
	root := t.TempDir()
	dir := filepath.Join(root, "lib")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	paths, colours := jobImages(t, dir, 40)
	outsideDir := t.TempDir()
	writePNG(t, outsideDir, "secret.png", 8, 8, onnxgen.Solid(onnxgen.Colours[0].RGB))
	for link, target := range map[string]string{"out": outsideDir, "link.png": filepath.Join(outsideDir, "secret.png")} {
		if err := os.Symlink(target, filepath.Join(dir, link)); err != nil {
			t.Fatal(err)
		}
	}
	away := filepath.Join(root, "away")
	if err := os.Symlink(outsideDir, away); err != nil {
		t.Fatal(err)
	}
	g := startGateway(t, jobConfig(t, root, t.TempDir(), 1, 5*time.Second))
	c := jobClient(t, g)
	ctx := context.Background()

	sub, err := c.SubmitJob(ctx, &codec.JobSubmit{Job: "lib", Op: "tag", Dir: &codec.JobDir{Path: dir, Recursive: true}})
	if err != nil {
		t.Fatal(err)
	}
	if sub.Job != "lib" || sub.Total != len(paths) {
		t.Fatalf("submit: %+v, want job lib with %d items", sub, len(paths))
	}
	st := jobWait(t, c, "lib", gwReplyBound)
	if st.State != codec.JobDone || st.Done != len(paths) || st.Failed != 0 || st.Class != "batch" {
		t.Fatalf("final status %+v, want done with %d items done, none failed, class batch", st, len(paths))
	}
	jobCheckResults(t, c, "lib", paths, colours)

	// The same submit again adds nothing; another spec under the same id is refused.
	again, err := c.SubmitJob(ctx, &codec.JobSubmit{Job: "lib", Op: "tag", Dir: &codec.JobDir{Path: dir, Recursive: true}})
	if err != nil || again.Total != len(paths) {
		t.Fatalf("re-submit: %+v, %v", again, err)
	}
	if st, err := c.JobStatus(ctx, "lib"); err != nil || st.Done != len(paths) {
		t.Fatalf("after re-submit: %+v, %v; want %d done", st, err, len(paths))
	}
	jobCheckResults(t, c, "lib", paths, colours)

	// The figures of /metrics: every item settled here, nothing left.
	metrics := gwScrape(t, g.Ready.HTTP)
	for _, want := range []string{"ortbus_job_items_acked_total 40", "ortbus_jobs_active 0", "ortbus_job_items_pending 0", "ortbus_job_items_ack_pending 0", "ortbus_job_items_held 0"} {
		if !strings.Contains(metrics, "\n"+want+"\n") {
			t.Errorf("/metrics has no line %q", want)
		}
	}

	list, err := c.ListJobs(ctx)
	if err != nil || len(list.Jobs) != 1 || list.Jobs[0].Job != "lib" {
		t.Fatalf("list: %+v, %v", list, err)
	}

	bad := []struct {
		name string
		req  codec.JobSubmit
		code codec.Code
	}{
		{"other spec, same id", codec.JobSubmit{Job: "lib", Op: "tag", Items: paths[:3]}, codec.CodeConflict},
		{"dir outside the roots", codec.JobSubmit{Op: "tag", Dir: &codec.JobDir{Path: t.TempDir()}}, codec.CodeForbiddenPath},
		{"dir that does not exist", codec.JobSubmit{Op: "tag", Dir: &codec.JobDir{Path: filepath.Join(root, "nope")}}, codec.CodeFileNotFound},
		{"dir linking out of the roots", codec.JobSubmit{Op: "tag", Dir: &codec.JobDir{Path: away, Recursive: true}}, codec.CodeForbiddenPath},
		{"dir that is a file", codec.JobSubmit{Op: "tag", Dir: &codec.JobDir{Path: paths[0]}}, codec.CodeBadRequest},
		{"unknown model", codec.JobSubmit{Op: "tag", Model: "nope", Items: paths[:1]}, codec.CodeUnknownModel},
		{"unknown class", codec.JobSubmit{Op: "tag", Class: "nope", Items: paths[:1]}, codec.CodeBadRequest},
		{"op not a job op", codec.JobSubmit{Op: "compare", Items: paths[:1]}, codec.CodeBadRequest},
		{"job id with a dot", codec.JobSubmit{Job: "a.b", Op: "tag", Items: paths[:1]}, codec.CodeBadRequest},
	}
	for _, b := range bad {
		_, err := c.SubmitJob(ctx, &b.req)
		if codec.CodeOf(err) != b.code {
			t.Errorf("%s: %v, want %s", b.name, err, b.code)
		}
	}
	if _, err := c.JobStatus(ctx, "nope"); codec.CodeOf(err) != codec.CodeUnknownJob {
		t.Errorf("status of an unknown job: %v, want unknown_job", err)
	}

	// An item outside the roots as written is refused at the submit, the whole job with
	// it; one that escapes them through a symlink is found where it is read: the item's
	// error, and the job goes on.
	outside := writePNG(t, t.TempDir(), "x.png", 8, 8, onnxgen.Solid(onnxgen.Colours[0].RGB))
	if _, err := c.SubmitJob(ctx, &codec.JobSubmit{Op: "tag", Items: []string{paths[0], outside}}); codec.CodeOf(err) != codec.CodeForbiddenPath {
		t.Fatalf("a submit with an item outside the roots: %v, want forbidden_path", err)
	}
	sub, err = c.SubmitJob(ctx, &codec.JobSubmit{Op: "tag", Items: []string{paths[0], filepath.Join(dir, "link.png")}})
	if err != nil {
		t.Fatal(err)
	}
	st = jobWait(t, c, sub.Job, gwReplyBound)
	if st.Done != 1 || st.Failed != 1 || st.State != codec.JobDone {
		t.Fatalf("job with an item linking out of the roots: %+v, want done with 1 done, 1 failed", st)
	}
	err = c.EachJobResult(ctx, sub.Job, func(r *codec.JobResult) error {
		if want := r.Index == 1; (r.Error != nil) != want || want && r.Error.Code != codec.CodeForbiddenPath {
			t.Errorf("item %d (%s): error %v", r.Index, r.Path, r.Error)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// TestJobSurvivesKills runs a 500-item job and kills the whole stack (the gateway's
// process group: gateway, embedded NATS server with its JetStream store, workers) with
// SIGKILL twice while it runs, restarting it on the same config each time. Every item
// must end with exactly one result, the right one, and the counts must say so.
func TestJobSurvivesKills(t *testing.T) {
	t.Parallel()
	const n = 500
	root := t.TempDir()
	paths, colours := jobImages(t, root, n)
	// ack_wait 2s: items held by a killed gateway come back 2 s after the restart.
	cfg := jobConfig(t, root, t.TempDir(), 2, 2*time.Second)
	ctx := context.Background()

	g := spawnGateway(t, cfg)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("last gateway's log:\n%s", g.log())
		}
		g.lp.Kill() // the gateway of the moment, if the test failed before its stop
	})
	g.awaitReady(t)
	c := jobClient(t, g)
	sub, err := c.SubmitJob(ctx, &codec.JobSubmit{Job: "kills", Op: "tag", Items: paths})
	if err != nil || sub.Total != n {
		t.Fatalf("submit: %+v, %v", sub, err)
	}
	for round, at := range []int{n / 5, n / 2} {
		checkFor(t, "job progress before a kill", gwReplyBound, 10*time.Millisecond, func() error {
			st, err := c.JobStatus(ctx, "kills")
			if err != nil {
				return err
			}
			if st.Done < at {
				return fmt.Errorf("%d done, waiting for %d", st.Done, at)
			}
			return nil
		})
		g.lp.Kill()
		t.Logf("kill %d at %d+ done", round+1, at)
		c.Close()
		g = spawnGateway(t, cfg)
		g.awaitReady(t)
		c = jobClient(t, g)
	}
	st := jobWait(t, c, "kills", 2*time.Minute)
	if st.State != codec.JobDone || st.Done != n || st.Failed != 0 {
		t.Fatalf("final status %+v, want done with %d done and none failed", st, n)
	}
	// Items held by a killed gateway were delivered again: the kills hit the job.
	if st.Redelivered == 0 {
		t.Errorf("no item was redelivered after two kills mid-job: %+v", st)
	}
	jobCheckResults(t, c, "kills", paths, colours)
	t.Logf("final status %+v", st)
	g.stop(t)
}

// TestJobGracefulRestart stops the gateway (SIGTERM) while its workers run job items and
// starts it again: the items it held are handed back to JetStream at the stop, so the
// job finishes long before ack_wait (10 minutes here, far past the test's bound) would
// have brought them back.
func TestJobGracefulRestart(t *testing.T) {
	t.Parallel()
	root := t.TempDir()
	paths, colours := jobImages(t, root, 60)
	cfg := gwConfig{
		Root: root, StoreDir: t.TempDir(),
		Jobs:    config.Jobs{AckWait: config.Duration(10 * time.Minute)},
		Pools:   []gwPool{{Name: "bulk", Version: "1.24.3", Workers: 2, Slots: 1, Classes: []string{"interactive", "batch"}, Models: []string{gwSlow}}},
		Classes: []gwClass{{Name: "interactive", Chain: []string{"bulk"}}, {Name: "batch", Chain: []string{"bulk"}, QueueBound: 10000}},
	}.write(t)
	g := spawnGateway(t, cfg)
	t.Cleanup(func() { g.lp.Kill() })
	g.awaitReady(t)
	c := jobClient(t, g)
	ctx := context.Background()
	if _, err := c.SubmitJob(ctx, &codec.JobSubmit{Job: "restart", Op: "tag", Model: gwSlow, Items: paths}); err != nil {
		t.Fatal(err)
	}
	checkFor(t, "job progress before the stop", gwReplyBound, 10*time.Millisecond, func() error {
		st, err := c.JobStatus(ctx, "restart")
		if err == nil && st.Done < 10 {
			err = fmt.Errorf("%d done", st.Done)
		}
		return err
	})
	g.stop(t)
	c.Close()
	g = spawnGateway(t, cfg)
	g.awaitReady(t)
	c = jobClient(t, g)
	st := jobWait(t, c, "restart", 2*gwReplyBound)
	if st.State != codec.JobDone || st.Done != len(paths) || st.Failed != 0 {
		t.Fatalf("final status %+v, want done with %d done", st, len(paths))
	}
	jobCheckResults(t, c, "restart", paths, colours)
	g.stop(t)
}
