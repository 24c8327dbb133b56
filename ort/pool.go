package ort

import (
	"os"

	"github.com/ortbus/ortbus/config"
)

// PoolSpec is where a pool's runtime library is looked for: its runtime path, its
// runtime_dirs, and ORT_DYLIB_PATH / LD_LIBRARY_PATH from the pool's env or, failing that,
// from this process's environment.
func PoolSpec(p *config.Pool) Spec {
	env := map[string]string{}
	for _, k := range []string{"ORT_DYLIB_PATH", "LD_LIBRARY_PATH"} {
		if v, ok := p.Env[k]; ok {
			env[k] = v
		} else if v := os.Getenv(k); v != "" {
			env[k] = v
		}
	}
	return Spec{Path: p.Runtime, Dirs: p.RuntimeDirs, Env: env}
}

// PoolSessionConfig is the pool's EP chain (EP then its fallbacks) and thread counts, its
// threads spinning or not (config.Config.Spins decides: spinning is faster when the
// threads have their cores, and steals CPU from whatever shares them).
func PoolSessionConfig(p *config.Pool, spin bool) SessionConfig {
	on := "0"
	if spin {
		on = "1"
	}
	sc := SessionConfig{IntraOpThreads: p.Threads, InterOpThreads: 1,
		Entries: map[string]string{"session.intra_op.allow_spinning": on, "session.inter_op.allow_spinning": on}}
	for i, ep := range append([]string{p.EP}, p.Fallback...) {
		var o map[string]string
		if i == 0 {
			o = p.EPOptions
		}
		sc.Providers = append(sc.Providers, Provider{Name: ep, Options: o})
	}
	return sc
}
