package config

import (
	"bytes"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/pelletier/go-toml/v2"
)

// Marshal writes a configuration as TOML that Load reads back into the same values: a
// configuration that Load returned comes back equal (its defaults were applied, its paths
// made absolute); one built in code comes back as a file that leaves out what it leaves
// zero would, with Load's defaults applied.
//
// A key whose value is zero is left out, and Load gives it its default, except for the
// keys whose zero is a value of its own (security.spool_max_age, gateway.reserve_window, a
// class's priority and min_share), which are always written: as their default when a configuration built in
// code leaves them zero. Pools, classes and models are written in the order of Order, so
// that routing chains and listings keep it (SetOrder sets it for a configuration built in
// code).
func Marshal(c *Config) ([]byte, error) {
	w := *c
	w.Classes = make(map[string]*Class, len(c.Classes))
	for name, cl := range c.Classes {
		var x Class
		if cl != nil {
			x = *cl
		}
		w.Classes[name] = &x
	}
	w.applyZeroDefaults()

	top := w
	top.Classes, top.Pools, top.Models = nil, nil, nil
	out, err := toml.Marshal(top)
	if err != nil {
		return nil, fmt.Errorf("config: %w", err)
	}
	for _, sec := range []struct {
		name string
		m    map[string]any
	}{
		{"classes", anyMap(w.Classes)},
		{"pools", anyMap(w.Pools)},
		{"models", anyMap(w.Models)},
	} {
		// One table at a time, in order: go-toml sorts a map's keys. Each comes with the
		// header of its section ([pools]), which may only be written once.
		for _, name := range w.Order(sec.name, keys(sec.m)) {
			b, err := toml.Marshal(map[string]map[string]any{sec.name: {name: sec.m[name]}})
			if err != nil {
				return nil, fmt.Errorf("config: %s.%s: %w", sec.name, name, err)
			}
			out = append(append(out, '\n'), bytes.TrimPrefix(b, []byte("["+sec.name+"]\n"))...)
		}
	}
	return out, nil
}

// Write writes c (Marshal) to the file path.
func Write(path string, c *Config) error {
	b, err := Marshal(c)
	if err != nil {
		return err
	}
	return os.WriteFile(path, b, 0o644)
}

// SetOrder sets the order of a section's names (pools, classes, models) in a configuration
// built in code, which Order (and so the default routing chains and Marshal) then follows;
// names it leaves out come after, by name. A configuration read from a file has the order
// of the file.
func (c *Config) SetOrder(section string, names ...string) {
	if c.order == nil {
		c.order = map[string][]string{}
	}
	c.order[section] = slices.Clone(names)
}

// anyMap is m with its values as any, the nil ones as zero values (an empty table).
func anyMap[V any](m map[string]*V) map[string]any {
	out := make(map[string]any, len(m))
	for k, v := range m {
		if v == nil {
			v = new(V)
		}
		out[k] = v
	}
	return out
}

// EditPool sets keys of pool's table in the config file at path, each value written as
// the TOML value given, keeping every other line and comment: a key the table has is
// replaced in place (its comment kept), a missing one is added under the table's header.
// The edited file is loaded (checked) before it replaces the file; on any error the file
// is left as it was. The pool must be a [pools.NAME] table of its own.
func EditPool(path, pool string, keys map[string]string) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	lines := strings.Split(string(b), "\n")
	header := "[pools." + pool + "]"
	start := -1
	for i, l := range lines {
		if strings.TrimSpace(stripComment(l)) == header {
			start = i
			break
		}
	}
	if start < 0 {
		return fmt.Errorf("%s: no %s table to edit", path, header)
	}
	end := len(lines)
	for i := start + 1; i < len(lines); i++ {
		if strings.HasPrefix(strings.TrimSpace(lines[i]), "[") {
			end = i
			break
		}
	}
	done := map[string]bool{}
	for i := start + 1; i < end; i++ {
		k, _, ok := strings.Cut(stripComment(lines[i]), "=")
		k = strings.TrimSpace(k)
		v, want := keys[k]
		if !ok || !want || done[k] {
			continue
		}
		comment := ""
		if c := strings.Index(lines[i], "#"); c >= 0 && stripComment(lines[i]) != lines[i] {
			comment = "   " + lines[i][c:]
		}
		lines[i] = k + " = " + v + comment
		done[k] = true
	}
	var add []string
	for _, k := range slices.Sorted(maps.Keys(keys)) {
		if !done[k] {
			add = append(add, k+" = "+keys[k])
		}
	}
	lines = slices.Insert(lines, start+1, add...)
	tmp := filepath.Join(filepath.Dir(path), "."+filepath.Base(path)+".edit")
	if err := os.WriteFile(tmp, []byte(strings.Join(lines, "\n")), 0o644); err != nil {
		return err
	}
	defer os.Remove(tmp)
	if _, err := Load(tmp); err != nil {
		return fmt.Errorf("the edited config is not valid (the file is unchanged): %w", err)
	}
	return os.Rename(tmp, path)
}

// stripComment is a line without its comment (a # outside a string).
func stripComment(l string) string {
	in := byte(0)
	for i := 0; i < len(l); i++ {
		switch c := l[i]; {
		case in != 0 && c == '\\' && in == '"':
			i++
		case in != 0 && c == in:
			in = 0
		case in == 0 && (c == '"' || c == '\''):
			in = c
		case in == 0 && c == '#':
			return l[:i]
		}
	}
	return l
}
