package docs_test

import (
	"bytes"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/ortbus/ortbus/codec"
	"github.com/ortbus/ortbus/config"
	"github.com/ortbus/ortbus/internal/testkit/testenv"
	"github.com/ortbus/ortbus/subjects"
)

func protocol(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile("PROTOCOL.md")
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// quoted reports whether doc names s as code: `s`.
func quoted(doc, s string) bool { return strings.Contains(doc, "`"+s+"`") }

// TestProtocolCodes: every stable error code has a row `| `code` | STATUS |` whose status
// is the one the code sends.
func TestProtocolCodes(t *testing.T) {
	doc := protocol(t)
	for _, c := range codec.Codes {
		m := regexp.MustCompile("(?m)^\\| `" + regexp.QuoteMeta(string(c)) + "` \\| (\\d+) \\|").FindStringSubmatch(doc)
		if m == nil {
			t.Errorf("PROTOCOL.md has no error-code row for %s", c)
			continue
		}
		if n, _ := strconv.Atoi(m[1]); n != c.Status() {
			t.Errorf("PROTOCOL.md gives %s status %d; the code sends %d", c, n, c.Status())
		}
	}
}

// TestProtocolNames: ops, subjects, classes, verbs, policies, shed policies, model kinds,
// execution providers, states.
func TestProtocolNames(t *testing.T) {
	doc := protocol(t)
	var names []string
	names = append(names, subjects.Ops...)
	for _, op := range subjects.Ops {
		s, err := subjects.API(op)
		if err != nil {
			t.Fatal(err)
		}
		names = append(names, s)
	}
	names = append(names,
		subjects.ClassUrgent, subjects.ClassInteractive, subjects.ClassBatch,
		subjects.VerbDrain, subjects.VerbStats, subjects.VerbLoad, subjects.VerbUnload,
		subjects.Cancel, subjects.OpsCancel, subjects.OpsReload, subjects.OpsModel, subjects.GatewayQueue, subjects.ServiceName, subjects.InferQueue("<pool>"),
		subjects.HBAll, subjects.APIAll, subjects.InferAll, subjects.GWAll,
		config.PolicyPriority, config.PolicyFIFO, config.ShedRejectNew, config.ShedDropOldest,
		config.MemBudgetEnv, config.SkipModelsEnv, config.PoolModelsEnv, config.ControlKeyEnv,
		codec.ModelLoad, codec.ModelUnload, codec.ModelReload,
		codec.ClaimTaken,
		codec.StateStarting, codec.StateReady, codec.StateDraining, codec.StateFailed,
		codec.ModelLoading, codec.ModelReady, codec.ModelFailed, codec.ModelUnloaded,
		codec.HeaderErrorCode, codec.HeaderError,
	)
	names = append(names, config.KnownKinds...)
	names = append(names, config.KnownEPs...)
	// The subject families, written with placeholders: built from sample tokens, which
	// are then replaced by <pool>, <class>, ...
	place := strings.NewReplacer("POOL", "<pool>", "CLASS", "<class>", "WORKER", "<worker>",
		"VERB", "<verb>", "GATEWAY", "<gateway>", "OP", "<op>")
	claimTo := mustSubj(subjects.Claim("GATEWAY"))
	for _, s := range []string{
		mustSubj(subjects.Infer("POOL", "CLASS")),
		mustSubj(subjects.Heartbeat("POOL", "WORKER")),
		mustSubj(subjects.Worker("WORKER", "VERB")),
		claimTo,
		mustSubj(subjects.ClaimFrom(claimTo, "POOL", "WORKER")),
		mustSubj(subjects.GatewayBeat("GATEWAY")),
		mustSubj(subjects.API("OP")),
	} {
		names = append(names, place.Replace(s))
	}
	for _, n := range names {
		if !quoted(doc, n) {
			t.Errorf("PROTOCOL.md does not name `%s`", n)
		}
	}
	if !strings.Contains(doc, "`Content-Type: application/json`") || !strings.Contains(doc, "`WireVersion` is "+strconv.Itoa(codec.WireVersion)) {
		t.Errorf("PROTOCOL.md must give the JSON header and the wire version %d", codec.WireVersion)
	}
}

func mustSubj(s string, err error) string {
	if err != nil {
		panic(err) // a sample token the grammar refuses: fix the test
	}
	return s
}

// TestProtocolFields: every message type of package codec (a struct with msgpack tags) is
// named, and each of its msgpack field names is written as `name`.
func TestProtocolFields(t *testing.T) {
	doc := protocol(t)
	fset := token.NewFileSet()
	files, err := filepath.Glob("../codec/*.go")
	if err != nil || len(files) == 0 {
		t.Fatalf("codec sources: %v", err)
	}
	types := 0
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		af, err := parser.ParseFile(fset, f, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		ast.Inspect(af, func(n ast.Node) bool {
			ts, ok := n.(*ast.TypeSpec)
			if !ok {
				return true
			}
			st, ok := ts.Type.(*ast.StructType)
			if !ok {
				return true
			}
			tagged := false
			for _, fld := range st.Fields.List {
				if fld.Tag == nil {
					continue
				}
				tag, _ := strconv.Unquote(fld.Tag.Value)
				mp, ok := reflect.StructTag(tag).Lookup("msgpack")
				if !ok {
					continue
				}
				tagged = true
				name := strings.Split(mp, ",")[0]
				if name == "" || name == "-" {
					continue // inlined
				}
				if !quoted(doc, name) {
					t.Errorf("PROTOCOL.md does not name field `%s` of codec.%s", name, ts.Name.Name)
				}
			}
			if tagged && ts.Name.IsExported() {
				types++
				if !regexp.MustCompile(`\b` + ts.Name.Name + `\b`).MatchString(doc) {
					t.Errorf("PROTOCOL.md does not name message type %s", ts.Name.Name)
				}
			}
			return true
		})
	}
	if types < 20 {
		t.Fatalf("found only %d message types in ../codec; the test's parsing is broken", types)
	}
}

// TestNoOutsideReferences: no tracked file points at documents outside the repository
// (the contract is docs/PROTOCOL.md, in the repository).
func TestNoOutsideReferences(t *testing.T) {
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command("git", "-C", root, "ls-files", "-z").Output()
	if err != nil {
		testenv.Unavailable(t, fmt.Sprintf("git ls-files: %v (not a git checkout?)", err))
	}
	// Spelled in pieces, so that grep finds no such reference in this file either.
	dir := "shared" + "/"
	bad := []string{"../" + dir, dir + "DESIGN.md", dir + "NOTES.md"}
	for _, name := range strings.Split(strings.TrimRight(string(out), "\x00"), "\x00") {
		if name == "" {
			continue
		}
		b, err := os.ReadFile(filepath.Join(root, name))
		if err != nil {
			continue // deleted in the working tree, or a submodule
		}
		for i, line := range bytes.Split(b, []byte("\n")) {
			for _, s := range bad {
				if bytes.Contains(line, []byte(s)) {
					t.Errorf("%s:%d refers to %q outside the repository; point at docs/PROTOCOL.md", name, i+1, s)
				}
			}
		}
	}
}

// TestProtocolEvents: section 5 shows every field of the event lines (codec.Event) as
// "name": and both kinds of event.
func TestProtocolEvents(t *testing.T) {
	doc := protocol(t)
	i := strings.Index(doc, "## 5. Event lines")
	j := strings.Index(doc, "## 6.")
	if i < 0 || j < i {
		t.Fatal("PROTOCOL.md has no section 5. Event lines")
	}
	sec := doc[i:j]
	ty := reflect.TypeOf(codec.Event{})
	for k := 0; k < ty.NumField(); k++ {
		name := strings.Split(ty.Field(k).Tag.Get("json"), ",")[0]
		if !strings.Contains(sec, `"`+name+`":`) {
			t.Errorf("section 5 of PROTOCOL.md does not show field %q of codec.Event", name)
		}
	}
	for _, ev := range []string{codec.EventReady, codec.EventFailed} {
		if !strings.Contains(sec, `{"event":"`+ev+`"`) {
			t.Errorf("section 5 of PROTOCOL.md does not show an event line %q", ev)
		}
	}
}

// TestProtocolKinds: the op table's last column names exactly the model kinds that serve
// each op (config.Kinds).
func TestProtocolKinds(t *testing.T) {
	doc := protocol(t)
	code := regexp.MustCompile("`([^`]+)`")
	for _, op := range subjects.Ops {
		var want []string
		for _, k := range config.Kinds {
			if k.Serves(op) {
				want = append(want, k.Name)
			}
		}
		m := regexp.MustCompile("(?m)^\\| `" + regexp.QuoteMeta(op) + "` \\|.*\\| [A-Za-z]+Reply \\| ([^|]*) \\|$").FindStringSubmatch(doc)
		if m == nil {
			t.Errorf("PROTOCOL.md has no op-table row for %s", op)
			continue
		}
		var got []string
		for _, c := range code.FindAllStringSubmatch(m[1], -1) {
			got = append(got, c[1])
		}
		if strings.Join(got, ",") != strings.Join(want, ",") {
			t.Errorf("PROTOCOL.md: op %s is served by %v; config.Kinds says %v", op, got, want)
		}
	}
}
