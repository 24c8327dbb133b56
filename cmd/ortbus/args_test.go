package main

import (
	"flag"
	"io"
	"os"
	"slices"
	"strings"
	"testing"
)

// TestFlagsAfterPositionals: flags after the positional arguments are read as flags, not
// as more positionals (`ortbus req tag img.png -class batch`); "--" ends the flags.
func TestFlagsAfterPositionals(t *testing.T) {
	for _, c := range []struct {
		args  []string
		class string
		pos   []string
	}{
		{[]string{"tag", "img.png", "-class", "batch"}, "batch", []string{"tag", "img.png"}},
		{[]string{"-class", "urgent", "tag", "img.png"}, "urgent", []string{"tag", "img.png"}},
		{[]string{"tag", "-class=batch", "img.png"}, "batch", []string{"tag", "img.png"}},
		{[]string{"tag", "--", "-class", "x"}, "", []string{"tag", "-class", "x"}},
	} {
		fs := flag.NewFlagSet("t", flag.ContinueOnError)
		class := fs.String("class", "", "")
		if err := parseInterspersed(fs, c.args); err != nil || *class != c.class || !slices.Equal(fs.Args(), c.pos) {
			t.Errorf("%q: class %q, args %q, %v; want class %q, args %q", c.args, *class, fs.Args(), err, c.class, c.pos)
		}
	}
}

// TestReqUnknownOp: a typo'd op is refused here, naming the ops, not sent to reach no
// service (exit 2, before any connection: -s names nothing that listens).
func TestReqUnknownOp(t *testing.T) {
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	stderr := os.Stderr
	os.Stderr = w
	code := run([]string{"req", "-s", "nats://127.0.0.1:1", "tga", `{"path":"/x.png"}`})
	os.Stderr = stderr
	w.Close()
	out, _ := io.ReadAll(r)
	if code != 2 || !strings.Contains(string(out), `unknown op "tga"`) || !strings.Contains(string(out), "tag, embed") {
		t.Errorf("req tga: exit %d, stderr %q; want 2 naming the ops", code, out)
	}
}

// TestReqTrace: -traceparent is sent as given and its trace id printed; -trace makes a
// new one; neither sends none.
func TestReqTrace(t *testing.T) {
	given := "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	if tp, line := reqTrace(false, given); tp != given || line != "trace 4bf92f3577b34da6a3ce929d0e0e4736" {
		t.Errorf("-traceparent: %q, %q", tp, line)
	}
	if tp, line := reqTrace(true, "junk"); tp != "junk" || !strings.Contains(line, "malformed") {
		t.Errorf("malformed -traceparent: %q, %q", tp, line)
	}
	tp, line := reqTrace(true, "")
	if id := strings.TrimPrefix(line, "trace "); len(id) != 32 || !strings.Contains(tp, id) {
		t.Errorf("-trace: %q, %q", tp, line)
	}
	if tp, line := reqTrace(false, ""); tp != "" || line != "" {
		t.Errorf("neither: %q, %q", tp, line)
	}
}
