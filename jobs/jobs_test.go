package jobs

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/ortbus/ortbus/codec"
	"github.com/ortbus/ortbus/config"
	"github.com/ortbus/ortbus/internal/testkit/testenv"
)

// These tests run the store on an in-process JetStream server with a fake runner (the
// gateway's scheduler and workers are tested end to end in test/jobs_test.go).

func testConfig() config.Jobs {
	return config.Jobs{Replicas: 1, AckWait: config.Duration(time.Second), MaxAckPending: 64, MaxDeliveries: 3,
		MaxItems: 1000, ItemsMaxBytes: 64 << 20, ResultsMaxBytes: 64 << 20, ResultsMaxAge: config.Duration(time.Hour)}
}

func open(t *testing.T, nc *nats.Conn) *Store {
	t.Helper()
	s, err := Open(context.Background(), nc, testConfig(), slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})))
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// runs counts the runs of each item and answers a tag reply naming the path.
type runs struct {
	mu sync.Mutex
	n  map[int]int
}

func (r *runs) runner(fn func(it Item) ([]byte, *codec.Error)) Runner {
	return func(ctx context.Context, it Item) ([]byte, *codec.Error) {
		r.mu.Lock()
		if r.n == nil {
			r.n = map[int]int{}
		}
		r.n[it.Index]++
		r.mu.Unlock()
		if fn != nil {
			return fn(it)
		}
		return tagReply(it), nil
	}
}

func (r *runs) count(i int) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.n[i]
}

func tagReply(it Item) []byte {
	b, _ := codec.Marshal(&codec.TagReply{Served: codec.Served{ID: it.ID()}, General: map[string]float32{it.Path: 1}})
	return b
}

// host is a Host of a fixed room.
type host struct {
	room int
	run  Runner
}

func (h host) Room() int { return h.room }
func (h host) RunItem(ctx context.Context, it Item) ([]byte, *codec.Error) {
	return h.run(ctx, it)
}

func consume(t *testing.T, s *Store, room int, run Runner) context.CancelFunc {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); s.Consume(ctx, host{room, run}) }()
	t.Cleanup(func() { cancel(); <-done })
	return cancel
}

func paths(n int) []string {
	var out []string
	for i := range n {
		out = append(out, fmt.Sprintf("/img/%03d.png", i))
	}
	return out
}

