package bench

import (
	"bytes"
	"context"
	"fmt"
	"image"
	"image/color"
	"image/png"
	"io"
	"os"
	"path/filepath"
	"time"

	"github.com/ortbus/ortbus/codec"
	"github.com/ortbus/ortbus/config"
	"github.com/ortbus/ortbus/models/onnxgen"
	"github.com/ortbus/ortbus/subjects"
)

// Incremental bench settings.
const (
	// IncrementalItems is the default library size (images; -n).
	IncrementalItems = 10_000
	// incrementalSide is the side of the generated images (pixels).
	incrementalSide = 32
)

// IncrementalResults are the results of `bench incremental`: incremental jobs over one
// library of N distinct small images, for two taggers (A, then B, each its own model with
// its own files), through one gateway with the result cache on:
//
//  1. first: every image computed (A, then B);
//  2. rescan: nothing changed, A again (goal: at least 50x faster than A's first);
//  3. changed: 1 % of the files rewritten with other pixels and 1 % added, A again (goal:
//     exactly those computed), then B likewise;
//  4. revision: A's files replaced by a new revision (other weights) and reloaded, then
//     A (all recomputed) and B (nothing recomputed).
type IncrementalResults struct {
	Items  int              `json:"items"`
	Phases []IncrementalRun `json:"phases"`
	// RescanSpeedup is first / rescan (elapsed), goal >= 50.
	RescanSpeedup float64 `json:"rescan_speedup"`
	// ChangedExact: the changed rescan computed exactly the changed and added images.
	ChangedExact bool `json:"changed_exact"`
	// RevisionExact: after A's revision, A computed all and B none.
	RevisionExact bool             `json:"revision_exact"`
	Setup         IncrementalSetup `json:"setup"`
}

// IncrementalRun is one job: how many items it had, computed and took from the cache,
// how long it took (submit to its last result), and the gateway's stat and hash time
// and cache size after it.
type IncrementalRun struct {
	Phase     string  `json:"phase"`
	Model     string  `json:"model"`
	Items     int     `json:"items"`
	Computed  int     `json:"computed"`
	Cached    int     `json:"cached"`
	Failed    int     `json:"failed"`
	ElapsedS  float64 `json:"elapsed_s"`
	ItemsPerS float64 `json:"items_per_s"`
	// Stats and Hashed are the files the gateway stat'ed and hashed during the job, StatMS
	// and HashMS the time each took (summed over the gateway's concurrent item handlers).
	Stats      uint64  `json:"stats"`
	Hashed     uint64  `json:"hashed"`
	StatMS     float64 `json:"stat_ms"`
	HashMS     float64 `json:"hash_ms"`
	CacheBytes uint64  `json:"cache_bytes"`
	Entries    uint64  `json:"cache_entries"`
}

// IncrementalSetup describes the system.
type IncrementalSetup struct {
	Model   string `json:"model"`
	Image   string `json:"image"`
	Workers int    `json:"workers"`
	Threads int    `json:"threads"`
}

