package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"image/color"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"golang.org/x/image/draw"

	"github.com/ortbus/ortbus/codec"
	"github.com/ortbus/ortbus/config"
	"github.com/ortbus/ortbus/images"
	"github.com/ortbus/ortbus/images/vips"
	"github.com/ortbus/ortbus/models/onnxgen"
	"github.com/ortbus/ortbus/subjects"
)

// The library bench (`ortbus bench library`): a generated library (librarygen.go) tagged,
// then embedded, three ways in one run:
//
//	system   two jobs (tag, then embed) of the library's directory through the gateway and
//	         2 workers x 1 intra-op thread, result cache off
//	sharp    the Bun user's alternative: sharp + onnxruntime-node in one Bun process
//	         (bench/node/library.mjs), the same model files, 2 files in flight, sharp on 1
//	         thread
//	go       the previous Go decode path (images.Policy.Reference), preprocessing only
//
// and it times each file's preprocessing for the tagger (the file read, the decode at the
// model's size, the normalised tensor) one at a time: libvips path and Go path in this
// process (libvips on 1 thread), sharp in the Bun process.

// Library bench settings.
const (
	libraryWorkers  = 2
	libraryInFlight = 2
	libraryPrepReps = 3
	// LibraryJobRatioTarget and LibraryPrepRatioTarget are issue 40's acceptance: the job
	// >= 1.1x sharp + onnxruntime-node's items/s; a 12 MP JPEG's preprocessing <= 1.2x
	// sharp's at one thread.
	LibraryJobRatioTarget  = 1.1
	LibraryPrepRatioTarget = 1.2
	libraryPhotoKind       = "jpeg-12mp"
)

// LibraryResults are the results of `bench library`.
type LibraryResults struct {
	Files  []LibraryFile `json:"files"`
	GenS   float64       `json:"generate_s"`
	System LibrarySystem `json:"system"`
	Sharp  *LibrarySharp `json:"sharp_onnxruntime_node,omitempty"`
	Prep   []LibraryPrep `json:"prep"`
	Ratios LibraryRatios `json:"ratios"`
	// ModelWait is the share of time the model waited for its input: measured on a GPU
	// only ("needs a GPU" here).
	ModelWait string       `json:"model_wait"`
	Setup     LibrarySetup `json:"setup"`
}

// LibrarySystem is the two jobs through the system.
type LibrarySystem struct {
	Items     int          `json:"items"`
	ItemsPerS float64      `json:"items_per_s"`
	ElapsedS  float64      `json:"elapsed_s"`
	Jobs      []LibraryJob `json:"jobs"`
	// CPUPercent is the gateway's and workers' CPU time over the elapsed time (100 = one core).
	CPUPercent float64 `json:"cpu_percent"`
	// From the results' timings: the worker's time per item (total - queue) and the model's
	// part of it (infer); the rest is preprocessing and the reply.
	WorkerMSMean float64 `json:"worker_ms_mean"`
	InferMSMean  float64 `json:"infer_ms_mean"`
}

// LibraryJob is one job of the library's directory.
type LibraryJob struct {
	Op        string  `json:"op"`
	Job       string  `json:"job"`
	Total     int     `json:"total"`
	Results   int     `json:"results"`
	Done      int     `json:"done"`
	Failed    int     `json:"failed"`
	ElapsedS  float64 `json:"elapsed_s"`
	ItemsPerS float64 `json:"items_per_s"`
	// Skipped are the library's files the submit left out, each with its reason.
	Skipped      []codec.JobSkip `json:"skipped,omitempty"`
	SkippedTotal int             `json:"skipped_total"`
	// Errors are the failed results by code.
	Errors       map[string]int `json:"errors,omitempty"`
	workerSum    time.Duration
	inferSum     time.Duration
	timedResults int
}

// LibrarySharp is the sharp + onnxruntime-node process.
type LibrarySharp struct {
	Items      int               `json:"items"`
	ItemsPerS  float64           `json:"items_per_s"`
	ElapsedS   float64           `json:"elapsed_s"`
	CPUPercent float64           `json:"cpu_percent"`
	Errors     []librarySharpErr `json:"errors,omitempty"`
	Runtime    string            `json:"runtime"`
	Sharp      string            `json:"sharp"`
	Vips       string            `json:"vips"`
	ORTNode    string            `json:"onnxruntime_node"`
}

type librarySharpErr struct {
	Path  string `json:"path"`
	Error string `json:"error"`
}

