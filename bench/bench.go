// Package bench holds ortbus's benchmarks (`ortbus bench NAME`): each one starts what it
// needs itself — a gateway process with its embedded NATS server and its local worker
// processes, from a configuration it writes into a temporary directory, with absolute
// paths to the fetched ONNX Runtime libraries and to models it generates there — measures
// in one run, prints a table, returns a Report (written as JSON by the caller) and stops
// everything it started.
//
//	overhead    gateway path vs an in-process ORT call and vs one raw NATS request (tiny model)
//	throughput  batch class through the system vs an in-process loop, plain and dynamically batched,
//	            and onnxruntime-node (-ep webgpu: all on ONNX Runtime's WebGPU EP; webgpu.go)
//	collision   urgent + interactive + batch flood on pools sharing the CPU: solo, policy, FIFO
//	            (-scenario real: Silero VAD audio streams, the PP-OCRv4 detector, the tagger flood;
//	            -scenario gpu: the same on webgpu pools of one GPU with llama.cpp generating on it,
//	            gated and not, and the degrade run: gpucollision.go, llamatenant.go, degrade.go)
//	capacity    the load of the higher classes raised step by step under a constant batch flood,
//	            policy and FIFO, until a class misses its target (the knee)
//	failure     kill -9 of a loaded worker: time to answer what it held, lost requests, time to serve again
//	jobs        N items as plain batch requests vs as one durable job, undisturbed and with kill -9 of the whole stack
//	library     a generated photo/illustration library tagged and embedded as jobs, vs sharp +
//	            onnxruntime-node in one Bun process, with per-format preprocessing times (library.go)
//	lease       an urgent lease waiting behind a reclaimable one: the holder's memory free -> the grant (lease.go)
//
// A report's top level is {"bench": NAME, "machine": {...}, "results": {...}}; the
// results of each bench are documented on its result type and in docs/BENCHMARKS.md.
//
// The bench process loads at most one ONNX Runtime library (one runtime per process):
// overhead and throughput load ONNX Runtime 1.30.0 for their in-process baselines, and
// their workers run the same version in their own processes.
package bench

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"sort"
	"strings"
	"text/tabwriter"
	"time"
)

// Names are the benchmarks Run knows, in the order `ortbus bench` lists them.
var Names = []string{"overhead", "throughput", "collision", "capacity", "failure", "jobs", "incremental", "lease", "library", "profile"}

// RuntimeVersion is the ONNX Runtime version the benches' workers and in-process baselines
// use (fetched by `make prepare` into <repo>/.deps/ort-VERSION/lib).
const RuntimeVersion = "1.30.0"

// Options configure a bench run. The zero value runs a bench with its defaults, finding
// the repository and the binaries itself.
type Options struct {
	// Repo is the repository root (for .deps/); "" = the nearest directory holding go.mod
	// at or above the executable's directory, else at or above the working directory.
	Repo string
	// BinDir holds the gateway and ortworker binaries; "" = the executable's directory
	// when both are there, else <Repo>/bin.
	BinDir string
	// N is the iteration count (overhead: requests per path; jobs: items); 0 = the bench's
	// default.
	N int
	// Shrink divides the sides of the files the library bench generates (its tests: a small
	// library of the same kinds, fast to write and decode under the race detector); 0 or 1
	// = full size (12 MP photos, 2K illustrations).
	Shrink int
	// Duration is the measuring time (throughput: per path and model; failure: load before the
	// kill; collision: overrides the scenario's arrival window); 0 = the default.
	Duration time.Duration
	// InFlight is how many requests the client keeps outstanding (throughput, failure, the
	// plain path of jobs); 0 = the default.
	InFlight int
	// Workers and Threads, when set, are throughput's system pools' layout (workers per
	// pool, intra-op threads per worker; e.g. what ortbus tune chose), in place of one
	// worker with the model's threads. The in-process and node paths keep the model's.
	Workers, Threads int
	// EP is the execution provider of throughput's paths and of tune's layouts: "" or
	// "cpu" (the default), or "webgpu" (ONNX Runtime's WebGPU EP: the system's pools, the
	// in-process loop and onnxruntime-node alike; see webgpu.go).
	EP string
	// Device is the webgpu pools' device (cuda:N, drm:N, or cpu for lavapipe); "" = the
	// GPU findGPU finds. Without a GPU, throughput runs its smoke (see Smoke).
	Device string
	// Smoke runs throughput -ep webgpu's smoke row (the tiny model, short phases: a check
	// that the three paths run on webgpu, not a figure) even on a machine with a GPU;
	// without one it always does.
	Smoke bool
	// Scenario is the collision or capacity scenario: a TOML file, or a built-in one
	// (collision: "" = "default", "onepool", "short", "real", "real-short", "llm",
	// "llm-short", "gpu", "gpu-short"; capacity: "" = "capacity"; see LoadScenario).
	Scenario string
	// Seed, when not 0, replaces the scenario's seed (collision, capacity).
	Seed uint64
	// Steps, when set, replaces the capacity scenario's load steps: "STREAMS:RATE,..."
	// (e.g. "1:0.5,2:1,4:2").
	Steps string
	// Chart is where collision and capacity write their PNG chart ("" = none).
	Chart string
	// SkipSolo leaves out collision's solo runs (for quick checks of policy vs FIFO).
	SkipSolo bool
	// RelayReplies runs overhead's gateway with [gateway] relay_replies: every reply
	// through the gateway, as before replies went straight to the client.
	RelayReplies bool
	// Trace adds to overhead the gateway path of a second system that traces every
	// request (spans exported over OTLP/HTTP to a sink in the bench process), timed in the
	// same interleaved blocks as the untraced one (overhead_trace.go).
	Trace bool
	// Pages adds to overhead the gateway path of a second system with this many of the
	// gateway's pages open on its HTTP API, each reading its event stream, timed in the
	// same interleaved blocks (overhead_page.go); 0: none.
	Pages int
	// Out receives the printed tables (nil = discarded).
	Out io.Writer
	// Logs receives the gateway's and workers' stderr (nil = kept in a file in the
	// temporary directory and quoted in errors).
	Logs io.Writer
	// Kills is how many times the jobs bench kills the whole stack during its kill run
	// (0 = the default, 2; < 0 = none).
	Kills int
	// KeepTemp keeps the temporary directory (configs, models, images, logs).
	KeepTemp bool

	// pageIdle, when set, is overhead -pages's idle window in place of pageIdleWindow
	// (its test's shorter one).
	pageIdle time.Duration

	// startBound, when set, is how long a system may take to start (its gateway's ready
	// line, then its pools live) in place of startBound: the GPU scenarios' webgpu pools
	// set it (webgpuStartBound).
	startBound time.Duration
}

