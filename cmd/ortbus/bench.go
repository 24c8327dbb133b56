package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/ortbus/ortbus/bench"
)

const benchUsage = `usage: ortbus bench NAME [flags]
  NAME: overhead | throughput | collision | capacity | failure | jobs | incremental | lease | library | profile
  -out FILE.json   write the JSON report here (default <repo>/bench-out/NAME.json)
  -n N             overhead: timed calls per path (default 3000); jobs: items (default 10000);
                   lease: rounds (default 10)
  -duration D      throughput: measured time per path (default 8s); failure: load before the kill
                   (default 2s); collision, profile: overrides the scenario's arrival window; capacity:
                   overrides each step's window
  -files N         library: the generated library's size (default 40: 12 MP phone JPEGs, some
                   EXIF-rotated, 2K PNG/WebP/AVIF, CMYK, 16-bit, gray, progressive, TIFF, GIF)
  -inflight N      throughput, failure, jobs (plain path): requests kept outstanding (default 32, 8, 32)
  -workers N, -threads N   throughput: the system pools' layout (e.g. what ortbus tune chose), in
                   place of one worker with each model's threads
  -ep EP           throughput: cpu (default) or webgpu: ONNX Runtime's WebGPU EP on every path
                   (the system's pools, the in-process loop, onnxruntime-node), side by side;
                   without a GPU (no nvidia-smi listing one, no /dev/dri render node) it says so
                   and runs a smoke row instead (lavapipe smoke: not a GPU figure); lease: the
                   holder's memory on the host (cpu, default) or the GPU's (webgpu: a WebGPU
                   session's 256 MiB of initializers (64 MiB on lavapipe) in a child process, the adapter checked
                   to be the GPU; on lavapipe a smoke, noted)
  -device D        throughput, lease -ep webgpu: the pools' or the leases' device, cuda:N, drm:N
                   or cpu (default: the GPU found, cuda:0 for NVIDIA)
  -smoke           throughput -ep webgpu: the smoke row (tiny model, 1s per path) even with a GPU
  -kills N         jobs: kill -9 of the whole stack during the kill run (default 2; -1 = none)
  -scenario S      collision: a scenario TOML file, or a built-in one: default (two pools
                   sharing the CPU: bench/scenarios/collision.toml), onepool, short, real
                   (Silero VAD audio + PP-OCRv4 det 640 + the tagger flood), real-short, llm
                   (the same on one shared device, camera-frame bursts, and an LLM tenant
                   under ortbus lease, with and without --gate), llm-short, gpu (the real-model
                   classes on webgpu pools of one GPU, llama.cpp generating on it under ortbus
                   lease --on-pressure with and without --gate, the GPU's peak memory against
                   its budget, and the degrade run: the GPU pool's worker killed mid-run;
                   without a GPU a lavapipe smoke), gpu-short;
                   profile: the same scenarios (default gpu; gpu-short on lavapipe), each
                   service (class, LLM tenant) alone: p95, items/s, CPU %, idle and peak
                   memory on its device, power (RAPL, nvidia-smi) or why not;
                   capacity: a TOML file with a [capacity] table, default capacity, or
                   capacity-llm (LLM tenants as a step dimension)
  -seed N          collision, capacity: replaces the scenario's seed (printed either way)
  -steps LIST      capacity: the load steps, STREAMS:RATE[:TENANTS],... (e.g. 1:0.5,2:1,4:2;
                   TENANTS: LLM tenant processes, with -scenario capacity-llm)
  -chart FILE.png  collision, capacity: chart (default: next to -out, NAME.png; "-" = none)
  -no-solo         collision: skip the solo runs
  -relay           overhead: the gateway relays every reply ([gateway] relay_replies)
  -trace           overhead: also time a second system that traces every request (OTLP to a sink here)
  -pages N         overhead: also time a second system with N of the gateway's pages open,
                   each reading its event stream (GET /v1/events), and both gateways' CPU
  -repo DIR        repository root (default: found from this binary or the working directory)
  -bin DIR         gateway and ortworker binaries (default: next to this binary, else <repo>/bin)
  -v               show the gateway's and workers' logs
  -keep            keep the temporary directory
Tools of scripts/gpu-check.sh:
  ortbus bench memcheck -device D -save FILE     a reading of D's used memory and its processes'
  ortbus bench memcheck -device D -before FILE -status STATUS.json [-out CHECK.json]
                   the workers' device_bytes (ortbus status -json) against D's own growth since
                   FILE, other processes subtracted: exit 1 off by more than 10% or not measured
  ortbus bench unmeasured STEP REPORT.json
                   each target of a bench report without a figure; exit 1 when there is one
`