// LibraryPrep is one kind's preprocessing for the tagger, per file, one at a time:
// milliseconds p50 and p95 over its files x reps, each path's (nil: no run; GoFailed: the
// files the Go path cannot decode).
type LibraryPrep struct {
	Kind     string      `json:"kind"`
	Files    int         `json:"files"`
	Vips     *LatencySum `json:"libvips"`
	Sharp    *LatencySum `json:"sharp,omitempty"`
	Go       *LatencySum `json:"go,omitempty"`
	GoFailed int         `json:"go_failed,omitempty"`
	// VipsOverSharp is libvips's p50 over sharp's.
	VipsOverSharp float64 `json:"libvips_over_sharp,omitempty"`
}

// LatencySum is p50 and p95 in milliseconds.
type LatencySum struct {
	N   int     `json:"n"`
	P50 float64 `json:"p50_ms"`
	P95 float64 `json:"p95_ms"`
}

// LibraryRatios are the acceptance ratios (0: not measured).
type LibraryRatios struct {
	// SystemOverSharp is the system's items/s over sharp + onnxruntime-node's (target >= 1.1).
	SystemOverSharp float64 `json:"system_over_sharp"`
	// PhotoPrepOverSharp is a 12 MP JPEG's preprocessing p50, libvips path over sharp
	// (target <= 1.2).
	PhotoPrepOverSharp float64 `json:"jpeg_12mp_prep_libvips_over_sharp"`
}

// LibrarySetup is how the bench ran.
type LibrarySetup struct {
	Models   string `json:"models"`
	Workers  int    `json:"workers"`
	Threads  int    `json:"threads"`
	InFlight int    `json:"sharp_in_flight"`
	PrepReps int    `json:"prep_reps"`
	Cache    string `json:"cache"`
	// Malloc is how this process's allocator was set for its preprocessing runs: as the
	// workers set theirs (vips.TuneMalloc), less the huge pages they start again with.
	Malloc string `json:"malloc"`
}

func latencySum(ds []time.Duration) *LatencySum {
	if len(ds) == 0 {
		return nil
	}
	s := summarize(ds)
	return &LatencySum{N: s.N, P50: ms(s.P50), P95: ms(s.P95)}
}

// Library runs the library bench; o.N is the library's size (default LibraryFiles).
func Library(ctx context.Context, o Options) (*Report, error) {
	if err := o.resolve(); err != nil {
		return nil, err
	}
	n := positiveOr(o.N, LibraryFiles)
	h, err := newHarness(&o, "library", 0)
	if err != nil {
		return nil, err
	}
	defer h.close()
	rep, w := h.rep, h.w
	malloc := vips.TuneMalloc() // the workers' allocator (not their huge pages), for the preprocessing timed here
	lib, err := vips.Default()
	if err != nil {
		return nil, fmt.Errorf("libvips: %w", err)
	}
	res := &LibraryResults{ModelWait: "needs a GPU", Setup: LibrarySetup{
		Models:  fmt.Sprintf("onnxgen tagger (%d px) and CCIP (%d px)", onnxgen.TaggerSize, onnxgen.CCIPSize),
		Workers: libraryWorkers, Threads: 1, InFlight: libraryInFlight, PrepReps: libraryPrepReps, Cache: "off", Malloc: malloc}}
	rep.Results = res

	dir := filepath.Join(w.images, "library")
	t0 := time.Now()
	res.Files = libraryPlan(n)
	if o.Shrink > 1 {
		for i := range res.Files {
			res.Files[i].Width, res.Files[i].Height = max(16, res.Files[i].Width/o.Shrink), max(16, res.Files[i].Height/o.Shrink)
		}
	}
	if err := writeLibraryFiles(lib, dir, res.Files); err != nil {
		return nil, err
	}
	res.GenS = round(time.Since(t0).Seconds(), 2)
	fmt.Fprintf(o.out(), "library: %d files generated in %.1fs\n", n, res.GenS)

	// 1. The system: tag, then embed.
	sys, err := h.startSystem(ctx, "library", libraryConfig(h))
	if err != nil {
		return nil, err
	}
	err = res.System.run(ctx, sys, dir, n)
	sys.stop()
	if err != nil {
		return nil, err
	}

	// 2. sharp + onnxruntime-node.
	sharpPrep := map[string][]time.Duration{}
	if nb, err := findNodeBench(&o); err != nil {
		rep.note("sharp + onnxruntime-node not run: %v", err)
	} else if res.Sharp, sharpPrep, err = runLibrarySharp(ctx, nb, w, res.Files); err != nil {
		return nil, err
	}

	// 3. Preprocessing, one file at a time: libvips path and Go path.
	vipsPrep, goPrep, goFailed := libraryPrepGo(w.images, res.Files)
	res.Prep = libraryPrepTable(res.Files, vipsPrep, sharpPrep, goPrep, goFailed)
	res.ratios()
	if err := res.check(n); err != nil {
		return nil, err
	}
	reportLibrary(o.out(), rep, res)
	return rep, nil
}