// Report is what a bench returns and what `ortbus bench NAME -out FILE` writes.
type Report struct {
	Bench   string  `json:"bench"`
	Machine Machine `json:"machine"`
	// Results is the bench's own result type: *OverheadResults, *ThroughputResults,
	// *CollisionResults, *CapacityResults, *FailureResults or *JobsResults.
	Results any `json:"results"`
	// Notes say what the run could not do as asked, and where a target was missed.
	Notes []string `json:"notes,omitempty"`
}

// Machine describes where a bench ran.
type Machine struct {
	Cores      int      `json:"cores"`
	GOMAXPROCS int      `json:"gomaxprocs"`
	CPUModel   string   `json:"cpu_model"`
	MemTotalMB int64    `json:"mem_total_mb,omitempty"`
	Kernel     string   `json:"kernel,omitempty"`
	OS         string   `json:"os"`
	Arch       string   `json:"arch"`
	GoVersion  string   `json:"go_version"`
	Hostname   string   `json:"hostname,omitempty"`
	Date       string   `json:"date"`
	Runtimes   Runtimes `json:"ort_versions"`
	// LoadAvg is the 1, 5 and 15 minute load averages (/proc/loadavg) when the bench
	// started and when it ended: other work on the machine skews the figures.
	LoadAvgStart string `json:"load_avg_start,omitempty"`
	LoadAvgEnd   string `json:"load_avg_end,omitempty"`
}

func loadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return ""
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return ""
	}
	return strings.Join(f[:3], " ")
}

// finish records the end of a bench.
func (r *Report) finish() { r.Machine.LoadAvgEnd = loadAvg() }

// Runtimes are the ONNX Runtime versions a bench ran: in its own process (in-process
// baselines) and in its workers (as the workers report them).
type Runtimes struct {
	BenchProcess string   `json:"bench_process,omitempty"`
	Workers      []string `json:"workers,omitempty"`
}

func (r *Runtimes) addWorker(v string) {
	if v != "" && !slices.Contains(r.Workers, v) {
		r.Workers = append(r.Workers, v)
		sort.Strings(r.Workers)
	}
}

// Run runs the bench called name.
func Run(ctx context.Context, name string, o Options) (*Report, error) {
	switch name {
	case "overhead":
		return Overhead(ctx, o)
	case "throughput":
		return Throughput(ctx, o)
	case "collision":
		return Collision(ctx, o)
	case "capacity":
		return Capacity(ctx, o)
	case "failure":
		return Failure(ctx, o)
	case "jobs":
		return Jobs(ctx, o)
	case "incremental":
		return Incremental(ctx, o)
	case "lease":
		return Lease(ctx, o)
	case "library":
		return Library(ctx, o)
	case "profile":
		return Profile(ctx, o)
	}
	return nil, fmt.Errorf("unknown bench %q (want one of %s)", name, strings.Join(Names, ", "))
}

// WriteJSON writes the report, indented, to path (creating its directory).
func (r *Report) WriteJSON(path string) error {
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	return os.WriteFile(path, append(b, '\n'), 0o644)
}

func (r *Report) note(format string, args ...any) {
	r.Notes = append(r.Notes, fmt.Sprintf(format, args...))
}

// newReport starts a report with the machine's description.
func newReport(name string) *Report {
	return &Report{Bench: name, Machine: describeMachine()}
}