// Incremental runs the incremental-jobs bench.
func Incremental(ctx context.Context, o Options) (*Report, error) {
	if err := o.resolve(); err != nil {
		return nil, err
	}
	n := positiveOr(o.N, IncrementalItems)
	h, err := newHarness(&o, "incremental", 0)
	if err != nil {
		return nil, err
	}
	defer h.close()
	rep, w := h.rep, h.w
	out := o.out()

	// Two taggers with files of their own: A is revised later, B is not.
	dirA, dirB := filepath.Join(w.dir, "tagger-a"), filepath.Join(w.dir, "tagger-b")
	for _, d := range []string{dirA, dirB} {
		if err := onnxgen.GenerateTagger(d, 0); err != nil {
			return nil, err
		}
	}
	lib := filepath.Join(w.images, "library")
	if err := writeLibrary(out, lib, n); err != nil {
		return nil, err
	}
	cfg, err := w.writeConfig(&o, "incremental", incrementalConfig(h, dirA, dirB))
	if err != nil {
		return nil, err
	}
	res := &IncrementalResults{Items: n, Setup: IncrementalSetup{Model: "two onnxgen taggers (no compute layers)",
		Image: fmt.Sprintf("%dx%d PNG, each distinct", incrementalSide, incrementalSide), Workers: 1, Threads: 1}}
	rep.Results = res
	sys, err := startSystem(ctx, &o, w, "incremental", cfg)
	if err != nil {
		return nil, err
	}
	defer sys.stop()
	sys.runtimes(ctx, &rep.Machine.Runtimes)

	seq := 0
	run := func(phase, model string) (*IncrementalRun, error) {
		seq++
		r, err := incrementalJob(ctx, sys, fmt.Sprintf("inc-%d", seq), phase, model, lib)
		if err != nil {
			return nil, fmt.Errorf("%s (%s): %w", phase, model, err)
		}
		res.Phases = append(res.Phases, *r)
		return r, nil
	}
	firstA, err := run("first", "tagger-a")
	if err != nil {
		return nil, err
	}
	if _, err := run("first", "tagger-b"); err != nil {
		return nil, err
	}
	rescan, err := run("rescan, nothing changed", "tagger-a")
	if err != nil {
		return nil, err
	}
	// 1 % changed (other pixels, same names), 1 % added.
	k := max(1, n/100)
	if err := changeLibrary(lib, n, k); err != nil {
		return nil, err
	}
	changed, err := run(fmt.Sprintf("rescan, %d changed + %d added", k, k), "tagger-a")
	if err != nil {
		return nil, err
	}
	if _, err := run(fmt.Sprintf("rescan, %d changed + %d added", k, k), "tagger-b"); err != nil {
		return nil, err
	}
	if err := reviseTagger(ctx, sys, dirA, "tagger-a"); err != nil {
		return nil, err
	}
	revA, err := run("after tagger-a's revision", "tagger-a")
	if err != nil {
		return nil, err
	}
	revB, err := run("after tagger-a's revision", "tagger-b")
	if err != nil {
		return nil, err
	}

	res.RescanSpeedup = ratio(firstA.ElapsedS, rescan.ElapsedS)
	res.ChangedExact = changed.Computed == 2*k && changed.Cached == n-k && changed.Failed == 0
	res.RevisionExact = revA.Computed == n+k && revB.Computed == 0 && revB.Cached == n+k
	reportIncremental(out, rep, res, n, k, changed, revA, revB)
	return rep, nil
}

// writeLibrary writes the library's n distinct images, said on out with the time taken.
func writeLibrary(out io.Writer, lib string, n int) error {
	if err := os.MkdirAll(lib, 0o755); err != nil {
		return err
	}
	t0 := time.Now()
	for i := range n {
		if err := incrementalImage(lib, i, 0); err != nil {
			return err
		}
	}
	fmt.Fprintf(out, "incremental: %d distinct %dx%d PNGs written in %.1fs\n", n, incrementalSide, incrementalSide, time.Since(t0).Seconds())
	return nil
}

// changeLibrary changes k of the library's n images (other pixels, same names) and adds k.
func changeLibrary(lib string, n, k int) error {
	for i := range k {
		if err := incrementalImage(lib, i*(n/k), 1); err != nil {
			return err
		}
		if err := incrementalImage(lib, n+i, 0); err != nil {
			return err
		}
	}
	return nil
}

// reviseTagger writes a new revision of the tagger in dir: other weights (one compute
// layer), same labels; its workers reload it.
func reviseTagger(ctx context.Context, sys *system, dir, model string) error {
	if err := onnxgen.GenerateTagger(dir, 1); err != nil {
		return err
	}
	mctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	_, err := sys.cl.Model(mctx, &codec.ModelControl{Action: "reload", Model: model})
	cancel()
	if err != nil {
		return fmt.Errorf("reload %s: %w", model, err)
	}
	return nil
}

// incrementalConfig is the incremental bench's system: the cache on, one batch pool of
// one worker serving the two taggers.
func incrementalConfig(h *harness, dirA, dirB string) sysConfig {
	w := h.w
	const pool = "bulk"
	return sysConfig{
		Images:   w.images,
		StoreDir: filepath.Join(w.dir, "jetstream"),
		Cache:    config.Cache{Enabled: true},
		Pools: []poolSpec{{Name: pool, Runtime: h.lib, Workers: 1, Slots: 1, Threads: 1,
			Classes: []string{subjects.ClassBatch}, Models: []string{"tagger-a", "tagger-b"}}},
		Classes: []classSpec{{Name: subjects.ClassBatch, Chain: []string{pool}, Timeout: 10 * time.Minute, QueueBound: 10_000}},
		Models: []modelSpec{{Name: "tagger-a", Kind: config.KindTaggerPixAI, Dir: dirA},
			{Name: "tagger-b", Kind: config.KindTaggerPixAI, Dir: dirB}},
	}
}

