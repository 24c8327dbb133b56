package test

import "testing"

// The package's three longest tests — TestTSClient (the Bun suite, about a minute),
// TestHostile and TestPage (a real Chromium) — call t.Parallel, as most of the package's
// tests that start their own stack do. Go starts a package's parallel tests once its
// sequential ones are done, -parallel (GOMAXPROCS: 2 here) at a time, in the order they
// are declared: files in name order, so this file comes first and the longest start
// first (the longest-first rule of packing jobs onto machines). Declared last, the Bun
// suite ran alone at the end of the package for most of a minute, on a core left idle.
// Each has its own gateways, workers, ports and temporary directories and waits on events
// (replies, heartbeats, the page's DOM), not on a time that another test's load could
// make it miss, so running beside the others changes their durations only. A test that
// sets the environment (t.Setenv) cannot be parallel.

// TestTSClient runs the TypeScript client's Bun suite against real processes (runTSClient).
func TestTSClient(t *testing.T) {
	t.Parallel()
	runTSClient(t)
}

// TestHostile floods a real stack with hostile messages and requests (runHostile).
func TestHostile(t *testing.T) {
	t.Parallel()
	runHostile(t)
}

// TestPage drives the gateway's page in a real headless Chromium (runPage).
func TestPage(t *testing.T) {
	t.Parallel()
	runPage(t)
}