func describeMachine() Machine {
	m := Machine{
		Cores: runtime.NumCPU(), GOMAXPROCS: runtime.GOMAXPROCS(0), OS: runtime.GOOS, Arch: runtime.GOARCH,
		GoVersion: runtime.Version(), Date: time.Now().UTC().Format(time.RFC3339),
	}
	m.Hostname, _ = os.Hostname()
	m.LoadAvgStart = loadAvg()
	if b, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		m.Kernel = strings.TrimSpace(string(b))
	}
	if f, err := os.Open("/proc/cpuinfo"); err == nil {
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			if k, v, ok := strings.Cut(sc.Text(), ":"); ok && strings.TrimSpace(k) == "model name" {
				m.CPUModel = strings.TrimSpace(v)
				break
			}
		}
		f.Close()
	}
	if f, err := os.Open("/proc/meminfo"); err == nil {
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			var kb int64
			if n, _ := fmt.Sscanf(sc.Text(), "MemTotal: %d kB", &kb); n == 1 {
				m.MemTotalMB = kb / 1024
				break
			}
		}
		f.Close()
	}
	return m
}

// out is where tables go.
func (o *Options) out() io.Writer {
	if o.Out == nil {
		return io.Discard
	}
	return o.Out
}

// resolve fills in Repo and BinDir.
func (o *Options) resolve() error {
	if o.Repo == "" {
		root, err := FindRepo()
		if err != nil {
			return err
		}
		o.Repo = root
	}
	abs, err := filepath.Abs(o.Repo)
	if err != nil {
		return err
	}
	o.Repo = abs
	if o.BinDir == "" {
		o.BinDir = filepath.Join(o.Repo, "bin")
		if self, err := os.Executable(); err == nil {
			d := filepath.Dir(self)
			if isFile(filepath.Join(d, "gateway")) && isFile(filepath.Join(d, "ortworker")) {
				o.BinDir = d
			}
		}
	}
	for _, b := range []string{"gateway", "ortworker"} {
		if !isFile(filepath.Join(o.BinDir, b)) {
			return fmt.Errorf("bench: %s is missing: run `make build` (or pass -bin DIR)", filepath.Join(o.BinDir, b))
		}
	}
	return nil
}

// FindRepo returns the nearest directory holding go.mod at or above the executable's
// directory, else at or above the working directory.
func FindRepo() (string, error) {
	var starts []string
	if self, err := os.Executable(); err == nil {
		if real, err := filepath.EvalSymlinks(self); err == nil {
			self = real
		}
		starts = append(starts, filepath.Dir(self))
	}
	if wd, err := os.Getwd(); err == nil {
		starts = append(starts, wd)
	}
	for _, s := range starts {
		for d := s; ; {
			if isFile(filepath.Join(d, "go.mod")) {
				return d, nil
			}
			parent := filepath.Dir(d)
			if parent == d {
				break
			}
			d = parent
		}
	}
	return "", fmt.Errorf("bench: no go.mod at or above %s: pass -repo DIR", strings.Join(starts, " or "))
}

// runtimeLib is the fetched library of version under the repository.
func (o *Options) runtimeLib(version string) (string, error) {
	p := filepath.Join(o.Repo, ".deps", "ort-"+version, "lib", "libonnxruntime.so.1")
	if !isFile(p) {
		return "", fmt.Errorf("bench: ONNX Runtime %s is not at %s: run `make prepare`", version, p)
	}
	return p, nil
}

func isFile(p string) bool {
	st, err := os.Stat(p)
	return err == nil && st.Mode().IsRegular()
}

// Summary holds the percentiles of a set of durations.
type Summary struct {
	N   int
	P50 time.Duration
	P95 time.Duration
	P99 time.Duration
	Max time.Duration
}

// summarize computes percentiles (nearest rank) of ds; it sorts ds.
func summarize(ds []time.Duration) Summary {
	if len(ds) == 0 {
		return Summary{}
	}
	slices.Sort(ds)
	return Summary{N: len(ds), P50: pct(ds, 50), P95: pct(ds, 95), P99: pct(ds, 99), Max: ds[len(ds)-1]}
}

// pct is the nearest-rank percentile of sorted ds.
func pct(sorted []time.Duration, p float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := int(math.Ceil(p/100*float64(len(sorted)))) - 1
	return sorted[min(max(i, 0), len(sorted)-1)]
}

func us(d time.Duration) float64 { return round(float64(d)/float64(time.Microsecond), 1) }
func ms(d time.Duration) float64 { return round(float64(d)/float64(time.Millisecond), 2) }

func round(v float64, places int) float64 {
	p := math.Pow(10, float64(places))
	return math.Round(v*p) / p
}

// ratio is a/b rounded, or 0 when b is 0.
func ratio(a, b float64) float64 {
	if b == 0 {
		return 0
	}
	return round(a/b, 3)
}

// table starts a tab-aligned table on w.
func table(w io.Writer) *tabwriter.Writer { return tabwriter.NewWriter(w, 2, 0, 2, ' ', 0) }

// verdict is "ok" or "MISSED" for a target.
func verdict(ok bool) string {
	if ok {
		return "ok"
	}
	return "MISSED"
}
