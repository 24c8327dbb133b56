package config

import (
	"bytes"
	"fmt"
	"os"
	"slices"

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
