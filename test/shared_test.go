package test

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
)

// The shared workers: one per runtime version, each loading the tagger, CCIP, the detector
// and the segmenter, started once for every test that only sends them requests (worker
// start-up is the expensive part of these tests on a small machine).
const (
	pool130 = "p130"
	pool124 = "p124"
)

// sharedPools are the shared workers' pools and their runtime versions. One slot each:
// TestBadInputs relies on it (a later item is answered after every earlier one).
var sharedPools = []poolCfg{
	{Name: pool130, Version: "1.30.0", Slots: 1, Models: []string{"tagger", "ccip", "detector", "segmenter"}},
	{Name: pool124, Version: "1.24.3", Slots: 1, Models: []string{"tagger", "ccip", "detector", "segmenter"}},
}

// sharedSessions is how many runtime sessions a shared worker's models need: the tagger
// 1, CCIP 2 (feature and metrics), the detector 1 and the segmenter 1.
const sharedSessions = 5

var shared struct {
	once  sync.Once
	root  string
	procs map[string]*proc
	err   error
}

// sharedWorkers starts the shared workers on first use and returns them by pool, and
// their allowed image root.
func sharedWorkers(t testing.TB) (map[string]*proc, string) {
	t.Helper()
	shared.once.Do(func() {
		// Set until the end: a t.Fatal inside (Goexit) leaves it for later callers.
		shared.err = fmt.Errorf("start-up was interrupted; see the first test that failed")
		shared.root = filepath.Join(pkgEnv.tmp, "shared-images")
		if shared.err = os.Mkdir(shared.root, 0o755); shared.err != nil {
			return
		}
		cfgDir := filepath.Join(pkgEnv.tmp, "shared-config")
		if shared.err = os.Mkdir(cfgDir, 0o755); shared.err != nil {
			return
		}
		cfg := writeConfigIn(t, cfgDir, shared.root, sharedPools...)
		shared.procs = map[string]*proc{}
		for _, p := range sharedPools {
			shared.procs[p.Name] = launchDetached(t, cfg, p.Name)
		}
		for _, p := range sharedPools {
			pr := shared.procs[p.Name]
			ev, err := pr.awaitReady()
			if err != nil {
				shared.err = err
				return
			}
			pr.Ready = ev
		}
		shared.err = nil
	})
	if shared.err != nil {
		t.Fatalf("shared workers: %v", shared.err)
	}
	return shared.procs, shared.root
}

// sharedDir is a fresh directory for t's images inside the shared workers' root.
func sharedDir(t testing.TB) string {
	t.Helper()
	_, root := sharedWorkers(t)
	name := strings.NewReplacer("/", "_", " ", "_").Replace(t.Name())
	dir, err := os.MkdirTemp(root, name+"-")
	if err != nil {
		t.Fatal(err)
	}
	return dir
}

// stopShared kills the shared workers (TestMain), printing their stderr when the run
// failed.
func stopShared(failed bool) {
	for _, p := range shared.procs {
		p.kill()
		if failed {
			fmt.Fprintf(os.Stderr, "--- stderr of shared worker %s:\n%s", p.ID, p.lp.Log())
		}
	}
}
