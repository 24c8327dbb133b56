package testenv

import (
	"os"
	"testing"
)

// CIEnv is the environment variable that marks a CI run (.ci/run sets nothing itself: CI
// services set CI=true). Under it, whatever a test needs of the machine has been installed
// first (.ci/run: make test's prerequisites, scripts/install-vulkan.sh,
// scripts/install-freezer.sh), so its absence is a fault, never a skip.
const CIEnv = "CI"

// InCI reports whether this is a CI run (CI set and not "false" or "0").
func InCI() bool {
	v := os.Getenv(CIEnv)
	return v != "" && v != "false" && v != "0"
}

// Unavailable is what a test does when this machine lacks something it needs: it skips t
// saying why (why should say what installs it), or fails t under CI (InCI), where what
// the test needs is installed first and its absence is a fault.
func Unavailable(t testing.TB, why string) {
	t.Helper()
	if InCI() {
		t.Fatal(why + " (under CI, where it is installed first: a failure, not a skip)")
	}
	t.Skip(why)
}