// libraryConfig is one batch pool of 2 workers x 1 thread serving the tagger and CCIP, the
// job store on, the result cache off.
func libraryConfig(h *harness) sysConfig {
	w := h.w
	const pool = "bulk"
	return sysConfig{
		Images:   w.images,
		StoreDir: filepath.Join(w.dir, "jetstream"),
		Pools: []poolSpec{{Name: pool, Runtime: h.lib, Workers: libraryWorkers, Slots: 1, Threads: 1,
			Classes: []string{subjects.ClassBatch}, Models: []string{"tagger", "ccip"}}},
		Classes: []classSpec{{Name: subjects.ClassBatch, Chain: []string{pool}, Timeout: 30 * time.Minute, QueueBound: 10_000}},
		Models: []modelSpec{
			{Name: "tagger", Kind: config.KindTaggerPixAI, Dir: filepath.Join(w.models, onnxgen.TaggerDir)},
			{Name: "ccip", Kind: config.KindCCIP, Dir: filepath.Join(w.models, onnxgen.CCIPDir)},
		},
	}
}

// run submits the library's directory as a tag job, waits for it, then as an embed job.
func (s *LibrarySystem) run(ctx context.Context, sys *system, dir string, n int) error {
	cpu0 := groupCPU(sys.gw.PID())
	t0 := time.Now()
	for _, op := range []struct{ op, model string }{{subjects.OpTag, "tagger"}, {subjects.OpEmbed, "ccip"}} {
		j, err := libraryJob(ctx, sys, dir, op.op, op.model)
		if err != nil {
			return err
		}
		s.Jobs = append(s.Jobs, *j)
	}
	el := time.Since(t0)
	cpu := groupCPU(sys.gw.PID()) - cpu0
	var worker, infer time.Duration
	var timed int
	for _, j := range s.Jobs {
		s.Items += j.Done
		worker += j.workerSum
		infer += j.inferSum
		timed += j.timedResults
	}
	s.ElapsedS = round(el.Seconds(), 3)
	s.ItemsPerS = perSecond(s.Items, el)
	s.CPUPercent = round(100*cpu.Seconds()/el.Seconds(), 1)
	if timed > 0 {
		s.WorkerMSMean, s.InferMSMean = ms(worker/time.Duration(timed)), ms(infer/time.Duration(timed))
	}
	return nil
}

