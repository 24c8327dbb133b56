package testenv

import (
	"fmt"
	"runtime"
	"strings"
	"testing"
)

// ending is a testing.TB whose Fatal and Skip are recorded, ending the calling goroutine
// as theirs do, instead of ending the test.
type ending struct {
	testing.TB
	how, msg string
}

func (e *ending) Helper() {}
func (e *ending) Fatal(args ...any) {
	e.how, e.msg = "fatal", fmt.Sprint(args...)
	runtime.Goexit()
}
func (e *ending) Skip(args ...any) {
	e.how, e.msg = "skip", fmt.Sprint(args...)
	runtime.Goexit()
}

// TestUnavailable: what a test lacks skips it, except under CI (CI=true or any value but
// false and 0), where it fails it, saying why either way.
func TestUnavailable(t *testing.T) {
	for _, c := range []struct{ ci, want string }{
		{"", "skip"}, {"false", "skip"}, {"0", "skip"}, {"true", "fatal"}, {"1", "fatal"}, {"yes", "fatal"},
	} {
		t.Run("CI="+c.ci, func(t *testing.T) {
			t.Setenv(CIEnv, c.ci)
			e := &ending{TB: t}
			done := make(chan struct{})
			go func() {
				defer close(done)
				Unavailable(e, "no widget here")
			}()
			<-done
			if e.how != c.want || !strings.Contains(e.msg, "no widget here") {
				t.Errorf("CI=%q: %s %q, want %s with the reason", c.ci, e.how, e.msg, c.want)
			}
		})
	}
}
