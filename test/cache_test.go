package test

import (
	"context"
	"fmt"
	"image"
	"image/color"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"golang.org/x/image/bmp"

	"github.com/ortbus/ortbus/cache"

	"github.com/ortbus/ortbus/client"
	"github.com/ortbus/ortbus/codec"
	"github.com/ortbus/ortbus/config"
	"github.com/ortbus/ortbus/models/onnxgen"
	"github.com/ortbus/ortbus/subjects"
)

// The result cache end to end: a real gateway with JetStream and [cache] on, a real
// worker and the generated tagger.

// cacheConfig is jobConfig's system with the cache on, bounded by maxBytes.
func cacheConfig(t *testing.T, root string, maxBytes config.Bytes) string {
	t.Helper()
	return cacheConfigWith(t, root, maxBytes, nil)
}

// cacheConfigWith is cacheConfig with models in place of gwModels(t) (nil: those).
func cacheConfigWith(t *testing.T, root string, maxBytes config.Bytes, models map[string]*config.Model) string {
	t.Helper()
	return gwConfig{
		Models:   models,
		Root:     root,
		StoreDir: t.TempDir(),
		Cache:    config.Cache{Enabled: true, MaxBytes: maxBytes},
		Pools:    []gwPool{{Name: "bulk", Version: "1.24.3", Workers: 1, Slots: 1, Classes: []string{"interactive", "batch"}, Models: []string{gwTagger}}},
		Classes: []gwClass{
			{Name: "interactive", Chain: []string{"bulk"}},
			{Name: "batch", Chain: []string{"bulk"}, QueueBound: 10000},
		},
	}.write(t)
}

