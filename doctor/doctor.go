// Package doctor checks, for each pool of a configuration, where its ONNX Runtime library
// is searched, which one is found, the version it reports when loaded, and which execution
// providers it can append. Each pool is probed in its own child process with the pool's
// environment, since one process can hold only one runtime.
//
// A pool whose chain has webgpu (ONNX Runtime's WebGPU EP: Dawn over Vulkan on Linux) is
// also probed for Vulkan in that child, with the pool's environment (VK_DRIVER_FILES and
// the like): the loader, the driver manifests and the adapters. webgpu counts as usable
// when the runtime appends it (ONNX Runtime 1.30 asks Dawn for its adapter then) and the
// Vulkan probe lists an adapter; the report names that adapter (vendor, device, type,
// backend Vulkan, driver), or what is missing and what to install: the loader
// (libvulkan.so.1, package libvulkan1), a driver (the directories searched), or an
// adapter (the driver manifests found).
package doctor

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/ortbus/ortbus/codec"
	"github.com/ortbus/ortbus/config"
	"github.com/ortbus/ortbus/devices/vulkan"
	"github.com/ortbus/ortbus/ort"
)

// ProbeEPs are the execution providers every pool is probed for. Appending webgpu makes
// ONNX Runtime (1.30) ask Dawn for an adapter, so its row fails where there is none.
var ProbeEPs = []string{"cpu", "cuda", "openvino", "tensorrt", "webgpu"}

// Report is one pool's result.
type Report struct {
	Pool     string            `json:"pool"`
	Searched []string          `json:"searched"`
	Found    string            `json:"found,omitempty"`
	Version  string            `json:"version,omitempty"`
	EPs      map[string]string `json:"eps,omitempty"` // ep -> "ok" or the runtime's error
	Wanted   []string          `json:"wanted"`        // the pool's EP chain
	Usable   string            `json:"usable,omitempty"`
	Error    *codec.Error      `json:"error,omitempty"`
	// Vulkan is the Vulkan probe of a pool whose chain has webgpu, made in the pool's
	// child process with its environment.
	Vulkan *vulkan.Report `json:"vulkan,omitempty"`
	// WebGPU is, for such a pool, the adapter webgpu runs on ("adapter …"), or why it
	// cannot run and what to install.
	WebGPU string `json:"webgpu,omitempty"`
	// AdapterMismatch is, for a webgpu pool with adapter_mismatch = "flag", why the
	// adapter its workers take is not the GPU its device names: the pool is ok, flagged.
	AdapterMismatch string `json:"adapter_mismatch,omitempty"`
	// Fallback says, when the pool's preferred EP is unusable but a fallback is, which
	// one it will run (why: EPs, and WebGPU for webgpu).
	Fallback string `json:"fallback,omitempty"`
	// Models are the pool's models whose files are not where the config says (its `dir`
	// missing or not a folder, a required file missing), each with its error
	// (file_not_found, details model and path). A model that is fine is not listed.
	Models map[string]*codec.Error `json:"models,omitempty"`
	// Placements are, with doctor -models, where each model's nodes ran in a warm-up on
	// the pool's EP (placement.go).
	Placements map[string]*Placement `json:"placements,omitempty"`
}

// OK reports whether the pool can serve: runtime loaded, one EP of its chain usable, and
// every model's files where the config says.
func (r *Report) OK() bool {
	for _, p := range r.Placements {
		if p.refused() {
			return false
		}
	}
	return r.Error == nil && r.Usable != "" && len(r.Models) == 0
}

