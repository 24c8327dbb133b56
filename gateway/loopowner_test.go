package gateway

import (
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"strings"
	"testing"
)

// TestOnlyTheLoopTouchesTheLifecycle: the dispatcher's lifecycle (d.lc) and its drained
// channels (d.drained) are the dispatch loop's alone (loop.go): of the gateway's code,
// only the functions that run on the loop's goroutine may name them. Everything else
// reaches that state through post and inspect, so no lock guards it and no other
// goroutine can race it.
func TestOnlyTheLoopTouchesTheLifecycle(t *testing.T) {
	onLoop := map[string]bool{
		"newDispatcher": true, // before the loop starts
		"step":          true,
		"carryOut":      true,
		"notifyDrained": true,
		"loop":          true,
		"pass":          true,
	}
	owned := map[string]bool{"lc": true, "drained": true}
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	fs := token.NewFileSet()
	seen := map[string]bool{}
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fs, name, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, decl := range f.Decls {
			fd, ok := decl.(*ast.FuncDecl)
			if !ok || fd.Body == nil {
				continue
			}
			ast.Inspect(fd.Body, func(n ast.Node) bool {
				sel, ok := n.(*ast.SelectorExpr)
				if !ok || !owned[sel.Sel.Name] {
					return true
				}
				// Only the dispatcher has fields of these names (checked below by
				// finding every one of them in the loop's functions).
				if !onLoop[fd.Name.Name] {
					t.Errorf("%s: %s touches .%s, which only the dispatch loop may", fs.Position(sel.Pos()), fd.Name.Name, sel.Sel.Name)
				}
				seen[sel.Sel.Name] = true
				return true
			})
		}
	}
	for name := range owned {
		if !seen[name] {
			t.Errorf("no function names .%s: the test no longer looks at the loop's state", name)
		}
	}
}