// benchTool runs the bench subcommands that are no benchmark (ok false: name is none):
// the hidden processes the benches run, and gpu-check's tools.
func benchTool(name string, args []string) (code int, ok bool) {
	switch name {
	case "llm-tenant":
		// Hidden: the LLM-shaped tenant the collision and capacity benches run under
		// `ortbus lease` (bench/tenant.go).
		return bench.TenantMain(args, os.Stdin, os.Stdout, os.Stderr), true
	case "mem-holder":
		// Hidden: the memory holder the lease bench runs under `ortbus lease` (bench/memholder.go).
		return bench.MemHolderMain(args, os.Stdout, os.Stderr), true
	case "memcheck":
		return bench.MemCheckMain(args, os.Stdout, os.Stderr), true
	case "unmeasured":
		return bench.UnmeasuredMain(args, os.Stdout, os.Stderr), true
	}
	return 0, false
}

// benchCmd runs one benchmark: it prints a table and writes the JSON report.
func benchCmd(args []string) int {
	if len(args) == 0 || strings.HasPrefix(args[0], "-") {
		fmt.Fprint(os.Stderr, benchUsage)
		return 2
	}
	name, args := args[0], args[1:]
	if code, ok := benchTool(name, args); ok {
		return code
	}
	fs := flag.NewFlagSet("bench "+name, flag.ContinueOnError)
	fs.Usage = func() { fmt.Fprint(os.Stderr, benchUsage) }
	out := fs.String("out", "", "")
	n := fs.Int("n", 0, "")
	files := fs.Int("files", 0, "")
	dur := fs.Duration("duration", 0, "")
	inflight := fs.Int("inflight", 0, "")
	workers := fs.Int("workers", 0, "")
	threads := fs.Int("threads", 0, "")
	ep := fs.String("ep", "", "")
	device := fs.String("device", "", "")
	smoke := fs.Bool("smoke", false, "")
	kills := fs.Int("kills", 0, "")
	scenario := fs.String("scenario", "", "")
	seed := fs.Uint64("seed", 0, "")
	steps := fs.String("steps", "", "")
	chart := fs.String("chart", "", "")
	noSolo := fs.Bool("no-solo", false, "")
	relay := fs.Bool("relay", false, "")
	traced := fs.Bool("trace", false, "")
	pages := fs.Int("pages", 0, "")
	repo := fs.String("repo", "", "")
	bin := fs.String("bin", "", "")
	verbose := fs.Bool("v", false, "")
	keep := fs.Bool("keep", false, "")
	if fs.Parse(args) != nil || fs.NArg() != 0 {
		fmt.Fprint(os.Stderr, benchUsage)
		return 2
	}
	if msg := benchFlagsOwned(name, *files != 0, *ep != "" || *device != "" || *smoke); msg != "" {
		fmt.Fprintf(os.Stderr, "ortbus bench %s: %s\n", name, msg)
		return 2
	}
	if *files != 0 {
		*n = *files
	}
	o := bench.Options{Repo: *repo, BinDir: *bin, N: *n, Duration: *dur, InFlight: *inflight, Workers: *workers, Threads: *threads, EP: *ep, Device: *device, Smoke: *smoke, Kills: *kills,
		Scenario: *scenario, Seed: *seed, Steps: *steps, SkipSolo: *noSolo, RelayReplies: *relay, Trace: *traced, Pages: *pages, Out: os.Stdout, KeepTemp: *keep}
	if *verbose {
		o.Logs = os.Stderr
	}
	if o.Repo == "" {
		r, err := bench.FindRepo()
		if err != nil {
			fmt.Fprintln(os.Stderr, "ortbus bench:", err)
			return 1
		}
		o.Repo = r
	}
	if *out == "" {
		*out = filepath.Join(o.Repo, "bench-out", name+".json")
	}
	if (name == "collision" || name == "capacity") && *chart != "-" {
		o.Chart = *chart
		if o.Chart == "" {
			o.Chart = strings.TrimSuffix(*out, ".json") + ".png"
		}
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	t0 := time.Now()
	rep, err := bench.Run(ctx, name, o)
	if err != nil {
		fmt.Fprintln(os.Stderr, "ortbus bench "+name+":", err)
		return 1
	}
	if err := rep.WriteJSON(*out); err != nil {
		fmt.Fprintln(os.Stderr, "ortbus bench:", err)
		return 1
	}
	m := rep.Machine
	fmt.Printf("machine: %d cores (%s), %s, ORT %s / workers %v, load average %s -> %s\n",
		m.Cores, m.CPUModel, m.GoVersion, orNone(m.Runtimes.BenchProcess), m.Runtimes.Workers, m.LoadAvgStart, m.LoadAvgEnd)
	for _, n := range rep.Notes {
		fmt.Println("note:", n)
	}
	fmt.Printf("report: %s", *out)
	if o.Chart != "" {
		fmt.Printf(", chart: %s", o.Chart)
	}
	fmt.Printf(" (%s)\n", time.Since(t0).Round(time.Millisecond))
	return 0
}

func orNone(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// benchFlagsOwned says what is wrong when a flag of one bench is given to another: -files
// is library's; -ep, -device and -smoke are throughput's. "" when nothing is.
func benchFlagsOwned(name string, files, throughputOnly bool) string {
	switch {
	case files && name != "library":
		return "-files is library's"
	case throughputOnly && name != "throughput":
		return "-ep, -device and -smoke are throughput's"
	}
	return ""
}