// checkModels reports the pool's models whose files are missing (Report.Models): a
// worker would fail to load them. A model named by hf_repo alone is found in the Hugging
// Face cache by the worker, and not checked here.
func checkModels(cfg *config.Config, p *config.Pool) map[string]*codec.Error {
	out := map[string]*codec.Error{}
	for _, name := range p.Models {
		m := cfg.Models[name]
		if m == nil || m.Dir == "" {
			continue
		}
		if fi, err := os.Stat(m.Dir); err != nil || !fi.IsDir() {
			out[name] = codec.Errorf(codec.CodeFileNotFound, "model %s: dir %s does not exist or is not a folder", name, m.Dir).With("model", name).With("path", m.Dir)
			continue
		}
		k, ok := config.KindOf(m.Kind)
		if !ok {
			continue // the config refuses it
		}
		for _, role := range k.Required {
			f := m.Files[role]
			if f == "" {
				f = k.Files[role]
			}
			if !filepath.IsAbs(f) {
				f = filepath.Join(m.Dir, f)
			}
			if _, err := os.Stat(f); err != nil {
				out[name] = codec.Errorf(codec.CodeFileNotFound, "model %s (%s): %s file %s not found", name, m.Kind, role, f).With("model", name).With("path", f)
				break
			}
		}
	}
	if len(out) == 0 {
		return nil
	}
	return out
}

// ProbeMain is the child's entry (`ortbus doctor-probe -config FILE -pool NAME`): it
// probes the pool and prints its Report as one JSON line; 2 for arguments or a config it
// cannot read.
func ProbeMain(args []string) int {
	fs := flag.NewFlagSet("doctor-probe", flag.ContinueOnError)
	cfgPath := fs.String("config", "", "")
	pool := fs.String("pool", "", "")
	withModels := fs.Bool("models", false, "")
	if fs.Parse(args) != nil {
		return 2
	}
	cfg, err := config.Load(*cfgPath)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	r := Probe(cfg, *pool)
	if *withModels && r.Usable != "" && r.Error == nil {
		if rt := ort.Current(); rt != nil {
			r.Placements = probePlacements(rt, cfg, cfg.Pools[*pool], r.Models)
		}
	}
	b, _ := json.Marshal(r)
	fmt.Println(string(b))
	return 0
}

// Probe runs in the child: it finds and loads the pool's runtime and probes the EPs.
func Probe(cfg *config.Config, pool string) *Report {
	p, ok := cfg.Pools[pool]
	if !ok {
		return &Report{Pool: pool, Error: codec.Errorf(codec.CodeUnknownPool, "pool %q is not in the config", pool)}
	}
	spec := ort.PoolSpec(p)
	r := &Report{Pool: pool, Searched: spec.Candidates(), Wanted: append([]string{p.EP}, p.Fallback...), Models: checkModels(cfg, p)}
	if slices.Contains(r.Wanted, "webgpu") {
		// Before the runtime: what Vulkan offers is worth knowing even without one.
		r.Vulkan = vulkan.Probe(context.Background())
		r.WebGPU, _ = webgpuVerdict("", r.Vulkan)
	}
	path, err := spec.Find()
	if err != nil {
		r.Error = codec.AsError(err).With("pool", pool)
		return r
	}
	r.Found = path
	rt, err := ort.Load(path)
	if err != nil {
		r.Error = codec.AsError(err).With("pool", pool)
		return r
	}
	r.Version = rt.Version
	r.EPs = map[string]string{}
	for _, ep := range ProbeEPs {
		opts := map[string]string(nil)
		if ep == p.EP {
			opts = p.EPOptions
		}
		if err := rt.ProbeProvider(ort.Provider{Name: ep, Options: opts}); err != nil {
			r.EPs[ep] = err.Error()
		} else {
			r.EPs[ep] = "ok"
		}
	}
	webgpuOK := false
	if r.Vulkan != nil {
		r.WebGPU, webgpuOK = webgpuVerdict(r.EPs["webgpu"], r.Vulkan)
	}
	for _, ep := range r.Wanted {
		if r.EPs[ep] == "ok" && (ep != "webgpu" || webgpuOK) {
			r.Usable = ep
			break
		}
	}
	why := r.EPs[p.EP]
	if p.EP == "webgpu" && !webgpuOK {
		why = r.WebGPU
	}
	switch {
	case r.Usable == "" && p.EP == "webgpu":
		r.Error = codec.Errorf(codec.CodeProviderUnavailable, "none of %v is usable: webgpu: %s", r.Wanted, why).
			With("pool", pool).With("ep", p.EP).With("error", why)
	case r.Usable == "":
		r.Error = codec.Errorf(codec.CodeProviderUnavailable, "none of %v can be appended: %s", r.Wanted, r.EPs[p.EP]).
			With("pool", pool).With("ep", p.EP).With("error", r.EPs[p.EP])
	case r.Usable != p.EP:
		r.Fallback = fmt.Sprintf("%s is unusable; the pool falls back to %s", p.EP, r.Usable)
	}
	checkAdapter(r, p)
	return r
}

