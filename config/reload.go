package config

import (
	"fmt"
	"maps"
	"reflect"
	"slices"
	"strings"
)

// Changes is what a new configuration changes of the one in force, as a gateway's reload
// applies it (gateway/reload.go): the local pools whose workers must be replaced, and
// what changes only the gateway's own decisions.
type Changes struct {
	// Added and Removed are pools new in the next config, and pools it no longer has.
	Added, Removed []string
	// Changed are the pools present in both whose workers must be replaced, each with
	// why: its own table changed, or its model list, or the table of a model it loads.
	Changed map[string]string
	// Routing lists the changes that only the gateway's routing reads (class chains and
	// default models, timeouts, min_share, degrade, devices).
	Routing []string
}

// Empty reports whether nothing changes.
func (c *Changes) Empty() bool {
	return len(c.Added) == 0 && len(c.Removed) == 0 && len(c.Changed) == 0 && len(c.Routing) == 0
}

// Pools are the pools whose workers the change starts, stops or replaces, sorted.
func (c *Changes) Pools() []string {
	out := append(append(slices.Clone(c.Added), c.Removed...), slices.Sorted(maps.Keys(c.Changed))...)
	slices.Sort(out)
	return out
}

// String is the changes in one line, for a log or a reply.
func (c *Changes) String() string {
	var parts []string
	for _, p := range c.Added {
		parts = append(parts, "pool "+p+" added")
	}
	for _, p := range c.Removed {
		parts = append(parts, "pool "+p+" removed")
	}
	for _, p := range slices.Sorted(maps.Keys(c.Changed)) {
		parts = append(parts, "pool "+p+": "+c.Changed[p])
	}
	parts = append(parts, c.Routing...)
	if len(parts) == 0 {
		return "no change"
	}
	return strings.Join(parts, "; ")
}

// Diff is what next changes of cur, both valid configurations. A reload applies pools
// (added, removed, replaced), models (added, removed, replaced: the pools that load them
// are replaced), devices, and of each class its chain, default models, timeouts,
// min_share and degrade. Anything else — [nats], [gateway], [health], [security], [jobs], [cache],
// the set of classes, a class's priority or queue (queue_bound, queue_bytes, shed) — is
// read once at start: Diff refuses it with an error naming each, and the gateway keeps
// the configuration in force (restart it to apply them).
func Diff(cur, next *Config) (*Changes, error) {
	var restart []string
	for _, s := range []struct {
		name string
		a, b any
	}{
		{"[nats]", cur.NATS, next.NATS},
		{"[gateway]", cur.Gateway, next.Gateway},
		{"[health]", cur.Health, next.Health},
		{"[security]", cur.Security, next.Security},
		{"[jobs]", cur.Jobs, next.Jobs},
		{"[cache]", cur.Cache, next.Cache},
	} {
		if !reflect.DeepEqual(s.a, s.b) {
			restart = append(restart, s.name)
		}
	}
	ch := &Changes{Changed: map[string]string{}}
	for _, name := range union(keys(cur.Classes), keys(next.Classes)) {
		a, b := cur.Classes[name], next.Classes[name]
		switch {
		case a == nil:
			restart = append(restart, "[classes."+name+"] added")
		case b == nil:
			restart = append(restart, "[classes."+name+"] removed")
		case a.Priority != b.Priority || a.QueueBound != b.QueueBound || a.QueueBytes != b.QueueBytes || a.Shed != b.Shed:
			restart = append(restart, "[classes."+name+"] priority or queue")
		case !reflect.DeepEqual(a, b):
			ch.Routing = append(ch.Routing, "class "+name+" changed")
		}
	}
	if len(restart) > 0 {
		return nil, fmt.Errorf("a reload cannot change %s: restart the gateway to apply them (nothing was changed)", strings.Join(restart, ", "))
	}
	if !reflect.DeepEqual(cur.Devices, next.Devices) {
		ch.Routing = append(ch.Routing, "devices changed")
	}
	modelChanged := func(m string) bool { return !reflect.DeepEqual(cur.Models[m], next.Models[m]) }
	for _, name := range union(keys(cur.Pools), keys(next.Pools)) {
		a, b := cur.Pools[name], next.Pools[name]
		switch {
		case a == nil:
			ch.Added = append(ch.Added, name)
		case b == nil:
			ch.Removed = append(ch.Removed, name)
		case !reflect.DeepEqual(withoutModels(a), withoutModels(b)):
			ch.Changed[name] = "pool table changed"
		case !slices.Equal(a.Models, b.Models):
			ch.Changed[name] = modelsDelta(a.Models, b.Models)
		default:
			var replaced []string
			for _, m := range b.Models {
				if modelChanged(m) {
					replaced = append(replaced, m)
				}
			}
			if len(replaced) > 0 {
				ch.Changed[name] = "model " + strings.Join(replaced, ", ") + " changed"
			}
		}
	}
	return ch, nil
}

// withoutModels is a copy of p without its model list.
func withoutModels(p *Pool) Pool {
	c := *p
	c.Models = nil
	return c
}

// modelsDelta says how a pool's model list changed: "models +a -b" (or reordered).
func modelsDelta(a, b []string) string {
	var d []string
	for _, m := range b {
		if !slices.Contains(a, m) {
			d = append(d, "+"+m)
		}
	}
	for _, m := range a {
		if !slices.Contains(b, m) {
			d = append(d, "-"+m)
		}
	}
	if len(d) == 0 {
		return "models reordered"
	}
	return "models " + strings.Join(d, " ")
}

// union is the names of a and b, sorted, each once.
func union(a, b []string) []string {
	out := slices.Concat(a, b)
	slices.Sort(out)
	return slices.Compact(out)
}

// WithPoolModels is a copy of c in which pool loads models (a model operation of the
// operators' API: load or unload one model without editing the file). It shares every
// table but the pool's.
func (c *Config) WithPoolModels(pool string, models []string) (*Config, error) {
	p := c.Pools[pool]
	if p == nil {
		return nil, fmt.Errorf("pool %q is not configured", pool)
	}
	for _, m := range models {
		if c.Models[m] == nil {
			return nil, fmt.Errorf("model %q is not configured ([models.%s])", m, m)
		}
	}
	next := *c
	next.Pools = make(map[string]*Pool, len(c.Pools))
	for k, v := range c.Pools {
		next.Pools[k] = v
	}
	np := *p
	np.Models = slices.Clone(models)
	next.Pools[pool] = &np
	return &next, nil
}
