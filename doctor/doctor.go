// Package doctor checks, for each pool of a configuration, where its ONNX Runtime library
// is searched, which one is found, the version it reports when loaded, and which execution
// providers it can append. Each pool is probed in its own child process with the pool's
// environment, since one process can hold only one runtime.
package doctor

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/ortbus/ortbus/codec"
	"github.com/ortbus/ortbus/config"
	"github.com/ortbus/ortbus/ort"
)

// ProbeEPs are the execution providers every pool is probed for.
var ProbeEPs = []string{"cpu", "cuda", "openvino", "tensorrt"}

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
}

// OK reports whether the pool can serve: runtime loaded and one EP of its chain usable.
func (r *Report) OK() bool { return r.Error == nil && r.Usable != "" }

// Probe runs in the child: it finds and loads the pool's runtime and probes the EPs.
func Probe(cfg *config.Config, pool string) *Report {
	p, ok := cfg.Pools[pool]
	if !ok {
		return &Report{Pool: pool, Error: codec.Errorf(codec.CodeUnknownPool, "pool %q is not in the config", pool)}
	}
	spec := ort.PoolSpec(p)
	r := &Report{Pool: pool, Searched: spec.Candidates(), Wanted: append([]string{p.EP}, p.Fallback...)}
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
	for _, ep := range r.Wanted {
		if r.EPs[ep] == "ok" {
			r.Usable = ep
			break
		}
	}
	if r.Usable == "" {
		r.Error = codec.Errorf(codec.CodeProviderUnavailable, "none of %v can be appended: %s", r.Wanted, r.EPs[p.EP]).
			With("pool", pool).With("ep", p.EP).With("error", r.EPs[p.EP])
	}
	return r
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
		if !r.OK() {
			status = "FAIL"
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
				fmt.Fprintf(tw, "  ep %s\t%s\n", ep, firstLine(v))
			}
		}
		fmt.Fprintf(tw, "  wanted\t%s (usable: %s)\n", strings.Join(r.Wanted, " -> "), or(r.Usable, "none"))
		if r.Error != nil {
			fmt.Fprintf(tw, "  error\t%s: %s\n", r.Error.Code, r.Error.Message)
		}
	}
	tw.Flush()
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
