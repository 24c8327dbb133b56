package config

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"

	"github.com/pelletier/go-toml/v2"
	"github.com/pelletier/go-toml/v2/unstable"
)

// Known execution providers.
// webgpu is ONNX Runtime's WebGPU EP (Dawn over Vulkan on Linux), in the library
// onnxruntime-node ships: NVIDIA, AMD and Intel GPUs alike, and lavapipe on a CPU.
var KnownEPs = []string{"cpu", "cuda", "openvino", "tensorrt", "webgpu"}

// Scheduling policies.
const (
	PolicyPriority = "priority"
	PolicyFIFO     = "fifo"
)

// Identity modes (gateway.identity).
const (
	IdentityLocal   = "local"
	IdentityAccount = "account"
)

// Shed policies.
const (
	ShedRejectNew  = "reject_new"
	ShedDropOldest = "drop_oldest"
)

// Load reads and validates the configuration file at path.
func Load(path string) (*Config, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("config: %w", err)
	}
	abs, err := filepath.Abs(path)
	if err != nil {
		return nil, fmt.Errorf("config: %w", err)
	}
	return Parse(data, abs)
}

// Parse decodes and validates a configuration; file names it in errors and is the base of
// relative paths (its directory; the working directory when file is "").
func Parse(data []byte, file string) (*Config, error) {
	c := &Config{File: file}
	dec := toml.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(c); err != nil {
		return nil, c.decodeError(err)
	}
	c.lines = keyLines(data)
	c.applyDefaults()
	if err := c.validate(); err != nil {
		return nil, err
	}
	return c, nil
}

// Error is one problem in a configuration file.
type Error struct {
	File   string
	Line   int
	Key    string
	Reason string
}

func (e *Error) Error() string {
	var b strings.Builder
	b.WriteString("config ")
	if e.File != "" {
		b.WriteString(e.File)
	} else {
		b.WriteString("<input>")
	}
	if e.Line > 0 {
		fmt.Fprintf(&b, ":%d", e.Line)
	}
	if e.Key != "" {
		b.WriteString(": " + e.Key)
	}
	b.WriteString(": " + e.Reason)
	return b.String()
}

func (c *Config) decodeError(err error) error {
	var strict *toml.StrictMissingError
	if errors.As(err, &strict) {
		var errs []error
		for _, e := range strict.Errors {
			line, _ := e.Position()
			errs = append(errs, &Error{File: c.File, Line: line, Key: strings.Join(e.Key(), "."), Reason: "unknown key"})
		}
		return errors.Join(errs...)
	}
	var de *toml.DecodeError
	if errors.As(err, &de) {
		line, _ := de.Position()
		return &Error{File: c.File, Line: line, Key: strings.Join(de.Key(), "."), Reason: strings.TrimPrefix(de.Error(), "toml: ")}
	}
	return &Error{File: c.File, Reason: err.Error()}
}

// keyLines maps every dotted key path written in the file (tables and keys) to its line.
func keyLines(data []byte) map[string]int {
	lines := map[string]int{}
	p := unstable.Parser{}
	p.Reset(data)
	var table []string
	lineOf := func(n *unstable.Node) int {
		r := p.Range(n.Data)
		return bytes.Count(data[:r.Offset], []byte("\n")) + 1
	}
	keyOf := func(n *unstable.Node) ([]string, int) {
		var parts []string
		line := 0
		for it := n.Key(); it.Next(); {
			k := it.Node()
			if line == 0 {
				line = lineOf(k)
			}
			parts = append(parts, string(k.Data))
		}
		return parts, line
	}
	for p.NextExpression() {
		e := p.Expression()
		switch e.Kind {
		case unstable.Table, unstable.ArrayTable:
			k, line := keyOf(e)
			table = k
			lines[strings.Join(k, ".")] = line
		case unstable.KeyValue:
			k, line := keyOf(e)
			full := append(append([]string{}, table...), k...)
			lines[strings.Join(full, ".")] = line
		}
	}
	return lines
}

// Line returns the line of a dotted key in the file, or of its nearest written parent.
func (c *Config) Line(key string) int {
	for key != "" {
		if l, ok := c.lines[key]; ok {
			return l
		}
		i := strings.LastIndexByte(key, '.')
		if i < 0 {
			break
		}
		key = key[:i]
	}
	return 0
}

// Order returns names of a section (pools, models, classes) in the order the file wrote
// them (or SetOrder set); maps lose it, and routing chains and listings should keep it.
func (c *Config) Order(section string, names []string) []string {
	rank := func(name string) int { return c.Line(section + "." + name) }
	if set, ok := c.order[section]; ok {
		rank = func(name string) int {
			if i := slices.Index(set, name); i >= 0 {
				return i
			}
			return len(set)
		}
	}
	out := append([]string(nil), names...)
	sort.SliceStable(out, func(i, j int) bool {
		ri, rj := rank(out[i]), rank(out[j])
		if ri != rj {
			return ri < rj
		}
		return out[i] < out[j]
	})
	return out
}

// PoolNames returns the pools in file order.
// Pool is the pool called name, or an empty pool of that name when the config has none
// (a pool removed by a reload while a request still names it: no device, no models, no
// classes).
func (c *Config) Pool(name string) *Pool {
	if p := c.Pools[name]; p != nil {
		return p
	}
	return &Pool{Name: name}
}

func (c *Config) PoolNames() []string {
	var names []string
	for n := range c.Pools {
		names = append(names, n)
	}
	return c.Order("pools", names)
}

// ClassNames returns the classes by priority (then name).
func (c *Config) ClassNames() []string {
	var names []string
	for n := range c.Classes {
		names = append(names, n)
	}
	sort.Slice(names, func(i, j int) bool {
		a, b := c.Classes[names[i]], c.Classes[names[j]]
		if a.Priority != b.Priority {
			return a.Priority < b.Priority
		}
		return names[i] < names[j]
	})
	return names
}

// Path resolves a path written in the file: environment variables are expanded and a
// relative path is taken from the file's directory.
func (c *Config) Path(p string) string {
	if p == "" {
		return ""
	}
	p = os.ExpandEnv(p)
	if filepath.IsAbs(p) {
		return filepath.Clean(p)
	}
	base := "."
	if c.File != "" {
		base = filepath.Dir(c.File)
	}
	abs, err := filepath.Abs(filepath.Join(base, p))
	if err != nil {
		return filepath.Join(base, p)
	}
	return abs
}

func (c *Config) errf(key, format string, args ...any) error {
	return &Error{File: c.File, Line: c.Line(key), Key: key, Reason: fmt.Sprintf(format, args...)}
}