// checkAdapter judges a webgpu pool whose device names a GPU (cuda:N, drm:N) while the
// adapter its workers would take is not one (llvmpipe, lavapipe's CPU device) or not that
// vendor's: its workers would serve on another device under the GPU's name. The pool
// fails, as its workers refuse to start (worker/adapter.go), unless it says
// adapter_mismatch = "flag": then it is ok, flagged (AdapterMismatch).
func checkAdapter(r *Report, p *config.Pool) {
	if r.Error != nil || r.Usable != "webgpu" {
		return
	}
	a, ok := r.Vulkan.Picked()
	if !ok {
		return
	}
	why := vulkan.NotTheGPU(a, p.Device, 0)
	if why == "" {
		return
	}
	r.WebGPU += "; NOT device " + p.Device + ": " + why
	if p.FlagsAdapterMismatch() {
		r.AdapterMismatch = why
		r.WebGPU += " (adapter_mismatch = \"flag\": its workers serve on it all the same, flagged)"
		return
	}
	r.Error = codec.Errorf(codec.CodeProviderUnavailable, "pool %s names device %s, but %s: its workers refuse to serve on that adapter under the GPU's name (adapter_mismatch = %q serves on it, flagged)", p.Name, p.Device, why, config.AdapterFlag).
		With("pool", p.Name).With("ep", p.EP).With("device", p.Device)
}

// webgpuVerdict judges webgpu from the runtime's append result (appended: "ok", the
// runtime's error, or "" when the runtime was not loaded) and the Vulkan probe: usable
// when the EP was appended and Vulkan lists an adapter, the text then naming the adapter
// Dawn picks; else the text says what is missing, from the Vulkan probe when it found a
// problem, else the runtime's own error (an adapter Dawn refused).
func webgpuVerdict(appended string, v *vulkan.Report) (string, bool) {
	problem := v.Problem()
	a, found := v.Picked()
	switch {
	case problem != "":
		return problem, false
	case !found: // not reached: no problem means an adapter
		return "Vulkan lists no adapter", false
	case appended == "":
		return "adapter " + a.String() + " (the runtime was not loaded: not checked with the WebGPU EP)", false
	case appended != "ok":
		return fmt.Sprintf("Vulkan lists %s, but ONNX Runtime's WebGPU EP (Dawn) could not use it: %s", a, firstLine(appended)), false
	}
	return "adapter " + a.String(), true
}

// Run probes every pool, each in a child process started as `self <childArgs...> -pool P`
// with the pool's environment; a child that hangs is killed after timeout.
func Run(cfg *config.Config, self string, childArgs []string, timeout time.Duration) []*Report {
	var out []*Report
	for _, name := range cfg.PoolNames() {
		out = append(out, runChild(cfg.Pools[name], self, childArgs, timeout))
	}
	return out
}

func runChild(p *config.Pool, self string, childArgs []string, timeout time.Duration) *Report {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, self, append(append([]string{}, childArgs...), "-pool", p.Name)...)
	cmd.Env = os.Environ()
	for k, v := range p.Env {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	var r Report
	if jerr := json.Unmarshal(stdout.Bytes(), &r); jerr != nil {
		why := fmt.Sprintf("probe process failed: %v", err)
		if ctx.Err() != nil {
			why = fmt.Sprintf("probe process did not finish within %s", timeout)
		}
		return &Report{Pool: p.Name, Searched: ort.PoolSpec(p).Candidates(),
			Error: codec.Errorf(codec.CodeInternal, "%s: %s", why, strings.TrimSpace(stderr.String())).With("pool", p.Name)}
	}
	return &r
}

