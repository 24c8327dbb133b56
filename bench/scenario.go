package bench

import (
	"bytes"
	"embed"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"slices"
	"sort"
	"time"

	"github.com/pelletier/go-toml/v2"

	"github.com/ortbus/ortbus/config"
	"github.com/ortbus/ortbus/subjects"
)

//go:embed scenarios/*.toml
var builtinScenarios embed.FS

// Scenario is a collision scenario (bench/scenarios/collision.toml documents the keys).
type Scenario struct {
	// Name is the file it was read from.
	Name         string          `toml:"-" json:"name"`
	Seed         uint64          `toml:"seed" json:"seed"`
	Window       config.Duration `toml:"window" json:"window"`
	DrainTimeout config.Duration `toml:"drain_timeout" json:"drain_timeout"`
	HeavyLayers  int             `toml:"heavy_layers" json:"heavy_layers"`
	Pools        []ScenarioPool  `toml:"pool" json:"pools"`
	Classes      []ScenarioClass `toml:"class" json:"classes"`
}

// ScenarioPool is one pool of a scenario.
type ScenarioPool struct {
	Name     string          `toml:"name" json:"name"`
	Workers  int             `toml:"workers" json:"workers"`
	Slots    int             `toml:"slots" json:"slots,omitempty"`
	Threads  int             `toml:"threads" json:"threads"`
	Device   string          `toml:"device" json:"device"`
	Classes  []string        `toml:"classes" json:"classes"`
	Models   []string        `toml:"models" json:"models"`
	MaxBatch int             `toml:"max_batch" json:"max_batch,omitempty"`
	MaxDelay config.Duration `toml:"max_delay" json:"max_delay,omitempty"`
	// Nice lowers the pool's CPU priority under the sharing policy (not under fifo).
	Nice int `toml:"nice" json:"nice,omitempty"`
}

// ScenarioClass is one class of a scenario: what its requests are and when they arrive.
type ScenarioClass struct {
	Name       string          `toml:"name" json:"name"`
	Op         string          `toml:"op" json:"op"`
	Model      string          `toml:"model" json:"model"`
	Image      int             `toml:"image" json:"image,omitempty"`
	Timeout    config.Duration `toml:"timeout" json:"timeout"`
	QueueBound int             `toml:"queue_bound" json:"queue_bound,omitempty"`
	Arrival    string          `toml:"arrival" json:"arrival"`
	Interval   config.Duration `toml:"interval" json:"interval,omitempty"`
	Rate       float64         `toml:"rate" json:"rate,omitempty"`
	Count      int             `toml:"count" json:"count,omitempty"`
	Start      config.Duration `toml:"start" json:"start,omitempty"`
	Spread     config.Duration `toml:"spread" json:"spread,omitempty"`
}

// The models a scenario may name, and the ops they serve.
var scenarioModels = map[string]string{"tiny": subjects.OpInfer, "tagger": subjects.OpTag, "heavy": subjects.OpTag}

// LoadScenario reads a scenario: a TOML file, or a built-in one: "" or "default"
// (scenarios/collision.toml), "onepool" (collision-onepool.toml), "short"
// (collision-short.toml, for tests).
func LoadScenario(name string) (*Scenario, error) {
	var data []byte
	var err error
	switch name {
	case "", "default":
		name = "scenarios/collision.toml"
		data, err = builtinScenarios.ReadFile(name)
	case "onepool", "short":
		name = "scenarios/collision-" + name + ".toml"
		data, err = builtinScenarios.ReadFile(name)
	default:
		data, err = os.ReadFile(name)
	}
	if err != nil {
		return nil, fmt.Errorf("scenario: %w", err)
	}
	return ParseScenario(data, name)
}

// ParseScenario decodes and checks a scenario.
func ParseScenario(data []byte, name string) (*Scenario, error) {
	s := &Scenario{Name: name}
	dec := toml.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(s); err != nil {
		return nil, fmt.Errorf("scenario %s: %w", name, err)
	}
	if err := s.check(); err != nil {
		return nil, fmt.Errorf("scenario %s: %w", name, err)
	}
	return s, nil
}