func waitStatus(t *testing.T, s *Store, job string, ok func(*codec.JobStatus) bool) *codec.JobStatus {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		st, e := s.Status(context.Background(), job, "")
		if e != nil {
			t.Fatalf("status: %v", e)
		}
		if ok(st) {
			return st
		}
		if time.Now().After(deadline) {
			t.Fatalf("job %s: status never reached the condition: %+v", job, st)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func allResults(t *testing.T, s *Store, job string, limit int) []codec.JobResult {
	t.Helper()
	var out []codec.JobResult
	req := &codec.JobResultsRequest{Job: job, Limit: limit}
	for pages := 0; ; pages++ {
		page, e := s.Results(context.Background(), req, "", 1<<20)
		if e != nil {
			t.Fatal(e)
		}
		out = append(out, page.Results...)
		if !page.More {
			return out
		}
		if pages > 1000 {
			t.Fatal("results never end")
		}
		req.From = page.Next
	}
}

func TestJobRunsEveryItemOnceWithOneResult(t *testing.T) {
	nc := testenv.InProcessJetStream(t)
	s := open(t, nc)
	var r runs
	consume(t, s, 8, r.runner(func(it Item) ([]byte, *codec.Error) {
		if it.Index%10 == 3 {
			return nil, codec.Errorf(codec.CodeFileNotFound, "no %s", it.Path)
		}
		return tagReply(it), nil
	}))
	rep, e := s.Submit(context.Background(), &Record{Job: "lib1", Op: "tag", Class: "batch"}, paths(100))
	if e != nil || rep.Job != "lib1" || rep.Total != 100 {
		t.Fatalf("submit: %+v %v", rep, e)
	}
	st := waitStatus(t, s, "lib1", (*codec.JobStatus).Finished)
	if st.State != codec.JobDone || st.Done != 90 || st.Failed != 10 || st.Total != 100 || st.Redelivered != 0 || st.FinishedUnixMS == 0 {
		t.Fatalf("status: %+v", st)
	}
	// A re-submit of the same spec adds nothing and runs nothing again.
	if rep, e := s.Submit(context.Background(), &Record{Job: "lib1", Op: "tag", Class: "batch"}, paths(100)); e != nil || rep.Total != 100 {
		t.Fatalf("re-submit: %+v %v", rep, e)
	}
	// Another spec under the same id is refused.
	if _, e := s.Submit(context.Background(), &Record{Job: "lib1", Op: "embed", Class: "batch"}, paths(100)); e == nil || e.Code != codec.CodeConflict {
		t.Fatalf("conflicting re-submit: %v", e)
	}
	res := allResults(t, s, "lib1", 7) // small pages: paging is exercised
	if len(res) != 100 {
		t.Fatalf("%d results, want 100", len(res))
	}
	seen := map[int]bool{}
	for _, x := range res {
		if seen[x.Index] {
			t.Fatalf("item %d has two results", x.Index)
		}
		seen[x.Index] = true
		if want := fmt.Sprintf("/img/%03d.png", x.Index); x.Path != want {
			t.Fatalf("item %d: path %q, want %q", x.Index, x.Path, want)
		}
		if x.Index%10 == 3 {
			if x.Error == nil || x.Error.Code != codec.CodeFileNotFound {
				t.Fatalf("item %d: want file_not_found, got %+v", x.Index, x)
			}
			continue
		}
		tr, ok := x.Result.(*codec.TagReply)
		if !ok || tr.General[x.Path] != 1 || tr.ID != fmt.Sprintf("job:lib1:%d", x.Index) {
			t.Fatalf("item %d: result %#v", x.Index, x.Result)
		}
	}
	for i := range 100 {
		if n := r.count(i); n != 1 {
			t.Fatalf("item %d ran %d times", i, n)
		}
	}
	list, e := s.List(context.Background(), "")
	if e != nil || len(list.Jobs) != 1 || list.Jobs[0].Job != "lib1" || list.Jobs[0].Done != 90 {
		t.Fatalf("list: %+v %v", list, e)
	}
}

// A gateway that dies while items run (here: a consumer stopped without acknowledging)
// leaves them to another after ack_wait; an item that was running at two deaths is
// answered poison_input without a third run.
func TestJobItemRunsAtMostTwice(t *testing.T) {
	nc := testenv.InProcessJetStream(t)
	var r runs
	dead := make(chan struct{}) // what a dead gateway's runs wait for: the test's end
	t.Cleanup(func() { close(dead) })
	hang := func(ctx context.Context, it Item) ([]byte, *codec.Error) {
		if it.Index == 0 {
			r.runner(nil)(ctx, it)
			<-ctx.Done() // the gateway dies while it runs: nothing of it answers any more
			<-dead
			return nil, codec.Errorf(codec.CodeCancelled, "stopped")
		}
		return r.runner(nil)(ctx, it)
	}
	first := open(t, nc)
	stop1 := consume(t, first, 2, hang)
	if _, e := first.Submit(context.Background(), &Record{Job: "j2", Op: "tag", Class: "batch"}, paths(5)); e != nil {
		t.Fatal(e)
	}
	waitStatus(t, first, "j2", func(st *codec.JobStatus) bool { return st.Done == 4 })
	stop1()
	second := open(t, nc)
	stop2 := consume(t, second, 2, hang)
	deadline := time.Now().Add(20 * time.Second)
	for r.count(0) < 2 {
		if time.Now().After(deadline) {
			t.Fatal("item 0 was never delivered again after its gateway stopped")
		}
		time.Sleep(20 * time.Millisecond)
	}
	stop2()
	third := open(t, nc)
	consume(t, third, 2, r.runner(nil))
	st := waitStatus(t, third, "j2", (*codec.JobStatus).Finished)
	if st.Done != 4 || st.Failed != 1 || st.Redelivered != 1 {
		t.Fatalf("status: %+v", st)
	}
	if n := r.count(0); n != 2 {
		t.Fatalf("item 0 ran %d times, want 2", n)
	}
	res := allResults(t, third, "j2", 0)
	for _, x := range res {
		if x.Index == 0 && (x.Error == nil || x.Error.Code != codec.CodePoisonInput) {
			t.Fatalf("item 0: %+v, want poison_input", x)
		}
	}
}

// A gateway that stops gracefully while an item runs gives the item's run mark back and
// hands the item on at once: stopped twice, it still runs to its result.
func TestJobGracefulStopGivesRunBack(t *testing.T) {
	nc := testenv.InProcessJetStream(t)
	var r runs
	started := make(chan struct{}, 4)
	stoppable := func(ctx context.Context, it Item) ([]byte, *codec.Error) {
		r.runner(nil)(ctx, it)
		started <- struct{}{}
		<-ctx.Done()
		return nil, codec.Errorf(codec.CodeCancelled, "the gateway stops")
	}
	s := open(t, nc)
	if _, e := s.Submit(context.Background(), &Record{Job: "g", Op: "tag", Class: "batch"}, paths(1)); e != nil {
		t.Fatal(e)
	}
	for range 2 {
		stop := consume(t, open(t, nc), 1, stoppable)
		<-started
		stop()
	}
	consume(t, s, 1, r.runner(nil))
	st := waitStatus(t, s, "g", (*codec.JobStatus).Finished)
	if st.Done != 1 || st.Failed != 0 || r.count(0) != 3 {
		t.Fatalf("status %+v after %d runs; want done after 3 runs (2 stopped)", st, r.count(0))
	}
}

// Errors that say nothing about the item are retried by the gateway holding it.
func TestJobRetriesTransientErrors(t *testing.T) {
	nc := testenv.InProcessJetStream(t)
	s := open(t, nc)
	var r runs
	consume(t, s, 4, r.runner(func(it Item) ([]byte, *codec.Error) {
		if r.count(it.Index) == 1 {
			return nil, codec.Errorf(codec.CodeNoWorker, "no worker yet")
		}
		return tagReply(it), nil
	}))
	if _, e := s.Submit(context.Background(), &Record{Job: "j3", Op: "tag", Class: "batch"}, paths(3)); e != nil {
		t.Fatal(e)
	}
	st := waitStatus(t, s, "j3", (*codec.JobStatus).Finished)
	if st.Done != 3 || st.Failed != 0 {
		t.Fatalf("status: %+v", st)
	}
	for i := range 3 {
		if n := r.count(i); n != 2 {
			t.Fatalf("item %d ran %d times, want 2 (one no_worker, one retry)", i, n)
		}
	}
}

// Cancel stops the running items, removes the waiting ones, and the job says cancelled.
func TestJobCancel(t *testing.T) {
	nc := testenv.InProcessJetStream(t)
	s := open(t, nc)
	started := make(chan int, 100)
	consume(t, s, 2, func(ctx context.Context, it Item) ([]byte, *codec.Error) {
		started <- it.Index
		<-ctx.Done()
		return nil, codec.Errorf(codec.CodeCancelled, "cancelled")
	})
	if _, e := s.Submit(context.Background(), &Record{Job: "j4", Op: "tag", Class: "batch"}, paths(50)); e != nil {
		t.Fatal(e)
	}
	<-started
	st, e := s.Cancel(context.Background(), "j4", "")
	if e != nil || st.State != codec.JobCancelled {
		t.Fatalf("cancel: %+v %v", st, e)
	}
	waitStatus(t, s, "j4", func(st *codec.JobStatus) bool { return st.Running == 0 })
	if n := len(started); n > 4 {
		t.Fatalf("%d more items started after the cancel", n)
	}
	if _, e := s.Status(context.Background(), "nope", ""); e == nil || e.Code != codec.CodeUnknownJob {
		t.Fatalf("unknown job: %v", e)
	}
	if _, e := s.Submit(context.Background(), &Record{Job: "j4", Op: "tag", Class: "batch"}, paths(50)); e == nil || e.Code != codec.CodeCancelled {
		t.Fatalf("re-submit of a cancelled job: %v", e)
	}
}

// TestJobPause: a paused job's running items finish and no other starts, while another
// job's items behind it run, though the paused job has more waiting items than the
// consumer's max_ack_pending (rule 8: they are parked, not held); resumed, every item
// runs once.
func TestJobPause(t *testing.T) {
	nc := testenv.InProcessJetStream(t)
	s := open(t, nc)
	ctx := context.Background()
	var r runs // the paused job's runs
	started := make(chan int, 100)
	release := make(chan struct{})
	paused := r.runner(func(it Item) ([]byte, *codec.Error) {
		started <- it.Index
		<-release
		return tagReply(it), nil
	})
	consume(t, s, 2, func(ctx context.Context, it Item) ([]byte, *codec.Error) {
		if it.Job.Job == "jp" {
			return paused(ctx, it)
		}
		return tagReply(it), nil
	})
	const total = 100 // > testConfig's MaxAckPending
	if _, e := s.Submit(ctx, &Record{Job: "jp", Op: "tag", Class: "batch"}, paths(total)); e != nil {
		t.Fatal(e)
	}
	<-started
	<-started // room 2: two items run
	st, e := s.Pause(ctx, "jp", "", true)
	if e != nil || st.State != codec.JobPaused || st.PausedUnixMS == 0 {
		t.Fatalf("pause: %+v %v", st, e)
	}
	close(release) // the two running items finish
	// Items submitted after the paused job's run, so its waiting items have been
	// delivered (and handed back) before these are done.
	if _, e := s.Submit(ctx, &Record{Job: "jo", Op: "tag", Class: "batch"}, paths(10)); e != nil {
		t.Fatal(e)
	}
	waitStatus(t, s, "jo", func(st *codec.JobStatus) bool { return st.State == codec.JobDone })
	st = waitStatus(t, s, "jp", func(st *codec.JobStatus) bool { return st.Done == 2 })
	if st.State != codec.JobPaused || len(started) != 0 {
		t.Fatalf("paused job: %+v, %d more items started", st, len(started))
	}
	if again, e := s.Pause(ctx, "jp", "", true); e != nil || again.PausedUnixMS != st.PausedUnixMS {
		t.Fatalf("a second pause: %+v %v, want the first's time kept", again, e)
	}
	// Resumed: running, or done already (the resume answers once it published the parked
	// items, which may all have run by then).
	if st, e := s.Pause(ctx, "jp", "", false); e != nil || st.State != codec.JobRunning && st.State != codec.JobDone {
		t.Fatalf("resume: %+v %v", st, e)
	}
	waitStatus(t, s, "jp", func(st *codec.JobStatus) bool { return st.State == codec.JobDone })
	for i := range total {
		if n := r.count(i); n != 1 {
			t.Errorf("item %d ran %d times", i, n)
		}
	}
	if len(allResults(t, s, "jp", 1000)) != total {
		t.Fatal("not one result per item")
	}
	if _, e := s.Pause(ctx, "nope", "", true); e == nil || e.Code != codec.CodeUnknownJob {
		t.Fatalf("pause of an unknown job: %v", e)
	}

	// A paused job cancelled: its parked items are dropped, never run.
	if _, e := s.Submit(ctx, &Record{Job: "jc", Op: "tag", Class: "batch"}, paths(10)); e != nil {
		t.Fatal(e)
	}
	if _, e := s.Pause(ctx, "jc", "", true); e != nil {
		t.Fatal(e)
	}
	if _, e := s.Submit(ctx, &Record{Job: "jo2", Op: "tag", Class: "batch"}, paths(5)); e != nil {
		t.Fatal(e)
	}
	waitStatus(t, s, "jo2", func(st *codec.JobStatus) bool { return st.State == codec.JobDone })
	// Every item of jc ran before the pause or is parked.
	st = waitStatus(t, s, "jc", func(st *codec.JobStatus) bool {
		keys, err := s.parkedKeys(ctx, "jc.*")
		return err == nil && len(keys) > 0 && len(keys)+st.Done == 10
	})
	if st, e := s.Cancel(ctx, "jc", ""); e != nil || st.State != codec.JobCancelled {
		t.Fatalf("cancel of a paused job: %+v %v", st, e)
	}
	if keys, err := s.parkedKeys(ctx, "jc.*"); err != nil || len(keys) != 0 {
		t.Fatalf("jc's parked items after its cancel: %v %v, want none", keys, err)
	}
	if after, e := s.Status(ctx, "jc", ""); e != nil || after.Done != st.Done {
		t.Fatalf("jc after its cancel: %+v %v, want its %d done and no more", after, e, st.Done)
	}
}

// TestJobWindows: outside [jobs] windows an anytime job runs and the others' items are
// parked (rule 9); when a window opens they run, each once. A store opened later knows of
// the anytime job.
func TestJobWindows(t *testing.T) {
	nc := testenv.InProcessJetStream(t)
	cfg := testConfig()
	cfg.Windows = []string{"22:00-07:00"}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	ctx := context.Background()
	s, err := Open(ctx, nc, cfg, log)
	if err != nil {
		t.Fatal(err)
	}
	var clock atomic.Int64
	clock.Store(time.Date(2026, 12, 3, 12, 0, 0, 0, time.Local).UnixNano())
	s.now = func() time.Time { return time.Unix(0, clock.Load()) }
	var r runs // the windowed job's runs
	windowed := r.runner(nil)
	consume(t, s, 2, func(ctx context.Context, it Item) ([]byte, *codec.Error) {
		if it.Job.Job == "jw" {
			return windowed(ctx, it)
		}
		return tagReply(it), nil
	})
	if _, e := s.Submit(ctx, &Record{Job: "jw", Op: "tag", Class: "batch"}, paths(10)); e != nil {
		t.Fatal(e)
	}
	if _, e := s.Submit(ctx, &Record{Job: "ja", Op: "tag", Class: "batch", Anytime: true}, paths(5)); e != nil {
		t.Fatal(e)
	}
	if !s.AnytimeKnown() {
		t.Fatal("the store does not know of the anytime job it took")
	}
	waitStatus(t, s, "ja", func(st *codec.JobStatus) bool { return st.State == codec.JobDone })
	st := waitStatus(t, s, "jw", func(*codec.JobStatus) bool {
		keys, err := s.parkedKeys(ctx, "jw.*")
		return err == nil && len(keys) == 10
	})
	if st.Done != 0 || st.State != codec.JobRunning {
		t.Fatalf("the windowed job at noon: %+v, want nothing run", st)
	}
	if later, err := Open(ctx, nc, cfg, log); err != nil || !later.AnytimeKnown() {
		t.Fatalf("a store opened later does not know of the anytime job: %v", err)
	}

	clock.Store(time.Date(2026, 12, 3, 23, 0, 0, 0, time.Local).UnixNano()) // the window opens
	waitStatus(t, s, "jw", func(st *codec.JobStatus) bool { return st.State == codec.JobDone })
	for i := range 10 {
		if n := r.count(i); n != 1 {
			t.Errorf("item %d of the windowed job ran %d times", i, n)
		}
	}
	if keys, err := s.parkedKeys(ctx, "jw.*"); err != nil || len(keys) != 0 {
		t.Fatalf("parked items left: %v %v", keys, err)
	}
}

// TestExpand: a directory's images are taken by content (a photo without an extension
// too; a text file named .png not), and every entry left out is listed with its reason:
// subdirectories without recursive, symlinks, FIFOs, non-images, glob misses.
func TestExpand(t *testing.T) {
	dir := t.TempDir()
	for f, content := range map[string]string{"a.png": pngMagic, "b.JPG": "\xff\xd8\xff\xe0\x00\x10JFIF", "notes.txt": "notes",
		"fake.png": "not an image at all", "IMG_0001": "\xff\xd8\xff\xe1\x00\x10Exif", "sub/c.png": pngMagic,
		"sub/d.webp": "RIFF\x1a\x00\x00\x00WEBPVP8L", "e.avif": "\x00\x00\x00\x1cftypavif\x00\x00\x00\x00avifmif1miaf"} {
		p := filepath.Join(dir, f)
		os.MkdirAll(filepath.Dir(p), 0o755)
		os.WriteFile(p, []byte(content), 0o644)
	}
	os.Symlink(filepath.Join(dir, "a.png"), filepath.Join(dir, "link.png"))
	fifo := syscall.Mkfifo(filepath.Join(dir, "pipe.png"), 0o644) == nil
	rel := func(ps []string) []string {
		for i, p := range ps {
			ps[i], _ = filepath.Rel(dir, p)
		}
		return ps
	}
	skipped := func(l Listing) string {
		var out []string
		for _, s := range l.Skipped {
			r, _ := filepath.Rel(dir, s.Path)
			out = append(out, r+":"+s.Reason)
		}
		return fmt.Sprint(out)
	}
	top := "[fake.png:not_an_image link.png:symlink notes.txt:not_an_image"
	if fifo {
		top += " pipe.png:not_a_regular_file"
	}
	for _, c := range []struct {
		d             codec.JobDir
		want, skipped string
	}{
		{codec.JobDir{Path: dir}, "[IMG_0001 a.png b.JPG e.avif]", top + " sub:directory_not_recursive]"},
		{codec.JobDir{Path: dir, Recursive: true}, "[IMG_0001 a.png b.JPG e.avif sub/c.png sub/d.webp]", top + "]"},
		{codec.JobDir{Path: dir, Recursive: true, Glob: "*.png"}, "[a.png fake.png sub/c.png]", ""},
	} {
		got, e := Expand(c.d, 100)
		if e != nil || fmt.Sprint(rel(got.Items)) != c.want {
			t.Errorf("%+v: %v %v, want %s", c.d, got.Items, e, c.want)
		}
		if c.skipped != "" && skipped(got) != c.skipped {
			t.Errorf("%+v: skipped %s, want %s", c.d, skipped(got), c.skipped)
		}
		if got.SkippedTotal != len(got.Skipped) {
			t.Errorf("%+v: skipped total %d, %d listed", c.d, got.SkippedTotal, len(got.Skipped))
		}
	}
	// A directory given as a symlink is listed, under the directory it points to.
	link := filepath.Join(t.TempDir(), "lib")
	os.Symlink(filepath.Join(dir, "sub"), link)
	if got, e := Expand(codec.JobDir{Path: link}, 100); e != nil || fmt.Sprint(rel(got.Items)) != "[sub/c.png sub/d.webp]" {
		t.Errorf("symlinked dir: %v %v", got, e)
	}
	if _, e := Expand(codec.JobDir{Path: dir, Recursive: true}, 3); e == nil || e.Code != codec.CodeBadRequest {
		t.Errorf("over max: %v", e)
	}
	if _, e := Expand(codec.JobDir{Path: filepath.Join(dir, "none")}, 3); e == nil || e.Code != codec.CodeFileNotFound {
		t.Errorf("missing dir: %v", e)
	}
	if _, e := Expand(codec.JobDir{Path: dir, Glob: "["}, 3); e == nil || e.Code != codec.CodeBadRequest {
		t.Errorf("bad glob: %v", e)
	}
}

// TestExpandSkipsBounded: a directory of many non-images lists at most
// codec.MaxJobSkipsListed of them, and counts them all.
func TestExpandSkipsBounded(t *testing.T) {
	dir := t.TempDir()
	n := codec.MaxJobSkipsListed + 10
	for i := range n {
		os.WriteFile(filepath.Join(dir, fmt.Sprintf("n%04d.txt", i)), []byte("text"), 0o644)
	}
	os.WriteFile(filepath.Join(dir, "z.png"), []byte(pngMagic), 0o644)
	got, e := Expand(codec.JobDir{Path: dir}, 100)
	if e != nil || len(got.Items) != 1 || len(got.Skipped) != codec.MaxJobSkipsListed || got.SkippedTotal != n {
		t.Fatalf("%d items, %d skipped listed of %d, %v; want 1, %d of %d", len(got.Items), len(got.Skipped), got.SkippedTotal, e, codec.MaxJobSkipsListed, n)
	}
}

// Owners: a job is seen, read and cancelled only by its owner (or the local owner "", by
// its key), another owner's job is unknown_job, and job ids are per owner (owner.go): B's
// submit of A's id is B's own job, never a conflict that tells B that A's exists, nor
// answered with A's results; a re-submit with other items is conflict.
func TestJobOwners(t *testing.T) {
	nc := testenv.InProcessJetStream(t)
	s := open(t, nc)
	ctx := context.Background()
	a, b := "account:A", "account:B"
	if _, e := s.Submit(ctx, &Record{Job: "ja", Op: "tag", Class: "batch", Owner: a}, paths(3)); e != nil {
		t.Fatal(e)
	}
	if _, e := s.Submit(ctx, &Record{Job: "jb", Op: "tag", Class: "batch", Owner: b}, paths(2)); e != nil {
		t.Fatal(e)
	}
	for _, c := range []struct {
		what string
		err  func() *codec.Error
	}{
		{"status", func() *codec.Error { _, e := s.Status(ctx, "ja", b); return e }},
		{"results", func() *codec.Error { _, e := s.Results(ctx, &codec.JobResultsRequest{Job: "ja"}, b, 1<<20); return e }},
		{"cancel", func() *codec.Error { _, e := s.Cancel(ctx, "ja", b); return e }},
		{"pause", func() *codec.Error { _, e := s.Pause(ctx, "ja", b, true); return e }},
		{"resume", func() *codec.Error { _, e := s.Pause(ctx, "ja", b, false); return e }},
	} {
		if e := c.err(); e == nil || e.Code != codec.CodeUnknownJob {
			t.Errorf("B's %s of A's job: %v, want unknown_job", c.what, e)
		}
	}
	if st, e := s.Status(ctx, "ja", a); e != nil || st.State == codec.JobCancelled {
		t.Fatalf("A's own job after B's cancel: %+v %v", st, e)
	}
	list := func(owner string) []string {
		l, e := s.List(ctx, owner)
		if e != nil {
			t.Fatal(e)
		}
		var ids []string
		for _, j := range l.Jobs {
			ids = append(ids, j.Job)
		}
		slices.Sort(ids)
		return ids
	}
	if got := list(b); !slices.Equal(got, []string{"jb"}) {
		t.Errorf("B's list %v, want only jb", got)
	}
	keys := []string{Key(a, "ja"), Key(b, "jb")}
	slices.Sort(keys)
	if got := list(""); !slices.Equal(got, keys) {
		t.Errorf("the local owner's list %v, want every job, by key: %v", got, keys)
	}
	if st, e := s.Status(ctx, Key(a, "ja"), ""); e != nil || st.Job != Key(a, "ja") || st.Total != 3 {
		t.Errorf("the local owner's status of A's job by its key: %+v %v", st, e)
	}
	if _, e := s.Status(ctx, "ja", ""); e == nil || e.Code != codec.CodeUnknownJob {
		t.Errorf("the local owner's status of ja (A's id, no job of its own): %v, want unknown_job", e)
	}
	// An account cannot reach a job by another's key either.
	if _, e := s.Status(ctx, Key(a, "ja"), b); e == nil || e.Code != codec.CodeUnknownJob {
		t.Errorf("B's status of A's key: %v, want unknown_job", e)
	}
	// The id is A's own: B's submit of it, with other items even, is B's job, and B's
	// status of it is B's (2 items), not A's (3).
	if r, e := s.Submit(ctx, &Record{Job: "ja", Op: "tag", Class: "batch", Owner: b}, paths(2)); e != nil || r.Job != "ja" || r.Total != 2 {
		t.Fatalf("B's submit of the id ja, which A uses too: %+v %v; want B's own job", r, e)
	}
	if st, e := s.Status(ctx, "ja", b); e != nil || st.Job != "ja" || st.Total != 2 {
		t.Errorf("B's status of its ja: %+v %v; want its own 2 items", st, e)
	}
	if st, e := s.Status(ctx, "ja", a); e != nil || st.Job != "ja" || st.Total != 3 {
		t.Errorf("A's status of its ja: %+v %v; want its own 3 items", st, e)
	}
	// The local owner may not take an account key's form (it could take ids before their
	// owner uses them).
	if _, e := s.Submit(ctx, &Record{Job: Key("account:C", "later"), Op: "tag", Class: "batch"}, paths(1)); e == nil || e.Code != codec.CodeBadRequest {
		t.Errorf("the local owner's submit under an account key's form: %v, want bad_request", e)
	}
	other := paths(3)
	other[1] += ".other.png"
	if _, e := s.Submit(ctx, &Record{Job: "ja", Op: "tag", Class: "batch", Owner: a}, other); e == nil || e.Code != codec.CodeConflict {
		t.Fatalf("re-submit with other items: %v, want conflict", e)
	}
	if r, e := s.Submit(ctx, &Record{Job: "ja", Op: "tag", Class: "batch", Owner: a}, paths(3)); e != nil || r.Job != "ja" || r.Total != 3 {
		t.Fatalf("A's identical re-submit: %+v %v", r, e)
	}
}

// Running counts the jobs not yet done, cancelled or failed, in all and per owner.
func TestJobsRunning(t *testing.T) {
	nc := testenv.InProcessJetStream(t)
	s := open(t, nc)
	ctx := context.Background()
	check := func(owner string, all, own int) {
		t.Helper()
		a, o, e := s.Running(ctx, owner, 100)
		if e != nil || a != all || o != own {
			t.Fatalf("Running(%q) = %d, %d, %v; want %d, %d", owner, a, o, e, all, own)
		}
	}
	check("account:A", 0, 0)
	for _, j := range []struct{ id, owner string }{{"r1", "account:A"}, {"r2", "account:A"}, {"r3", "account:B"}} {
		if _, e := s.Submit(ctx, &Record{Job: j.id, Op: "tag", Class: "batch", Owner: j.owner}, paths(2)); e != nil {
			t.Fatal(e)
		}
	}
	check("account:A", 3, 2)
	check("account:B", 3, 1)
	if _, e := s.Cancel(ctx, Key("account:A", "r1"), ""); e != nil {
		t.Fatal(e)
	}
	check("account:A", 2, 1)
	// A job whose every item is answered is done, no longer running.
	consume(t, s, 4, (&runs{}).runner(func(it Item) ([]byte, *codec.Error) {
		return nil, codec.Errorf(codec.CodeFileNotFound, "gone")
	}))
	waitStatus(t, s, Key("account:B", "r3"), func(st *codec.JobStatus) bool { return st.State == codec.JobDone })
	waitStatus(t, s, Key("account:A", "r2"), func(st *codec.JobStatus) bool { return st.State == codec.JobDone })
	check("account:B", 0, 0)
}