// writeBMP writes a solid w×h BMP of colour at path, in place when the file exists (its
// inode kept: opened for writing and truncated). BMP is uncompressed: every colour gives
// the same file size.
func writeBMP(t *testing.T, path string, w, h int, rgb [3]uint8) {
	t.Helper()
	img := image.NewRGBA(image.Rect(0, 0, w, h))
	for y := range h {
		for x := range w {
			img.Set(x, y, color.RGBA{rgb[0], rgb[1], rgb[2], 255})
		}
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	if err := bmp.Encode(f, img); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
}

// cacheJob submits dir as a job and waits for it; it checks each result against colours
// (by item index: the directory's files in name order) and returns the final status and
// which items were answered from the cache.
func cacheJob(t *testing.T, c *client.Client, id, dir string, incremental bool, colours []string) (*codec.JobStatus, map[int]bool) {
	t.Helper()
	if _, err := c.SubmitJob(context.Background(), &codec.JobSubmit{Job: id, Op: "tag", Dir: &codec.JobDir{Path: dir}, Incremental: incremental}); err != nil {
		t.Fatal(err)
	}
	st := jobWait(t, c, id, 2*time.Minute)
	if st.State != codec.JobDone || st.Done != len(colours) || st.Failed != 0 {
		t.Fatalf("job %s: %+v, want done with %d items", id, st, len(colours))
	}
	if st.Cached+st.Computed != st.Done {
		t.Errorf("job %s: cached %d + computed %d != done %d", id, st.Cached, st.Computed, st.Done)
	}
	cached := map[int]bool{}
	n := 0
	err := c.EachJobResult(context.Background(), id, func(r *codec.JobResult) error {
		n++
		if r.Error != nil {
			t.Errorf("job %s item %d: %v", id, r.Index, r.Error)
			return nil
		}
		checkColourTag(t, r.Result.(*codec.TagReply), colours[r.Index])
		if r.Cached {
			cached[r.Index] = true
			if tm := r.Result.(*codec.TagReply).Timing; !tm.Cached {
				t.Errorf("job %s item %d: cached, but its timing says not: %+v", id, r.Index, tm)
			}
		}
		return nil
	})
	if err != nil || n != len(colours) {
		t.Fatalf("job %s: %d results (%v), want %d", id, n, err, len(colours))
	}
	if len(cached) != st.Cached {
		t.Errorf("job %s: %d results say cached, status says %d", id, len(cached), st.Cached)
	}
	return st, cached
}

// cacheWait polls the cache's stats until ok says yes (bounded), and returns them.
func cacheWait(t *testing.T, c *client.Client, ok func(*codec.CacheStats) bool) *codec.CacheStats {
	t.Helper()
	until := time.Now().Add(30 * time.Second)
	for {
		st, err := c.CacheStats(context.Background(), "")
		if err == nil && ok(st) {
			return st
		}
		if time.Now().After(until) {
			t.Fatalf("cache stats never reached the condition: %+v %v", st, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestCacheIncrementalJobs: a first job computes each distinct image once (the duplicates
// inside it are answered from the first's answer); an incremental rescan with nothing
// changed computes nothing; a file rewritten in place with other bytes of the same size
// and mtime is computed again (never served the old answer) and only it; an interactive
// request hits the cache (timing.cached) unless it says cache: false; cache stats count
// it, and purge empties the cache.
func TestCacheIncrementalJobs(t *testing.T) {
	t.Parallel()
	root := t.TempDir()
	dir := filepath.Join(root, "lib")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	const n, distinct = 12, 4 // items i and i+4, i+8 are the same bytes
	var paths, colours []string
	for i := range n {
		c := onnxgen.Colours[i%distinct]
		p := filepath.Join(dir, fmt.Sprintf("img%02d.bmp", i))
		writeBMP(t, p, 32, 24, c.RGB)
		paths, colours = append(paths, p), append(colours, c.Name)
	}
	g := startGateway(t, cacheConfig(t, root, 0))
	c := jobClient(t, g)

	st, _ := cacheJob(t, c, "first", dir, false, colours)
	if st.Computed != distinct || st.Cached != n-distinct {
		t.Fatalf("first job: computed %d, cached %d; want each of the %d distinct images computed once", st.Computed, st.Cached, distinct)
	}

	st, cached := cacheJob(t, c, "rescan", dir, true, colours)
	if st.Computed != 0 || st.Cached != n || len(cached) != n {
		t.Fatalf("rescan of an unchanged library: computed %d, cached %d, want 0 and %d", st.Computed, st.Cached, n)
	}
	// `ortbus job results` says so on each line.
	out, code := ortbusRun(t, "", "job", "results", "-s", g.Ready.NATSURL, "rescan")
	if lines := strings.Split(strings.TrimSpace(out), "\n"); code != 0 || len(lines) != n {
		t.Fatalf("job results: exit %d, %d lines", code, len(lines))
	} else {
		for _, l := range lines {
			if !strings.Contains(l, `"cached":true`) {
				t.Errorf("job results line without \"cached\": true: %s", l)
			}
		}
	}

	// Item 1 (white) rewritten in place as magenta: same size, same mtime, same inode.
	fi, err := os.Stat(paths[1])
	if err != nil {
		t.Fatal(err)
	}
	writeBMP(t, paths[1], 32, 24, onnxgen.ColourNames["magenta"])
	if err := os.Chtimes(paths[1], fi.ModTime(), fi.ModTime()); err != nil {
		t.Fatal(err)
	}
	if after, err := os.Stat(paths[1]); err != nil || after.Size() != fi.Size() || !after.ModTime().Equal(fi.ModTime()) || !os.SameFile(fi, after) {
		t.Fatalf("the rewrite did not keep size, mtime and inode: %v", err)
	}
	colours[1] = "magenta"
	st, cached = cacheJob(t, c, "rewritten", dir, true, colours)
	if st.Computed != 1 || cached[1] {
		t.Fatalf("after a same-size, same-mtime rewrite: computed %d (item 1 cached: %v), want only item 1 computed", st.Computed, cached[1])
	}

	// Interactive: the second request for the same bytes is a hit.
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	first, err := c.Tag(ctx, codec.Request{Path: paths[0]})
	if err != nil {
		t.Fatal(err)
	}
	checkColourTag(t, first, colours[0])
	if !first.Timing.Cached {
		t.Errorf("an interactive request for bytes the jobs computed: timing %+v, want cached", first.Timing)
	}
	off := false
	bypass, err := c.Tag(ctx, codec.Request{Path: paths[0], Cache: &off})
	if err != nil {
		t.Fatal(err)
	}
	if bypass.Timing.Cached || bypass.Worker == "" {
		t.Errorf("cache: false was answered from the cache: %+v", bypass.Timing)
	}
	checkColourTag(t, bypass, colours[0])

	stats, err := c.CacheStats(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	if !stats.Enabled || stats.Entries != distinct+1 || stats.Hits < uint64(n-distinct+n+n-1+1) || stats.Bytes == 0 {
		t.Errorf("cache stats %+v: want %d entries and the hits counted", stats, distinct+1)
	}
	if byModel, err := c.CacheStats(ctx, gwTagger); err != nil || byModel.Entries != stats.Entries {
		t.Errorf("stats of model %s: %+v %v, want %d entries", gwTagger, byModel, err, stats.Entries)
	}
	var cli codec.CacheStats
	ortbusJSON(t, "", &cli, "cache", "stats", "-s", g.Ready.NATSURL)
	if cli.Entries != stats.Entries || cli.Hits < stats.Hits {
		t.Errorf("ortbus cache stats: %+v, want %d entries", cli, stats.Entries)
	}
	if m := gwScrape(t, g.Ready.HTTP); !strings.Contains(m, fmt.Sprintf("ortbus_cache_hits_total %d", cli.Hits)) || !strings.Contains(m, "ortbus_cache_bytes ") {
		t.Errorf("/metrics does not show the cache's hits (%d) and bytes", cli.Hits)
	}
	purged, err := c.PurgeCache(ctx, "")
	if err != nil || purged.Entries != 0 || purged.Purged != stats.Entries {
		t.Fatalf("purge: %+v %v, want %d purged and none left", purged, err, stats.Entries)
	}
	again, err := c.Tag(ctx, codec.Request{Path: paths[0]})
	if err != nil || again.Timing.Cached {
		t.Fatalf("after a purge: %v, timing %+v, want computed", err, again.Timing)
	}

	// A corrupt entry (anyone with the stream's rights could write one) is a miss: the
	// request is computed, never answered an error or the garbage. (An interactive
	// answer is stored after it is answered: wait for it.)
	stored := cacheWait(t, c, func(st *codec.CacheStats) bool { return st.Entries == 1 })
	js, err := jetstream.New(g.NC)
	if err != nil {
		t.Fatal(err)
	}
	stream, err := js.Stream(ctx, cache.StreamName)
	if err != nil {
		t.Fatal(err)
	}
	info, err := stream.Info(ctx, jetstream.WithSubjectFilter(subjects.CachePrefix+".>"))
	if err != nil || len(info.State.Subjects) != 1 {
		t.Fatalf("cache subjects: %v %v, want the one entry", info.State.Subjects, err)
	}
	for subj := range info.State.Subjects {
		if _, err := js.Publish(ctx, subj, []byte("\x82\xa1v\x01\xa1k\xa3bad")); err != nil {
			t.Fatal(err)
		}
	}
	fixed, err := c.Tag(ctx, codec.Request{Path: paths[0]})
	if err != nil || fixed.Timing.Cached {
		t.Fatalf("over a corrupt entry: %v, timing %+v, want computed", err, fixed.Timing)
	}
	checkColourTag(t, fixed, colours[0])
	if st, err := c.CacheStats(ctx, ""); err != nil || st.Corrupt != 1 {
		t.Fatalf("stats after a corrupt entry: %+v %v, want 1 corrupt", st, err)
	}
	cacheWait(t, c, func(st *codec.CacheStats) bool { return st.Writes > stored.Writes })
	if hit, err := c.Tag(ctx, codec.Request{Path: paths[0]}); err != nil || !hit.Timing.Cached {
		t.Fatalf("after the corrupt entry was replaced: %v, timing %+v, want cached", err, hit.Timing)
	}
}

// TestCacheEvictionKeepsServing: with a cache bound far smaller than the answers of a
// job, every item is still answered right, entries are evicted (the oldest written
// first), the cache stays within its bound, and what is left is served.
func TestCacheEvictionKeepsServing(t *testing.T) {
	t.Parallel()
	root := t.TempDir()
	dir := filepath.Join(root, "lib")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	const n = 160
	var colours []string
	for i := range n {
		// distinct bytes (a pixel set by i), the same colour tag
		c := onnxgen.Colours[i%len(onnxgen.Colours)]
		px := func(x, y int) [3]uint8 {
			if x == 0 && y == 0 {
				return [3]uint8{c.RGB[0] ^ uint8(i/len(onnxgen.Colours)), c.RGB[1], c.RGB[2]}
			}
			return c.RGB
		}
		writePNG(t, dir, fmt.Sprintf("img%03d.png", i), 32, 24, px)
		colours = append(colours, c.Name)
	}
	const bound = 64 << 10
	g := startGateway(t, cacheConfig(t, root, bound))
	c := jobClient(t, g)
	st, _ := cacheJob(t, c, "fill", dir, false, colours)
	if st.Computed != n {
		t.Fatalf("computed %d of %d distinct images", st.Computed, n)
	}
	ctx := context.Background()
	stats, err := c.CacheStats(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	if stats.Evictions == 0 || stats.Bytes > bound || stats.Writes != n {
		t.Fatalf("cache stats %+v: want %d writes, evictions, and at most %d bytes", stats, n, bound)
	}
	// The newest answer is served from the cache, the oldest was evicted and is computed.
	names := func(i int) string { return filepath.Join(dir, fmt.Sprintf("img%03d.png", i)) }
	newest, err := c.Tag(ctx, codec.Request{Path: names(n - 1)})
	if err != nil || !newest.Timing.Cached {
		t.Fatalf("the newest answer after evictions: %v, timing %+v, want cached", err, newest.Timing)
	}
	checkColourTag(t, newest, colours[n-1])
	oldest, err := c.Tag(ctx, codec.Request{Path: names(0)})
	if err != nil || oldest.Timing.Cached {
		t.Fatalf("the oldest answer after evictions: %v, timing %+v, want computed", err, oldest.Timing)
	}
	checkColourTag(t, oldest, colours[0])
}

// TestCacheModelRevision: a model's files replaced without a reload are a new revision at
// the gateway, while its worker still runs the old weights: what that worker computes is
// neither served from the old revision's entries nor stored under the new one. Once the
// model is reloaded, its answers are stored again, and the old revision's entries are gone.
func TestCacheModelRevision(t *testing.T) {
	t.Parallel()
	root := t.TempDir()
	dir := filepath.Join(root, "lib")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	writeBMP(t, filepath.Join(dir, "red.bmp"), 32, 24, onnxgen.ColourNames["red"])
	colours := []string{"red"}
	modelDir := filepath.Join(t.TempDir(), "tagger")
	if err := onnxgen.GenerateTagger(modelDir, 0); err != nil {
		t.Fatal(err)
	}
	models := gwModels(t)
	models[gwTagger] = &config.Model{Kind: config.KindTaggerPixAI, Dir: modelDir}
	g := startGateway(t, cacheConfigWith(t, root, 0, models))
	c := jobClient(t, g)
	ctx := context.Background()

	if st, _ := cacheJob(t, c, "v1", dir, true, colours); st.Computed != 1 {
		t.Fatalf("first job: computed %d, want 1", st.Computed)
	}
	if st, _ := cacheJob(t, c, "v1-again", dir, true, colours); st.Cached != 1 {
		t.Fatalf("second job: cached %d, want 1", st.Cached)
	}
	before, err := c.CacheStats(ctx, "")
	if err != nil || before.Writes != 1 || before.Entries != 1 {
		t.Fatalf("stats %+v %v: want 1 write, 1 entry", before, err)
	}

	// New weights on disk; the worker still runs the old ones.
	if err := onnxgen.GenerateTagger(modelDir, 1); err != nil {
		t.Fatal(err)
	}
	if st, _ := cacheJob(t, c, "files-replaced", dir, true, colours); st.Computed != 1 {
		t.Fatalf("after the files changed: computed %d, want 1 (the old revision's entry is not the new one's)", st.Computed)
	}
	if st, err := c.CacheStats(ctx, ""); err != nil || st.Writes != before.Writes {
		t.Fatalf("stats %+v %v: an answer of the old weights was stored under the new revision", st, err)
	}

	// Reloaded: the worker runs the new revision; its answer is stored and served.
	rctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if _, err := c.Model(rctx, &codec.ModelControl{Action: codec.ModelReload, Model: gwTagger}); err != nil {
		t.Fatal(err)
	}
	if st, _ := cacheJob(t, c, "reloaded", dir, true, colours); st.Computed != 1 {
		t.Fatalf("after the reload: computed %d, want 1", st.Computed)
	}
	if st, _ := cacheJob(t, c, "reloaded-again", dir, true, colours); st.Cached != 1 {
		t.Fatalf("after the reload, again: cached %d, want 1", st.Cached)
	}
	if st, err := c.CacheStats(ctx, ""); err != nil || st.Entries != 1 || st.Writes != before.Writes+1 {
		t.Fatalf("stats %+v %v: want the new revision's one entry (the old one purged)", st, err)
	}
}