// reportIncremental prints the phases and the verdicts (k changed and k added of n), and
// records the targets.
func reportIncremental(out io.Writer, rep *Report, res *IncrementalResults, n, k int, changed, revA, revB *IncrementalRun) {
	fmt.Fprintf(out, "incremental: %d images, %s, 1 worker x 1 thread (ORT %s), [cache] on (max_bytes 1GiB)\n", n, res.Setup.Model, RuntimeVersion)
	var rows []string
	for _, r := range res.Phases {
		rows = append(rows, fmt.Sprintf("%s\t%s\t%d\t%d\t%d\t%d\t%.2f\t%.1f\t%d\t%d\t%.1f\t%.1f\t%.2f\t", r.Phase, r.Model, r.Items, r.Computed, r.Cached, r.Failed,
			r.ElapsedS, r.ItemsPerS, r.Stats, r.Hashed, r.StatMS, r.HashMS, float64(r.CacheBytes)/(1<<20)))
	}
	printTable(out, "phase\tmodel\titems\tcomputed\tcached\tfailed\telapsed s\titems/s\tstats\thashed\tstat ms\thash ms\tcache MiB\t", rows...)
	okSpeed := res.RescanSpeedup >= 50
	fmt.Fprintf(out, "rescan %.1fx faster than the first job (goal >= 50x): %s; changed rescan computed exactly the %d changed + %d added: %s; after the revision tagger-a recomputed all, tagger-b none: %s\n",
		res.RescanSpeedup, verdict(okSpeed), k, k, verdict(res.ChangedExact), verdict(res.RevisionExact))
	rep.target(okSpeed, "an unchanged rescan is %.1fx faster than the first job (goal >= 50x)", res.RescanSpeedup)
	rep.target(res.ChangedExact, "the changed rescan computed %d, cached %d (want %d and %d)", changed.Computed, changed.Cached, 2*k, n-k)
	rep.target(res.RevisionExact, "after the revision: tagger-a computed %d (want %d), tagger-b computed %d (want 0)", revA.Computed, n+k, revB.Computed)
}

// incrementalImage writes image i of the library, version v: a small PNG whose pixels
// encode i and v, so that every image (and version) has bytes of its own.
func incrementalImage(dir string, i, v int) error {
	img := image.NewNRGBA(image.Rect(0, 0, incrementalSide, incrementalSide))
	for y := range incrementalSide {
		for x := range incrementalSide {
			img.SetNRGBA(x, y, color.NRGBA{uint8(i), uint8(i >> 8), uint8(x*8 + v*97), 255})
		}
	}
	img.SetNRGBA(0, 0, color.NRGBA{uint8(i >> 16), uint8(v), 7, 255})
	var buf bytes.Buffer
	if err := png.Encode(&buf, img); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, fmt.Sprintf("img%06d.png", i)), buf.Bytes(), 0o644)
}

// incrementalJob submits an incremental tag job of model over dir, waits for it to
// finish, and reads its counts and the gateway's cache figures.
func incrementalJob(ctx context.Context, sys *system, id, phase, model, dir string) (*IncrementalRun, error) {
	before, err := sys.cl.CacheStats(ctx, "")
	if err != nil {
		return nil, err
	}
	start := time.Now()
	sctx, cancel := context.WithTimeout(ctx, time.Minute)
	sub, err := sys.cl.SubmitJob(sctx, &codec.JobSubmit{Job: id, Op: subjects.OpTag, Model: model, Dir: &codec.JobDir{Path: dir}, Incremental: true})
	cancel()
	if err != nil {
		return nil, err
	}
	var st *codec.JobStatus
	until := start.Add(jobBound)
	for {
		qctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		st, err = sys.cl.JobStatus(qctx, id)
		cancel()
		if err == nil && st.Finished() {
			break
		}
		if time.Now().After(until) {
			return nil, fmt.Errorf("job %s not finished within %v", id, jobBound)
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(100 * time.Millisecond): // the elapsed time is the job's own (below)
		}
	}
	if st.State != codec.JobDone {
		return nil, fmt.Errorf("job %s ended %s: %+v", id, st.State, st.Error)
	}
	// From the submit to the job's last result (the status's finish time, kept by
	// JetStream), not to the poll that saw it.
	elapsed := time.UnixMilli(st.FinishedUnixMS).Sub(start)
	if elapsed <= 0 {
		elapsed = time.Since(start)
	}
	after, err := sys.cl.CacheStats(ctx, "")
	if err != nil {
		return nil, err
	}
	return &IncrementalRun{Phase: phase, Model: model, Items: sub.Total, Computed: st.Computed, Cached: st.Cached, Failed: st.Failed,
		ElapsedS: round(elapsed.Seconds(), 3), ItemsPerS: round(perSecond(sub.Total, elapsed), 1),
		Stats: after.Stats - before.Stats, Hashed: after.Hashed - before.Hashed,
		StatMS: round(after.StatMS-before.StatMS, 1), HashMS: round(after.HashMS-before.HashMS, 1),
		CacheBytes: after.Bytes, Entries: after.Entries}, nil
}