func (s *Scenario) check() error {
	if s.Window <= 0 {
		return fmt.Errorf("window must be > 0")
	}
	if s.DrainTimeout <= 0 {
		s.DrainTimeout = config.Duration(2 * time.Minute)
	}
	if s.HeavyLayers < 0 {
		return fmt.Errorf("heavy_layers must be >= 0")
	}
	if len(s.Pools) == 0 || len(s.Classes) == 0 {
		return fmt.Errorf("needs at least one [[pool]] and one [[class]]")
	}
	std := []string{subjects.ClassUrgent, subjects.ClassInteractive, subjects.ClassBatch}
	for _, p := range s.Pools {
		if err := subjects.ValidateToken("pool", p.Name); err != nil {
			return err
		}
		for _, m := range p.Models {
			if _, ok := scenarioModels[m]; !ok {
				return fmt.Errorf("pool %s: unknown model %q (want tiny, tagger or heavy)", p.Name, m)
			}
			if m == "heavy" && s.HeavyLayers == 0 {
				return fmt.Errorf("pool %s loads heavy but heavy_layers is 0", p.Name)
			}
		}
		for _, c := range p.Classes {
			if !slices.Contains(std, c) {
				return fmt.Errorf("pool %s: unknown class %q (want urgent, interactive or batch)", p.Name, c)
			}
		}
	}
	seen := map[string]bool{}
	for i := range s.Classes {
		c := &s.Classes[i]
		if !slices.Contains(std, c.Name) || seen[c.Name] {
			return fmt.Errorf("class %q: want each of urgent, interactive, batch at most once", c.Name)
		}
		seen[c.Name] = true
		op, ok := scenarioModels[c.Model]
		if !ok || op != c.Op {
			return fmt.Errorf("class %s: model %q does not serve op %q (tiny: infer; tagger, heavy: tag)", c.Name, c.Model, c.Op)
		}
		if c.Op == subjects.OpTag && c.Image == 0 {
			c.Image = 256
		}
		if len(s.chain(c.Name, c.Model)) == 0 {
			return fmt.Errorf("class %s: no pool serves it with model %s", c.Name, c.Model)
		}
		if c.Timeout <= 0 {
			return fmt.Errorf("class %s: timeout must be > 0", c.Name)
		}
		switch c.Arrival {
		case "periodic":
			if c.Interval <= 0 {
				return fmt.Errorf("class %s: periodic arrivals need interval > 0", c.Name)
			}
		case "poisson":
			if c.Rate <= 0 {
				return fmt.Errorf("class %s: poisson arrivals need rate > 0", c.Name)
			}
		case "burst":
			if c.Count <= 0 {
				return fmt.Errorf("class %s: a burst needs count > 0", c.Name)
			}
		default:
			return fmt.Errorf("class %s: arrival %q (want periodic, poisson or burst)", c.Name, c.Arrival)
		}
	}
	return nil
}

// chain is the pools serving class that load model, in file order.
func (s *Scenario) chain(class, model string) []string {
	var out []string
	for _, p := range s.Pools {
		if slices.Contains(p.Classes, class) && slices.Contains(p.Models, model) {
			out = append(out, p.Name)
		}
	}
	return out
}

// arrival is one request of the schedule: when (since the run's start) and which class
// (an index into Classes).
type arrival struct {
	At    time.Duration
	Class int
}

// Schedule is the arrival schedule: deterministic for a seed, in time order.
func (s *Scenario) Schedule() []arrival {
	var out []arrival
	window := s.Window.D()
	for ci, c := range s.Classes {
		rng := rand.New(rand.NewPCG(s.Seed, uint64(ci+1)))
		at := c.Start.D()
		capped := func(n int) bool { return c.Count > 0 && n >= c.Count }
		switch c.Arrival {
		case "periodic":
			for n := 0; at < window && !capped(n); n++ {
				out = append(out, arrival{at, ci})
				at += c.Interval.D()
			}
		case "poisson":
			for n := 0; !capped(n); n++ {
				at += time.Duration(-math.Log(1-rng.Float64()) / c.Rate * float64(time.Second))
				if at >= window {
					break
				}
				out = append(out, arrival{at, ci})
			}
		case "burst":
			for n := 0; n < c.Count; n++ {
				out = append(out, arrival{at + time.Duration(int64(c.Spread.D())*int64(n)/int64(c.Count)), ci})
			}
		}
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].At < out[j].At })
	return out
}
