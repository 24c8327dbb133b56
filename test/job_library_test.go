package test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ortbus/ortbus/codec"
	"github.com/ortbus/ortbus/models/onnxgen"
)

// TestJobDirLeftOutListed: `ortbus job submit DIR` (the CLI's walk) and a submit with
// dir (the gateway's walk) take a directory's images by content — a photo saved without
// an extension too — and list every entry left out with its reason in the reply and in
// `job status`: a text file named .png, a subdirectory without --recursive. An item that
// sniffs as an image but cannot be decoded fails: `job watch` and `job wait` both exit
// 3 (items failed).
func TestJobDirLeftOutListed(t *testing.T) {
	t.Parallel()
	root := t.TempDir()
	lib := filepath.Join(root, "lib")
	for _, d := range []string{lib, filepath.Join(lib, "sub")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	red := onnxgen.Colours[0]
	writePNG(t, lib, "a.png", 32, 24, onnxgen.Solid(red.RGB))
	writePNG(t, lib, "IMG_0001", 32, 24, onnxgen.Solid(red.RGB)) // a PNG without an extension
	writePNG(t, filepath.Join(lib, "sub"), "c.png", 32, 24, onnxgen.Solid(red.RGB))
	if err := os.WriteFile(filepath.Join(lib, "fake.png"), []byte("not an image at all"), 0o644); err != nil {
		t.Fatal(err)
	}
	// PNG's signature, then nothing: taken (by content), and fails to decode.
	if err := os.WriteFile(filepath.Join(lib, "torn.png"), []byte("\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR"), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg := jobConfig(t, root, t.TempDir(), 1, 0)
	g := spawnGateway(t, cfg)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("gateway log:\n%s", g.log())
		}
		g.lp.Kill()
	})
	g.awaitReady(t)
	g.awaitJobStore(t)
	url := g.Ready.NATSURL

	wantSkipped := fmt.Sprint([]codec.JobSkip{
		{Path: filepath.Join(lib, "fake.png"), Reason: codec.JobSkipNotImage},
		{Path: filepath.Join(lib, "sub"), Reason: codec.JobSkipDirectory},
	})
	var sub codec.JobSubmitReply
	ortbusJSON(t, root, &sub, "job", "submit", "-s", url, "--op", "tag", "lib")
	if sub.Total != 3 || sub.SkippedTotal != 2 || fmt.Sprint(sub.Skipped) != wantSkipped {
		t.Fatalf("CLI submit: %+v; want 3 items (a.png, IMG_0001, torn.png) and skipped %s", sub, wantSkipped)
	}
	// Items failed: watch and wait agree (exit 3).
	for _, verb := range []string{"watch", "wait"} {
		out, code := ortbusRun(t, root, "job", verb, "-s", url, "-interval", "50ms", sub.Job)
		if code != 3 {
			t.Errorf("job %s of a job with a failed item: exit %d (%s), want 3", verb, code, out)
		}
	}
	var st codec.JobStatus
	ortbusJSON(t, root, &st, "job", "status", "-s", url, sub.Job)
	if st.State != codec.JobDone || st.Done != 2 || st.Failed != 1 || fmt.Sprint(st.Skipped) != wantSkipped || st.SkippedTotal != 2 {
		t.Errorf("status: %+v; want done, 2 done, 1 failed, skipped %s", st, wantSkipped)
	}

	// The gateway's own walk (dir), recursive: sub/c.png is an item now.
	c := jobClient(t, g)
	ctx, cancel := context.WithTimeout(context.Background(), gwReplyBound)
	defer cancel()
	rep, err := c.SubmitJob(ctx, &codec.JobSubmit{Op: "tag", Model: gwTagger, Dir: &codec.JobDir{Path: lib, Recursive: true}})
	if err != nil || rep.Total != 4 || rep.SkippedTotal != 1 || len(rep.Skipped) != 1 || rep.Skipped[0].Reason != codec.JobSkipNotImage {
		t.Fatalf("dir submit: %+v, %v; want 4 items and fake.png left out as not_an_image", rep, err)
	}
	// A directory whose only images are in a subdirectory: refused, naming the flag.
	_, err = c.SubmitJob(ctx, &codec.JobSubmit{Op: "tag", Model: gwTagger, Dir: &codec.JobDir{Path: filepath.Join(root)}})
	if codec.CodeOf(err) != codec.CodeBadRequest || !strings.Contains(err.Error(), "recursive") {
		t.Errorf("a directory of subdirectories only: %v, want bad_request naming recursive", err)
	}
}

// TestJobWaitingSaysWhy: a job whose only pool cannot start (its runtime missing) says
// so in its status (waiting: runtime_missing) instead of running mute with 0 running.
func TestJobWaitingSaysWhy(t *testing.T) {
	t.Parallel()
	root := t.TempDir()
	img := writePNG(t, root, "a.png", 32, 24, onnxgen.Solid(onnxgen.Colours[0].RGB))
	missing := filepath.Join(t.TempDir(), "no-such-ort", "libonnxruntime.so.1")
	cfg := gwConfig{
		Root:     root,
		StoreDir: t.TempDir(),
		Pools: []gwPool{
			{Name: "ia", Version: "1.30.0", Classes: []string{"interactive"}, Models: []string{gwTagger}},
			{Name: "bt", Runtime: missing, Classes: []string{"batch"}, Models: []string{gwTagger}},
		},
		Classes: []gwClass{{Name: "interactive", Chain: []string{"ia"}}, {Name: "batch", Chain: []string{"bt"}}},
	}.write(t)
	g := startGateway(t, cfg)
	g.awaitJobStore(t)
	c := jobClient(t, g)
	ctx, cancel := context.WithTimeout(context.Background(), gwReplyBound)
	defer cancel()
	rep, err := c.SubmitJob(ctx, &codec.JobSubmit{Op: "tag", Model: gwTagger, Items: []string{img}})
	if err != nil {
		t.Fatal(err)
	}
	// The pool's failure is known once its worker's start failed: wait for it in status.
	g.waitStatus(t, "pool bt failed", func(st *codec.StatusReply) bool {
		for _, p := range st.Pools {
			if p.Name == "bt" && p.Error != nil {
				return true
			}
		}
		return false
	})
	st, err := c.JobStatus(ctx, rep.Job)
	if err != nil {
		t.Fatal(err)
	}
	if st.State != codec.JobRunning || st.Waiting == nil || st.Waiting.Code != codec.CodeRuntimeMissing || !strings.Contains(st.Waiting.Message, "bt") {
		t.Fatalf("status of a job whose pool's runtime is missing: %+v (waiting %v); want running, waiting runtime_missing naming bt", st, st.Waiting)
	}
	l, err := c.ListJobs(ctx)
	if err != nil || len(l.Jobs) != 1 || l.Jobs[0].Waiting == nil {
		t.Fatalf("list: %+v, %v; want the job with its waiting reason", l, err)
	}
}
