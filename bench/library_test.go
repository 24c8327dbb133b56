package bench

import (
	"bytes"
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ortbus/ortbus/internal/testkit/testenv"
)

// TestLibraryPlan: the default library holds every kind, the EXIF-rotated photo among
// them, names unique, and the same plan every time.
func TestLibraryPlan(t *testing.T) {
	files := libraryPlan(LibraryFiles)
	if len(files) != LibraryFiles {
		t.Fatalf("%d files, want %d", len(files), LibraryFiles)
	}
	seen := map[string]bool{}
	names := map[string]bool{}
	for _, f := range files {
		seen[f.Kind] = true
		if names[f.Name] {
			t.Errorf("name %s twice", f.Name)
		}
		names[f.Name] = true
		if f.Kind == "jpeg-12mp-exif6" && (f.Orientation != 6 || f.Width != 4032 || f.Height != 3024) {
			t.Errorf("%+v: want a 4032x3024 photo with orientation 6", f)
		}
	}
	for _, k := range libraryKinds {
		if !seen[k.Name] {
			t.Errorf("kind %s not in a library of %d", k.Name, LibraryFiles)
		}
	}
	if !slices.Equal(files, libraryPlan(LibraryFiles)) {
		t.Error("two plans differ")
	}
	a, b := libraryPixels(kindNamed("gif"), 3, 1), libraryPixels(kindNamed("gif"), 3, 1)
	if !bytes.Equal(a, b) || bytes.Equal(a, libraryPixels(kindNamed("gif"), 3, 2)) {
		t.Error("pixels: want the same for one seed and different for another")
	}
}

// TestLibraryReport: the ratios come from the measured figures, the table prints them
// with the verdicts, and check refuses a run where a file was not answered, failed, was
// left out, or failed under sharp.
func TestLibraryReport(t *testing.T) {
	files := libraryPlan(3)
	ms := func(v ...float64) []time.Duration {
		var d []time.Duration
		for _, x := range v {
			d = append(d, time.Duration(x*float64(time.Millisecond)))
		}
		return d
	}
	kind := func(i int) string { return files[i].Kind }
	vipsT := map[string][]time.Duration{kind(0): ms(70, 80), kind(1): ms(80), kind(2): ms(30)}
	sharpT := map[string][]time.Duration{kind(0): ms(50, 55), kind(1): ms(90), kind(2): ms(40)}
	goT := map[string][]time.Duration{kind(0): ms(900)}
	res := &LibraryResults{Files: files, ModelWait: "needs a GPU",
		System: LibrarySystem{Items: 6, ItemsPerS: 6, Jobs: []LibraryJob{
			{Op: "tag", Total: 3, Done: 3, Results: 3}, {Op: "embed", Total: 3, Done: 3, Results: 3}}},
		Sharp: &LibrarySharp{Items: 6, ItemsPerS: 4}}
	res.Prep = libraryPrepTable(files, vipsT, sharpT, goT, map[string]int{kind(2): 1})
	res.ratios()
	if res.Ratios.SystemOverSharp != 1.5 {
		t.Errorf("system over sharp %v, want 1.5", res.Ratios.SystemOverSharp)
	}
	if res.Prep[0].Kind != libraryPhotoKind || res.Ratios.PhotoPrepOverSharp != ratio(70, 50) {
		t.Errorf("photo ratio %v (prep %+v), want p50 70/50", res.Ratios.PhotoPrepOverSharp, res.Prep[0])
	}
	if res.Prep[2].Go != nil || res.Prep[2].GoFailed != 1 {
		t.Errorf("%+v: want the Go path's failure counted", res.Prep[2])
	}
	if err := res.check(3); err != nil {
		t.Fatal(err)
	}
	rep := newReport("library")
	var out bytes.Buffer
	reportLibrary(&out, rep, res)
	for _, want := range []string{"1.500 (target >= 1.1: ok)", "1.400 (target <= 1.2: MISSED)", "cannot decode", "needs a GPU"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("report lacks %q:\n%s", want, out.String())
		}
	}
	if len(rep.Notes) != 1 {
		t.Errorf("notes %q, want the missed preprocessing target", rep.Notes)
	}

	for name, spoil := range map[string]func(r *LibraryResults){
		"failed":  func(r *LibraryResults) { r.System.Jobs[0].Failed, r.System.Jobs[0].Done = 1, 2 },
		"skipped": func(r *LibraryResults) { r.System.Jobs[1].SkippedTotal = 1 },
		"results": func(r *LibraryResults) { r.System.Jobs[1].Results = 2 },
		"sharp":   func(r *LibraryResults) { r.Sharp.Errors = []librarySharpErr{{Path: "x", Error: "y"}} },
	} {
		bad := *res
		bad.System.Jobs = slices.Clone(res.System.Jobs)
		sh := *res.Sharp
		bad.Sharp = &sh
		spoil(&bad)
		if err := bad.check(3); err == nil {
			t.Errorf("%s: check passed", name)
		}
	}
}

// TestLibrarySmall runs the bench on a library of 6 files (the two 12 MP photos, PNG, WebP,
// AVIF, CMYK) and checks that every file was answered by both jobs and by sharp (the
// bench's own check) and that the ratios were computed; not their values (timings on a
// shared machine).
func TestLibrarySmall(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a gateway with 2 workers and a Bun process; skipped with -short")
	}
	root := testenv.RepoRoot(t)
	testenv.RuntimeLib(t, RuntimeVersion)
	if _, err := findNodeBench(&Options{Repo: root}); errors.Is(err, errNodeBenchMissing) {
		testenv.Unavailable(t, err.Error()) // a go test run without `make node-bench` (make test installs it)
	}
	bin := buildSystem(t, root)
	ctx, cancel := context.WithTimeout(t.Context(), 4*time.Minute)
	defer cancel()
	var table bytes.Buffer
	// The files a quarter of their sides (a 12 MP photo as 1008x756): the same kinds and
	// paths through the bench, at a cost the race detector's Go reference decode allows.
	rep, err := Library(ctx, Options{Repo: root, BinDir: bin, N: 6, Shrink: 4, Out: &table})
	t.Logf("library, 6 files (load average %s):\n%s", loadAvg(), table.String())
	if err != nil {
		t.Fatal(err)
	}
	res := rep.Results.(*LibraryResults)
	if len(res.System.Jobs) != 2 || res.System.Items != 12 || res.Sharp == nil || res.Sharp.Items != 12 {
		t.Fatalf("system %+v, sharp %+v: want 12 items each", res.System, res.Sharp)
	}
	for _, j := range res.System.Jobs {
		if j.Done != 6 || j.Results != 6 || j.Failed != 0 || j.SkippedTotal != 0 {
			t.Errorf("job %s: %+v", j.Op, j)
		}
	}
	if res.Ratios.SystemOverSharp <= 0 || res.Ratios.PhotoPrepOverSharp <= 0 || res.System.CPUPercent <= 0 {
		t.Errorf("ratios %+v, CPU %v: want them computed", res.Ratios, res.System.CPUPercent)
	}
	if len(res.Prep) != 6 {
		t.Errorf("%d preprocessing rows, want one per kind (6)", len(res.Prep))
	}
	for _, p := range res.Prep {
		if p.Vips == nil || p.Sharp == nil {
			t.Errorf("%s: libvips %v, sharp %v: want both timed", p.Kind, p.Vips, p.Sharp)
		}
	}
}
