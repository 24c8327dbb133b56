package worker

import (
	"strings"

	"github.com/ortbus/ortbus/codec"
	"github.com/ortbus/ortbus/config"
	"github.com/ortbus/ortbus/models"
	"github.com/ortbus/ortbus/ort"
)

// placement takes, after m's warm-ups, where its sessions' nodes ran (ort.Session.
// Placement: ONNX Runtime's profiler), summed over the sessions. known is false when no
// session recorded a node (no warm-up ran, or the runtime gave no profile). ep is the EP
// the sessions run (the first one's).
func placement(m models.Model) (p *ort.Placement, ep string, known bool) {
	p = &ort.Placement{}
	for _, s := range m.Sessions() {
		if s == nil {
			continue
		}
		if ep == "" {
			ep = s.EP
		}
		q, err := s.Placement()
		if err != nil || len(q.NodesByEP) == 0 {
			continue
		}
		p.Add(q)
		known = true
	}
	return p, ep, known
}

// checkPlacement records where m's nodes ran in st (nodes_by_ep) and, in a pool with
// cpu_fallback = false, refuses m when any node ran off its session's EP, naming the ops
// (model_unavailable, details model, ep, ops). When where they ran is not known (its
// warm-up failed, so no node ran), ONNX Runtime itself is asked (rt.CheckNoCPUFallback:
// a session of each file with the runtime's own strict option): m is refused when it
// refuses, saying that the ops cannot be named.
func checkPlacement(rt *ort.Runtime, m models.Model, mc *config.Model, p *config.Pool, st *codec.ModelStatus) error {
	pl, ep, known := placement(m)
	if st.WarmupError != "" {
		// The warm-up stopped at a failing node: the profile holds the nodes that ran up
		// to it, not the model's placement.
		known = false
	}
	if known && len(pl.NodesByEP) <= codec.MaxNodesByEP {
		st.NodesByEP = pl.NodesByEP
	}
	if p.AllowsCPUFallback() {
		return nil
	}
	if !known {
		why := "no warm-up run recorded a node"
		if st.WarmupError != "" {
			why = "its warm-up failed: " + st.WarmupError
		}
		if rt == nil {
			return codec.Errorf(codec.CodeModelUnavailable, "model %s: pool %s has cpu_fallback = false, but where its nodes run on %s is not known (%s)", mc.Name, p.Name, ep, why).
				With("model", mc.Name).With("ep", ep)
		}
		for _, s := range m.Sessions() {
			if s == nil || s.EP == "cpu" {
				continue
			}
			prov := ort.Provider{Name: s.EP}
			if s.EP == p.EP {
				prov.Options = p.EPOptions // the pool's EP options, for its own EP only
			}
			if err := rt.CheckNoCPUFallback(s.Path, prov); err != nil {
				return codec.Errorf(codec.CodeModelUnavailable, "model %s has nodes off the pool's EP %s, and pool %s has cpu_fallback = false: ONNX Runtime refuses %s without its CPU fallback (the ops cannot be named: %s): %v",
					mc.Name, s.EP, p.Name, s.Path, why, err).With("model", mc.Name).With("ep", s.EP)
			}
		}
		return nil
	}
	if off := pl.Off(ep); len(off) > 0 {
		return codec.Errorf(codec.CodeModelUnavailable, "model %s has nodes off the pool's EP %s, and pool %s has cpu_fallback = false: %s (%d of %d nodes; %s has no kernel for them)",
			mc.Name, ep, p.Name, strings.Join(off, ", "), total(pl)-pl.NodesByEP[ep], total(pl), ep).
			With("model", mc.Name).With("ep", ep).With("ops", off)
	}
	return nil
}

func total(p *ort.Placement) int {
	n := 0
	for _, c := range p.NodesByEP {
		n += c
	}
	return n
}
