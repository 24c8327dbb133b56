package doctor

import (
	"context"
	"fmt"
	"io"
	"maps"
	"runtime"
	"slices"
	"strings"

	"github.com/ortbus/ortbus/codec"
	"github.com/ortbus/ortbus/config"
	"github.com/ortbus/ortbus/images"
	"github.com/ortbus/ortbus/models"
	"github.com/ortbus/ortbus/ort"
)

// Placement is, for one model of a pool (doctor -models), where its nodes ran in a
// warm-up on the pool's EP chain, from ONNX Runtime's profiler, as a worker reports it in
// nodes_by_ep.
type Placement struct {
	// EP is the EP its sessions run (the first usable of the pool's chain).
	EP string `json:"ep,omitempty"`
	// NodesByEP counts the nodes by EP; OffEP lists the op types of those off EP
	// ("Det (cpu)").
	NodesByEP map[string]int `json:"nodes_by_ep,omitempty"`
	OffEP     []string       `json:"off_ep,omitempty"`
	// Strict is set for a pool with cpu_fallback = false: a model with nodes off its EP
	// (or whose placement is unknown) fails to load there, and the pool is not ok.
	Strict bool `json:"strict,omitempty"`
	// Error is why the model could not be loaded or its placement taken.
	Error string `json:"error,omitempty"`
}

// refused reports whether a worker of the pool would refuse the model for its placement.
func (p *Placement) refused() bool {
	return p.Strict && (len(p.OffEP) > 0 || len(p.NodesByEP) == 0)
}

// probePlacements loads each model of pool p with its session config (its EP chain and
// the profiler on), warms it up at batch 1 and takes where its nodes ran. The models'
// missing files are reported by checkModels; such a model is skipped here.
func probePlacements(rt *ort.Runtime, cfg *config.Config, p *config.Pool, missing map[string]*codec.Error) map[string]*Placement {
	sc := ort.PoolSessionConfig(p, false)
	sc.Placement = true
	env := models.Env{Runtime: rt, Session: sc,
		Images: images.Policy{AllowedRoots: cfg.Security.AllowedRoots, MaxPixels: cfg.Security.MaxImagePixels, MaxBytes: int64(cfg.Security.MaxImageBytes)}}
	out := map[string]*Placement{}
	for _, name := range p.Models {
		mc := cfg.Models[name]
		if mc == nil || missing[name] != nil {
			continue
		}
		out[name] = placementOf(env, mc, !p.AllowsCPUFallback())
	}
	runtime.GC()
	return out
}

func placementOf(env models.Env, mc *config.Model, strict bool) *Placement {
	pl := &Placement{Strict: strict}
	m, err := models.Open(env, mc)
	if err != nil {
		pl.Error = oneLine(err.Error())
		return pl
	}
	defer m.Close()
	warmed := true
	if err := m.Warmup(context.Background(), 1); err != nil {
		// The profile then holds the nodes run up to the failing one: not the placement.
		pl.Error = "warm-up on zeros failed (placement not known): " + oneLine(err.Error())
		warmed = false
	}
	sum := &ort.Placement{}
	for _, s := range m.Sessions() {
		if s == nil {
			continue
		}
		if pl.EP == "" {
			pl.EP = s.EP
		}
		if q, err := s.Placement(); err == nil {
			sum.Add(q)
		}
	}
	if warmed && len(sum.NodesByEP) > 0 {
		pl.NodesByEP, pl.OffEP = sum.NodesByEP, sum.Off(pl.EP)
	}
	return pl
}

func oneLine(s string) string {
	s = firstLine(s)
	if len(s) > 512 {
		s = s[:512] + "…"
	}
	return s
}

// printPlacements writes each model's placement line.
func printPlacements(w io.Writer, r *Report) {
	for _, name := range slices.Sorted(maps.Keys(r.Placements)) {
		p := r.Placements[name]
		var parts []string
		for _, ep := range slices.Sorted(maps.Keys(p.NodesByEP)) {
			parts = append(parts, fmt.Sprintf("%s %d", ep, p.NodesByEP[ep]))
		}
		line := "nodes " + strings.Join(parts, ", ")
		if len(parts) == 0 {
			line = "nodes not known"
		}
		if len(p.OffEP) > 0 {
			line += "; off " + p.EP + ": " + strings.Join(p.OffEP, ", ")
		}
		if p.Error != "" {
			line += "; " + p.Error
		}
		if p.refused() {
			line += " — REFUSED: the pool has cpu_fallback = false"
		}
		fmt.Fprintf(w, "  model %s\t%s\n", name, line)
	}
}