// Print writes the reports as a readable listing.
func Print(w io.Writer, reports []*Report) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	for _, r := range reports {
		status := "ok"
		switch {
		case !r.OK():
			status = "FAIL"
		case r.AdapterMismatch != "":
			status = "ok, FLAGGED: not on its device's GPU (adapter_mismatch = \"flag\")"
		}
		fmt.Fprintf(tw, "pool %s\t%s\n", r.Pool, status)
		for _, s := range r.Searched {
			mark := "  "
			if s == r.Found {
				mark = "=>"
			}
			fmt.Fprintf(tw, "  %s searched\t%s\n", mark, s)
		}
		if r.Version != "" {
			fmt.Fprintf(tw, "  runtime\t%s (%s)\n", r.Version, r.Found)
		}
		for _, ep := range ProbeEPs {
			if v, ok := r.EPs[ep]; ok {
				fmt.Fprintf(tw, "  ep %s\t%s\n", ep, epLine(r, ep, v))
			}
		}
		printVulkan(tw, r)
		fmt.Fprintf(tw, "  wanted\t%s (usable: %s)\n", strings.Join(r.Wanted, " -> "), or(r.Usable, "none"))
		if r.Fallback != "" {
			fmt.Fprintf(tw, "  fallback\t%s\n", r.Fallback)
		}
		printPlacements(tw, r)
		for _, m := range slices.Sorted(maps.Keys(r.Models)) {
			fmt.Fprintf(tw, "  model %s\t%s: %s\n", m, r.Models[m].Code, r.Models[m].Message)
		}
		if r.Error != nil {
			fmt.Fprintf(tw, "  error\t%s: %s\n", r.Error.Code, r.Error.Message)
		}
	}
	tw.Flush()
}

// printVulkan writes a webgpu pool's Vulkan probe: the loader, the driver manifests, each
// adapter (Dawn's pick marked), and the verdict.
func printVulkan(w io.Writer, r *Report) {
	v := r.Vulkan
	if v == nil {
		return
	}
	if v.LoaderErr != "" {
		fmt.Fprintf(w, "  vulkan loader\tmissing: %s\n", v.LoaderErr)
	} else {
		fmt.Fprintf(w, "  vulkan loader\t%s (Vulkan %s)\n", v.Loader, v.LoaderAPI)
	}
	from := "searched " + strings.Join(v.ICDSearched, ", ")
	if v.ICDSource != "search" {
		from = v.ICDSource + "=" + strings.Join(v.ICDSearched, ":")
	}
	if len(v.ICDFiles) == 0 {
		fmt.Fprintf(w, "  vulkan drivers\tnone (%s)\n", from)
	} else {
		fmt.Fprintf(w, "  vulkan drivers\t%s (%s)\n", strings.Join(v.ICDFiles, ", "), from)
	}
	if len(v.ICDMissing) > 0 {
		fmt.Fprintf(w, "  vulkan missing\t%s\n", strings.Join(v.ICDMissing, ", "))
	}
	picked := v.PickedIndex()
	for i, a := range v.Adapters {
		mark := ""
		if i == picked {
			mark = "  <= webgpu's (Dawn's high-performance pick)"
		}
		fmt.Fprintf(w, "  vulkan adapter\t%s%s\n", a, mark)
	}
	if v.Err != "" {
		fmt.Fprintf(w, "  vulkan error\t%s\n", v.Err)
	}
	fmt.Fprintf(w, "  webgpu\t%s\n", r.WebGPU)
}

// epLine is what the listing says of ep for the pool of r, whose runtime answered v to
// appending it: "ok" is said of webgpu only for a pool that runs it, whose adapter is
// checked (the runtime appends webgpu without any adapter; a pool without it in its
// chain never checks one).
func epLine(r *Report, ep, v string) string {
	if ep == "webgpu" && v == "ok" && !slices.Contains(r.Wanted, "webgpu") {
		return "can be appended (not in this pool's chain: no adapter checked)"
	}
	return firstLine(v)
}

func firstLine(s string) string {
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		return s[:i]
	}
	return s
}

func or(a, b string) string {
	if a != "" {
		return a
	}
	return b
}
