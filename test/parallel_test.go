package test

// The package's three longest tests — TestTSClient (the Bun suite, about a minute),
// TestHostile and TestPage (a real Chromium) — call t.Parallel: they run together after
// every other test of the package, each with its own gateways, workers, ports and
// temporary directories, on the core the other packages of `make test` have left idle by
// then. Each waits on events (replies, heartbeats, the page's DOM), not on a time that
// another test's load could make it miss, so running beside each other changes their
// durations only. A test that sets the environment (t.Setenv) cannot be one of them.
