package testenv

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/ortbus/ortbus/models/onnxgen"
)

func TestMain(m *testing.M) { os.Exit(RunMain(m)) }

func TestRepoRoot(t *testing.T) {
	root := RepoRoot(t)
	mod, err := os.ReadFile(filepath.Join(root, "go.mod"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(string(mod), "module github.com/ortbus/ortbus\n") {
		t.Errorf("%s/go.mod is not the ortbus module", root)
	}
	if _, err := os.Stat(filepath.Join(root, "internal", "testkit", "testenv", "testenv.go")); err != nil {
		t.Errorf("RepoRoot = %s, which does not hold this package: %v", root, err)
	}
}

func TestRuntimeLib(t *testing.T) {
	root := RepoRoot(t)
	if len(Versions) < 2 {
		t.Fatalf("Versions = %v, want at least two runtimes", Versions)
	}
	for _, v := range Versions {
		want := filepath.Join(root, ".deps", "ort-"+v, "lib", "libonnxruntime.so.1")
		if got := RuntimeLibPath(root, v); got != want {
			t.Errorf("RuntimeLibPath(%s) = %s, want %s", v, got, want)
		}
		if got := RuntimeLib(t, v); got != want {
			t.Errorf("RuntimeLib(%s) = %s, want %s", v, got, want)
		}
	}
}

func TestModels(t *testing.T) {
	dir := Models(t)
	for _, f := range []string{
		filepath.Join(onnxgen.TaggerDir, onnxgen.ModelFile),
		filepath.Join(onnxgen.TaggerDir, onnxgen.SelectedTagsFile),
		filepath.Join(onnxgen.TaggerHeavyDir, onnxgen.ModelFile),
		filepath.Join(onnxgen.CCIPDir, onnxgen.CCIPFeatFile),
		filepath.Join(onnxgen.CCIPDir, onnxgen.CCIPMetricsFile),
		filepath.Join(onnxgen.CCIPDir, onnxgen.CCIPMetricsJSON),
		filepath.Join(onnxgen.DetectorDir, onnxgen.ModelFile),
		filepath.Join(onnxgen.SegmenterDir, onnxgen.ModelFile),
		filepath.Join(onnxgen.TinyDir, onnxgen.ModelFile),
	} {
		if st, err := os.Stat(filepath.Join(dir, f)); err != nil || st.Size() == 0 {
			t.Errorf("%s: %v", f, err)
		}
	}
	if again := Models(t); again != dir {
		t.Errorf("second Models = %s, want the same %s", again, dir)
	}
}

const helperTest = "TestChildHelper"

// TestChildHelper is the child of TestChild: it reports its environment and fails when
// asked to.
func TestChildHelper(t *testing.T) {
	if !InChild(helperTest) {
		t.Skip("runs only as a child of TestChild")
	}
	fmt.Printf("child-says models=%s extra=%s\n", os.Getenv(ModelsEnv), os.Getenv("TESTENV_EXTRA"))
	if os.Getenv("TESTENV_FAIL") == "1" {
		t.Fatal("failing as asked")
	}
}

// recorder is a *testing.T whose Errorf is recorded instead of failing the test.
type recorder struct {
	*testing.T
	errors []string
}

func (r *recorder) Errorf(format string, args ...any) {
	r.errors = append(r.errors, fmt.Sprintf(format, args...))
}

// Fatalf records and ends the calling goroutine, as FailNow does.
func (r *recorder) Fatalf(format string, args ...any) {
	r.Errorf(format, args...)
	runtime.Goexit()
}

func TestRuntimeLibMissing(t *testing.T) {
	rec := &recorder{T: t}
	done := make(chan string, 1)
	go func() {
		defer close(done)
		done <- RuntimeLib(rec, "0.0.0-missing")
	}()
	if p, returned := <-done; returned {
		t.Fatalf("RuntimeLib of a missing version returned %q", p)
	}
	if len(rec.errors) != 1 || !strings.Contains(rec.errors[0], "run `make prepare` (scripts/fetch-runtime.sh .deps)") ||
		!strings.Contains(rec.errors[0], filepath.Join(".deps", "ort-0.0.0-missing", "lib", "libonnxruntime.so.1")) {
		t.Errorf("RuntimeLib of a missing version failed with %q, want the path and how to fetch it", rec.errors)
	}
}

func TestChild(t *testing.T) {
	if InChild(helperTest) {
		t.Fatal("InChild true in the parent")
	}
	models := Models(t)

	res := RunChild(t, helperTest, "TESTENV_EXTRA=one", "TESTENV_EXTRA=two")
	if res.Err != nil || res.ExitCode != 0 {
		t.Fatalf("child: exit %d, %v", res.ExitCode, res.Err)
	}
	if want := "child-says models=" + models + " extra=two\n"; !strings.Contains(res.Output, want) {
		t.Errorf("child output lacks %q:\n%s", want, res.Output)
	}
	if !strings.Contains(res.Output, "--- PASS: "+helperTest) {
		t.Errorf("child output lacks its verbose PASS line:\n%s", res.Output)
	}

	res = Child(t, helperTest, "TESTENV_FAIL=1")
	if res.Err == nil || res.ExitCode != 1 || !strings.Contains(res.Output, "failing as asked") {
		t.Errorf("failing child: exit %d, err %v, output:\n%s", res.ExitCode, res.Err, res.Output)
	}
	rec := &recorder{T: t}
	RunChild(rec, helperTest, "TESTENV_FAIL=1")
	if len(rec.errors) != 1 || !strings.Contains(rec.errors[0], "failing as asked") {
		t.Errorf("RunChild of a failing child reported %q, want one error with the child's output", rec.errors)
	}

	res = Child(t, "TestNoSuchTest")
	if res.Err == nil || !strings.Contains(res.Err.Error(), "no test matched") {
		t.Errorf("child for a missing test: err %v, want no test matched", res.Err)
	}
}

func TestChildEnv(t *testing.T) {
	t.Setenv(ChildEnv, "stale")
	t.Setenv("TESTENV_KEEP", "kept")
	env := childEnv("TestX", []string{"A=1", "B=2", "A=3"})
	got := map[string][]string{}
	for _, kv := range env {
		k, v, _ := strings.Cut(kv, "=")
		got[k] = append(got[k], v)
	}
	for k, want := range map[string]string{ChildEnv: "TestX", "A": "3", "B": "2", "TESTENV_KEEP": "kept"} {
		if len(got[k]) != 1 || got[k][0] != want {
			t.Errorf("%s = %q, want exactly %q", k, got[k], want)
		}
	}
}