// libraryJob runs one job of the directory and reads back its results.
func libraryJob(ctx context.Context, sys *system, dir, op, model string) (*LibraryJob, error) {
	id := "library-" + op
	j := &LibraryJob{Op: op, Job: id, Errors: map[string]int{}}
	t0 := time.Now()
	sctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	sub, err := sys.cl.SubmitJob(sctx, &codec.JobSubmit{Job: id, Op: op, Model: model, Class: subjects.ClassBatch, Dir: &codec.JobDir{Path: dir}})
	cancel()
	if err != nil {
		return nil, fmt.Errorf("%s job: submit: %w", op, err)
	}
	j.Total, j.Skipped, j.SkippedTotal = sub.Total, sub.Skipped, sub.SkippedTotal
	until := time.Now().Add(jobBound)
	var st *codec.JobStatus
	for {
		sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		st, err = sys.cl.JobStatus(sctx, id)
		cancel()
		if err == nil && st.Finished() {
			break
		}
		if time.Now().After(until) {
			return nil, fmt.Errorf("%s job not finished within %v", op, jobBound)
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
	end := time.UnixMilli(st.FinishedUnixMS)
	j.Done, j.Failed = st.Done, st.Failed
	j.ElapsedS = round(end.Sub(t0).Seconds(), 3)
	j.ItemsPerS = perSecond(j.Done, end.Sub(t0))
	rctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	err = sys.cl.EachJobResult(rctx, id, func(r *codec.JobResult) error {
		j.Results++
		if r.Error != nil {
			j.Errors[string(r.Error.Code)]++
			return nil
		}
		var t codec.Timing
		switch v := r.Result.(type) {
		case *codec.TagReply:
			t = v.Timing
		case *codec.EmbedReply:
			t = v.Timing
		default:
			j.Errors["unexpected_reply"]++
			return nil
		}
		j.timedResults++
		j.workerSum += time.Duration(max(0, t.TotalUS-t.QueueUS)) * time.Microsecond
		j.inferSum += time.Duration(t.InferUS) * time.Microsecond
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("%s job: results: %w", op, err)
	}
	if len(j.Errors) == 0 {
		j.Errors = nil
	}
	return j, nil
}

// groupCPU is the CPU time (user + system) of the processes of process group pgid.
func groupCPU(pgid int) time.Duration {
	ents, _ := os.ReadDir("/proc")
	var ticks int64
	for _, e := range ents {
		if _, err := strconv.Atoi(e.Name()); err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue
		}
		// Fields after the command's closing parenthesis: state(3) ppid pgrp ... utime(14) stime(15).
		k := bytes.LastIndexByte(b, ')')
		if k < 0 {
			continue
		}
		f := strings.Fields(string(b[k+1:]))
		if len(f) < 13 {
			continue
		}
		if pg, _ := strconv.Atoi(f[2]); pg != pgid {
			continue
		}
		u, _ := strconv.ParseInt(f[11], 10, 64)
		s, _ := strconv.ParseInt(f[12], 10, 64)
		ticks += u + s
	}
	return time.Duration(ticks) * (time.Second / 100) // USER_HZ
}

// librarySharpOut is library.mjs's line.
type librarySharpOut struct {
	Items   int               `json:"items"`
	Errors  []librarySharpErr `json:"errors"`
	Seconds float64           `json:"seconds"`
	CPUS    float64           `json:"cpu_s"`
	Prep    []struct {
		Path string    `json:"path"`
		MS   []float64 `json:"ms"`
	} `json:"prep"`
	Runtime string `json:"runtime"`
	Sharp   string `json:"sharp"`
	Vips    string `json:"vips"`
	ORTNode string `json:"onnxruntime_node"`
}

// runLibrarySharp runs bench/node/library.mjs under Bun on the library; it returns the
// run and each kind's preprocessing times.
func runLibrarySharp(ctx context.Context, nb *nodeBench, w *workdir, files []LibraryFile) (*LibrarySharp, map[string][]time.Duration, error) {
	var list strings.Builder
	kindOf := map[string]string{}
	for _, f := range files {
		list.WriteString(f.path + "\n")
		kindOf[f.path] = f.Kind
	}
	lp := filepath.Join(w.dir, "library-files.txt")
	if err := os.WriteFile(lp, []byte(list.String()), 0o644); err != nil {
		return nil, nil, err
	}
	script := filepath.Join(filepath.Dir(nb.script), "library.mjs")
	args := []string{script, "-modules", nb.modules, "-list", lp,
		"-tagger", filepath.Join(w.models, onnxgen.TaggerDir, onnxgen.ModelFile), "-tagger-size", fmt.Sprint(onnxgen.TaggerSize),
		"-ccip", filepath.Join(w.models, onnxgen.CCIPDir, onnxgen.CCIPFeatFile), "-ccip-size", fmt.Sprint(onnxgen.CCIPSize),
		"-inflight", fmt.Sprint(libraryInFlight), "-threads", "1", "-prep-reps", fmt.Sprint(libraryPrepReps)}
	cctx, cancel := context.WithTimeout(ctx, 30*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(cctx, nb.bun, args...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return nil, nil, fmt.Errorf("bun library.mjs: %v: %s", err, lastLines(stderr.String(), 5))
	}
	var out librarySharpOut
	if err := json.Unmarshal([]byte(lastLines(stdout.String(), 1)), &out); err != nil || out.Seconds <= 0 {
		return nil, nil, fmt.Errorf("bun library.mjs printed %q (%v)", lastLines(stdout.String(), 3), err)
	}
	r := &LibrarySharp{Items: out.Items, ItemsPerS: round(float64(out.Items)/out.Seconds, 2), ElapsedS: round(out.Seconds, 3),
		CPUPercent: round(100*out.CPUS/out.Seconds, 1), Errors: out.Errors, Runtime: out.Runtime, Sharp: out.Sharp, Vips: out.Vips, ORTNode: out.ORTNode}
	prep := map[string][]time.Duration{}
	for _, p := range out.Prep {
		for _, v := range p.MS {
			prep[kindOf[p.Path]] = append(prep[kindOf[p.Path]], time.Duration(v*float64(time.Millisecond)))
		}
	}
	return r, prep, nil
}

// libraryPrepGo times the tagger's preprocessing of every file, one at a time, reps times:
// the libvips path (images.Policy.Load, as models/tagger.go calls it) and the Go path
// (Policy.Reference: Go's decoders, the whole image, then the resize in Go).
func libraryPrepGo(root string, files []LibraryFile) (vipsT, goT map[string][]time.Duration, goFailed map[string]int) {
	vipsT, goT, goFailed = map[string][]time.Duration{}, map[string][]time.Duration{}, map[string]int{}
	pol := images.Policy{AllowedRoots: []string{root}}
	ref := pol
	ref.Reference = true
	size := onnxgen.TaggerSize
	spec := images.LoadSpec{Width: size, Height: size, Fill: images.FillForce, Background: images.WhiteRGBA}
	px := make([]float32, 3*size*size)
	prep := func(p images.Policy, path string) error {
		img, _, err := p.Load(path, spec)
		if err != nil {
			return err
		}
		images.ToCHW(images.Resize(images.FlattenOn(img, color.White), size, size, draw.BiLinear), px, images.HalfMean, images.HalfStd, images.Scale255, false)
		return nil
	}
	for range libraryPrepReps {
		for _, f := range files {
			t0 := time.Now()
			if err := prep(pol, f.path); err == nil {
				vipsT[f.Kind] = append(vipsT[f.Kind], time.Since(t0))
			}
			t0 = time.Now()
			if err := prep(ref, f.path); err == nil {
				goT[f.Kind] = append(goT[f.Kind], time.Since(t0))
			} else {
				goFailed[f.Kind]++
			}
		}
	}
	for k := range goFailed {
		goFailed[k] /= libraryPrepReps
	}
	return vipsT, goT, goFailed
}

// libraryPrepTable is the per-kind table, in the library's kind order.
func libraryPrepTable(files []LibraryFile, vipsT, sharpT, goT map[string][]time.Duration, goFailed map[string]int) []LibraryPrep {
	var rows []LibraryPrep
	for _, f := range files {
		if slices.ContainsFunc(rows, func(r LibraryPrep) bool { return r.Kind == f.Kind }) {
			for i := range rows {
				if rows[i].Kind == f.Kind {
					rows[i].Files++
				}
			}
			continue
		}
		rows = append(rows, LibraryPrep{Kind: f.Kind, Files: 1})
	}
	for i := range rows {
		r := &rows[i]
		r.Vips, r.Sharp, r.Go, r.GoFailed = latencySum(vipsT[r.Kind]), latencySum(sharpT[r.Kind]), latencySum(goT[r.Kind]), goFailed[r.Kind]
		if r.Vips != nil && r.Sharp != nil {
			r.VipsOverSharp = ratio(r.Vips.P50, r.Sharp.P50)
		}
	}
	return rows
}

// ratios computes the acceptance ratios from what was measured.
func (res *LibraryResults) ratios() {
	if res.Sharp != nil {
		res.Ratios.SystemOverSharp = ratio(res.System.ItemsPerS, res.Sharp.ItemsPerS)
	}
	for _, r := range res.Prep {
		if r.Kind == libraryPhotoKind {
			res.Ratios.PhotoPrepOverSharp = r.VipsOverSharp
		}
	}
}

// check is the bench's own assertion: every file of the library answered by each job and
// by sharp, none failed, and nothing left out of a job.
func (res *LibraryResults) check(n int) error {
	var errs []string
	for _, j := range res.System.Jobs {
		if j.Total != n || j.Done != n || j.Failed != 0 || j.Results != n || j.SkippedTotal != 0 {
			errs = append(errs, fmt.Sprintf("%s job: %d items of %d files, %d done, %d failed, %d results, errors %v, skipped %d: %v",
				j.Op, j.Total, n, j.Done, j.Failed, j.Results, j.Errors, j.SkippedTotal, j.Skipped))
		}
	}
	if s := res.Sharp; s != nil && (s.Items != 2*n || len(s.Errors) > 0) {
		errs = append(errs, fmt.Sprintf("sharp + onnxruntime-node: %d items of %d, errors %v", s.Items, 2*n, s.Errors))
	}
	if len(errs) > 0 {
		return fmt.Errorf("library: not every file answered: %s", strings.Join(errs, "; "))
	}
	return nil
}

// reportLibrary prints the tables and records the targets.
func reportLibrary(out io.Writer, rep *Report, res *LibraryResults) {
	kinds := map[string]int{}
	var bytes int
	for _, f := range res.Files {
		kinds[f.Kind]++
		bytes += f.Bytes
	}
	fmt.Fprintf(out, "library: %d files, %.1f MB, %d kinds; system: %d workers x 1 thread (ORT %s), cache off; sharp: %d files in flight, 1 thread\n",
		len(res.Files), float64(bytes)/1e6, len(kinds), libraryWorkers, RuntimeVersion, libraryInFlight)
	s := res.System
	rows := []string{fmt.Sprintf("system (job tag, then job embed)\t%d\t%.2f\t%.2f\t%.0f\t%.1f\t%.2f\t", s.Items, s.ItemsPerS, s.ElapsedS, s.CPUPercent, s.WorkerMSMean, s.InferMSMean)}
	if sh := res.Sharp; sh != nil {
		rows = append(rows, fmt.Sprintf("sharp + onnxruntime-node (%s, sharp %s)\t%d\t%.2f\t%.2f\t%.0f\t\t\t", sh.Runtime, sh.Sharp, sh.Items, sh.ItemsPerS, sh.ElapsedS, sh.CPUPercent))
	}
	printTable(out, "path\titems\titems/s\telapsed s\tCPU %\tworker ms/item\tinfer ms/item\t", rows...)
	for _, j := range s.Jobs {
		fmt.Fprintf(out, "job %s: %d items, %d done, %d failed, %.2f items/s, skipped %d%s\n", j.Op, j.Total, j.Done, j.Failed, j.ItemsPerS, j.SkippedTotal, skippedList(j.Skipped))
	}
	ls := func(l *LatencySum) string {
		if l == nil {
			return "-\t-"
		}
		return fmt.Sprintf("%.1f\t%.1f", l.P50, l.P95)
	}
	var prows []string
	for _, r := range res.Prep {
		g := ls(r.Go)
		if r.GoFailed > 0 && r.Go == nil {
			g = fmt.Sprintf("cannot decode\t(%d files)", r.GoFailed)
		}
		prows = append(prows, fmt.Sprintf("%s\t%d\t%s\t%s\t%s\t%.2f\t", r.Kind, r.Files, ls(r.Vips), ls(r.Sharp), g, r.VipsOverSharp))
	}
	fmt.Fprintln(out, "preprocessing for the tagger, one file at a time, ms:")
	printTable(out, "kind\tfiles\tlibvips p50\tp95\tsharp p50\tp95\tgo p50\tp95\tlibvips/sharp\t", prows...)
	fmt.Fprintf(out, "model waited for input: %s\n", res.ModelWait)
	if res.Sharp == nil {
		return
	}
	okJob := res.Ratios.SystemOverSharp >= LibraryJobRatioTarget
	okPrep := res.Ratios.PhotoPrepOverSharp > 0 && res.Ratios.PhotoPrepOverSharp <= LibraryPrepRatioTarget
	fmt.Fprintf(out, "system / sharp+onnxruntime-node items/s: %.3f (target >= %.1f: %s); 12 MP JPEG preprocessing libvips / sharp: %.3f (target <= %.1f: %s)\n",
		res.Ratios.SystemOverSharp, LibraryJobRatioTarget, verdict(okJob), res.Ratios.PhotoPrepOverSharp, LibraryPrepRatioTarget, verdict(okPrep))
	rep.target(okJob, "the library job is %.3fx sharp + onnxruntime-node's items/s (target >= %.1fx)", res.Ratios.SystemOverSharp, LibraryJobRatioTarget)
	rep.target(okPrep, "a 12 MP JPEG's preprocessing is %.3fx sharp's (target <= %.1fx)", res.Ratios.PhotoPrepOverSharp, LibraryPrepRatioTarget)
}

func skippedList(s []codec.JobSkip) string {
	if len(s) == 0 {
		return ""
	}
	var b strings.Builder
	b.WriteString(":")
	for _, k := range s {
		fmt.Fprintf(&b, " %s (%s)", k.Path, k.Reason)
	}
	return b.String()
}
