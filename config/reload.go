package config

import (
	"bytes"
	"fmt"
	"maps"
	"path/filepath"
	"reflect"
	"slices"
	"strings"

	"github.com/pelletier/go-toml/v2"

	"github.com/ortbus/ortbus/codec"
)

// Changes is what a new configuration changes of the one in force, as a gateway's reload
// applies it (gateway/reload.go): the local pools whose workers must be replaced, the
// pools whose models change in place (their workers kept), and what changes only the
// gateway's own decisions.
type Changes struct {
	// Added and Removed are pools new in the next config, and pools it no longer has.
	Added, Removed []string
	// Changed are the pools present in both whose workers must be replaced, each with
	// why: its own table changed (threads, ep, workers, device, ...).
	Changed map[string]string
	// Models are the pools present in both, their own table unchanged, whose models change
	// in place: loaded, unloaded, or reloaded (a model's table changed, or `ortbus model
	// reload`), each by its workers without a restart.
	Models map[string]ModelChanges
	// Routing lists the changes that only the gateway's routing reads (class chains and
	// default models, timeouts, min_share, degrade, devices).
	Routing []string
}

// ModelChanges is how one pool's models change in place: the models it starts loading,
// stops loading, and loads again (a new copy, swapped for the one serving).
type ModelChanges struct {
	Load, Unload, Reload []string
}

// Empty reports whether no model changes.
func (m ModelChanges) Empty() bool {
	return len(m.Load) == 0 && len(m.Unload) == 0 && len(m.Reload) == 0
}

// String is the change in one line: "models +a -b", "model c reloaded", or both.
func (m ModelChanges) String() string {
	var parts []string
	var d []string
	for _, x := range m.Load {
		d = append(d, "+"+x)
	}
	for _, x := range m.Unload {
		d = append(d, "-"+x)
	}
	if len(d) > 0 {
		parts = append(parts, "models "+strings.Join(d, " "))
	}
	if len(m.Reload) > 0 {
		parts = append(parts, "model "+strings.Join(m.Reload, ", ")+" reloaded")
	}
	return strings.Join(parts, "; ")
}

// Empty reports whether nothing changes.
func (c *Changes) Empty() bool {
	return len(c.Added) == 0 && len(c.Removed) == 0 && len(c.Changed) == 0 && len(c.Models) == 0 && len(c.Routing) == 0
}

// Pools are the pools whose workers the change starts, stops or replaces, sorted (not
// those whose models change in place: their workers stay).
func (c *Changes) Pools() []string {
	out := append(append(slices.Clone(c.Added), c.Removed...), slices.Sorted(maps.Keys(c.Changed))...)
	slices.Sort(out)
	return out
}

// InPlace is the per-pool lines of the pools whose models change in place.
func (c *Changes) InPlace() map[string]string {
	if len(c.Models) == 0 {
		return nil
	}
	out := make(map[string]string, len(c.Models))
	for p, m := range c.Models {
		out[p] = m.String()
	}
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
	for _, p := range slices.Sorted(maps.Keys(c.Models)) {
		parts = append(parts, "pool "+p+": "+c.Models[p].String()+" (in place)")
	}
	parts = append(parts, c.Routing...)
	if len(parts) == 0 {
		return "no change"
	}
	return strings.Join(parts, "; ")
}

// Diff is what next changes of cur, both valid configurations. A reload applies pools
// (added, removed, replaced when their own table changed), models (loaded, unloaded and
// reloaded in place by the workers of the pools that load them: a pool whose only change
// is its model list, or the table of a model it loads), devices, and of each class its
// chain, default models, timeouts, min_share and degrade. A pool's models are compared as
// a set: an order is not a change (a run-time unload and load of a model puts it last in
// the list in force, and a reload of the unchanged file must replace nothing), so the
// same models in another order change nothing, and the workers keep the order they
// serve in until they restart; a model it starts loading may go anywhere in its list. Anything else — [nats], [gateway], [health], [security], [jobs], [cache],
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
	ch := &Changes{Changed: map[string]string{}, Models: map[string]ModelChanges{}}
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
		default:
			var mc ModelChanges
			for _, m := range b.Models {
				switch {
				case !slices.Contains(a.Models, m):
					mc.Load = append(mc.Load, m)
				case modelChanged(m):
					mc.Reload = append(mc.Reload, m)
				}
			}
			for _, m := range a.Models {
				if !slices.Contains(b.Models, m) {
					mc.Unload = append(mc.Unload, m)
				}
			}
			if !mc.Empty() {
				ch.Models[name] = mc
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

// union is the names of a and b, sorted, each once.
func union(a, b []string) []string {
	out := slices.Concat(a, b)
	slices.Sort(out)
	return slices.Compact(out)
}

// WithPoolModels is a copy of c in which pool loads models (a model operation of the
// operators' API: load or unload one model without editing the file). It shares every
// table but the pool's. A pool loads at most codec.MaxHeartbeatList models, as in the
// file.
func (c *Config) WithPoolModels(pool string, models []string) (*Config, error) {
	p := c.Pools[pool]
	if p == nil {
		return nil, fmt.Errorf("pool %q is not configured", pool)
	}
	if len(models) > codec.MaxHeartbeatList {
		return nil, fmt.Errorf("pool %s would load %d models: a pool loads at most %d models (split it into pools)", pool, len(models), codec.MaxHeartbeatList)
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

// ControlKeyEnv is the environment variable through which the gateway's supervisor gives
// each worker it starts the key (hex) under which the gateway signs the worker's load and
// unload control verbs (codec.WorkerLoad): a worker without it takes neither.
const ControlKeyEnv = "ORTBUS_CONTROL_KEY"

// MarshalModel is model m's table as TOML, as the file's [models.NAME] holds it (its dir
// made absolute by Load): the body of a worker's load control verb (codec.WorkerLoad).
func MarshalModel(m *Model) ([]byte, error) {
	b, err := toml.Marshal(m)
	if err != nil {
		return nil, fmt.Errorf("config: model %s: %w", m.Name, err)
	}
	return b, nil
}

// ParseModel reads model name's table (MarshalModel's text, from the wire) as Load reads
// a [models.NAME] table: strictly (an unknown key is refused), then validated as the
// file's models are (its name a subject token, a known kind, dir or hf_repo, thresholds
// in [0, 1], ...). Its dir must be absolute: the sender resolved it against its own file.
// Hostile text is refused, never a panic.
func ParseModel(name string, table []byte) (m *Model, err error) {
	defer func() {
		if v := recover(); v != nil {
			m, err = nil, &Error{Key: "models." + name, Reason: fmt.Sprintf("unreadable table: %v", v)}
		}
	}()
	if len(table) > codec.MaxModelTable {
		return nil, &Error{Key: "models." + name, Reason: fmt.Sprintf("table of %d bytes, over the limit of %d", len(table), codec.MaxModelTable)}
	}
	c := &Config{}
	m = &Model{}
	dec := toml.NewDecoder(bytes.NewReader(table))
	dec.DisallowUnknownFields()
	if err := dec.Decode(m); err != nil {
		return nil, fmt.Errorf("models.%s: %w", name, c.decodeError(err))
	}
	if m.Dir != "" && !filepath.IsAbs(m.Dir) {
		return nil, c.errf("models."+name+".dir", "%q is relative: the table of a load names its dir in full", m.Dir)
	}
	m.Name = name
	dir := m.Dir
	if err := c.validateModel(name, m); err != nil {
		return nil, err
	}
	if dir != "" {
		m.Dir = filepath.Clean(dir) // expanded by the sender already: not again
	}
	return m, nil
}
