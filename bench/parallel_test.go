package bench

// The bench package's tests run last in `make test`, alone (their collision and capacity
// runs compare latencies with solo runs). Three of them compare no figure with a bound —
// TestCollisionLLM, TestCollisionGPU and TestCapacityLLM check that every figure of their
// report is there, the machine may be loaded — and call t.Parallel: they run together
// after every other test of the package (Go starts a package's parallel tests once its
// sequential ones are done), so they never share the machine with a test that times
// anything, and each has its own gateway, workers, tenant, ports and directories. Run
// beside the other packages instead, they starved the Bun suite's load test (its
// interactive calls are timed against their time alone).
