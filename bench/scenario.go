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
	"strings"
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
	// Capacity is the load steps of `bench capacity` (nil in collision scenarios).
	Capacity *CapacityPlan `toml:"capacity" json:"capacity,omitempty"`
	// Tenant is the LLM-shaped tenant (tenant.go, tenantrun.go): a process outside ortbus,
	// under `ortbus lease`, answering long-context prompts beside the classes (nil: none).
	Tenant *TenantPlan `toml:"tenant" json:"tenant,omitempty"`
	// Devices declares devices' memory capacities ([devices.NAME] capacity), e.g. for a
	// device a tenant leases memory on. The name "gpu" is the GPU placeholder's (see
	// GPUDevice): its capacity is used only where no GPU is found.
	Devices map[string]config.Bytes `toml:"devices" json:"devices,omitempty"`
	// NoFIFO leaves out the run under FIFO: the GPU scenarios compare the runs with and
	// without the gate with the solo runs, not the policy with FIFO.
	NoFIFO bool `toml:"no_fifo" json:"no_fifo,omitempty"`
	// Degrade is the degrade run (degrade.go): a pool's worker killed mid-run (nil: none).
	Degrade *DegradePlan `toml:"degrade" json:"degrade,omitempty"`
}

// CapacityPlan is the [capacity] table: the load steps of `bench capacity`. Step i runs
// Streams[i] audio streams in the stream class and the Poisson class at Rates[i] per
// second, for Window (the scenario's window when 0), against the constant flood.
type CapacityPlan struct {
	Streams []int           `toml:"streams" json:"streams"`
	Rates   []float64       `toml:"rates" json:"rates"`
	Window  config.Duration `toml:"window" json:"window,omitempty"`
	// AfterKnee is how many steps a run goes on after its knee (the first step where a
	// class misses its target), to show the curve bending; < 0 = every step.
	AfterKnee int `toml:"after_knee" json:"after_knee"`
	// Tenants, when set (as long as Streams), is step i's count of LLM tenant processes
	// (the scenario's [tenant]); 0 = none at that step.
	Tenants []int `toml:"tenants" json:"tenants,omitempty"`
}

// ScenarioPool is one pool of a scenario.
type ScenarioPool struct {
	Name    string `toml:"name" json:"name"`
	Workers int    `toml:"workers" json:"workers"`
	Slots   int    `toml:"slots" json:"slots,omitempty"`
	Threads int    `toml:"threads" json:"threads"`
	Device  string `toml:"device" json:"device"`
	// EP is the pool's execution provider: "cpu" ("" too) or "webgpu" (strict: no
	// fallback EP).
	EP       string          `toml:"ep" json:"ep,omitempty"`
	Classes  []string        `toml:"classes" json:"classes"`
	Models   []string        `toml:"models" json:"models"`
	MaxBatch int             `toml:"max_batch" json:"max_batch,omitempty"`
	MaxDelay config.Duration `toml:"max_delay" json:"max_delay,omitempty"`
	// Nice lowers the pool's CPU priority under the sharing policy (not under fifo).
	Nice int `toml:"nice" json:"nice,omitempty"`
	// AdapterMismatch is set by the harness, not the file: "flag" for a webgpu pool on
	// the logical GPU of a machine without one (its smoke runs on lavapipe, flagged).
	AdapterMismatch string `toml:"-" json:"adapter_mismatch,omitempty"`
}

// ScenarioClass is one class of a scenario: what its requests are and when they arrive.
type ScenarioClass struct {
	Name  string `toml:"name" json:"name"`
	Op    string `toml:"op" json:"op"`
	Model string `toml:"model" json:"model"`
	// Image is a tag class's image side (default 256), or an ocr class's detector input
	// side, a multiple of 32 (default OCRPathSide, 640).
	Image      int             `toml:"image" json:"image,omitempty"`
	Timeout    config.Duration `toml:"timeout" json:"timeout"`
	QueueBound int             `toml:"queue_bound" json:"queue_bound,omitempty"`
	Arrival    string          `toml:"arrival" json:"arrival"`
	Interval   config.Duration `toml:"interval" json:"interval,omitempty"`
	Rate       float64         `toml:"rate" json:"rate,omitempty"`
	Count      int             `toml:"count" json:"count,omitempty"`
	Start      config.Duration `toml:"start" json:"start,omitempty"`
	Spread     config.Duration `toml:"spread" json:"spread,omitempty"`
	// Every repeats a burst every that long from its start while within the window
	// (camera-frame bursts); 0 = one burst.
	Every config.Duration `toml:"every" json:"every,omitempty"`
	// Degrade is the class's [classes.NAME] degrade: when the chain's first pool cannot
	// meet a request's deadline with its device loaded, the next pool takes it.
	Degrade bool `toml:"degrade" json:"degrade,omitempty"`
	// Streams is the number of audio streams of an arrival = "stream" class.
	Streams int `toml:"streams" json:"streams,omitempty"`
	// InFlight is how many requests an arrival = "flood" class keeps outstanding.
	InFlight int `toml:"inflight" json:"inflight,omitempty"`
	// TargetP95 and MaxMissed are the class's target in `bench capacity`: p95 latency at
	// most TargetP95 (default: timeout) and at most MaxMissed of its requests (a fraction;
	// default 0.01) missed: deadline misses (dropped frames), errors and unanswered.
	// A flood class has no target.
	TargetP95 config.Duration `toml:"target_p95" json:"target_p95,omitempty"`
	MaxMissed float64         `toml:"max_missed" json:"max_missed,omitempty"`
}

// The models a scenario may name, and the ops they serve: generated (tiny, tagger,
// heavy) and fetched (vad: Silero VAD v5, frames of an audio stream; ocr: the PP-OCRv4
// detector at 640x640 by path).
var scenarioModels = map[string]string{"tiny": subjects.OpInfer, "tagger": subjects.OpTag, "heavy": subjects.OpTag,
	"vad": subjects.OpInfer, "ocr": subjects.OpInfer}

// uses reports whether a pool of the scenario loads model.
func (s *Scenario) uses(model string) bool {
	for _, p := range s.Pools {
		if slices.Contains(p.Models, model) {
			return true
		}
	}
	return false
}

// LoadScenario reads a scenario: a TOML file, or a built-in one: "" or "default"
// (scenarios/collision.toml), "onepool" (collision-onepool.toml), "short"
// (collision-short.toml, for tests), "real" (collision-real.toml: Silero VAD audio
// streams, the PP-OCRv4 detector, the tagger flood), "real-short" (the same, short, for
// tests), "llm" (collision-llm.toml: the real-model classes on one shared device with
// camera-frame bursts and the LLM tenant), "llm-short" (the same, short, for tests),
// "capacity" (capacity.toml, for `bench capacity`), "capacity-llm" (capacity-llm.toml:
// the LLM tenant as a step dimension), "gpu" (collision-gpu.toml: the real-model classes on
// webgpu pools of one GPU, the real LLM engine generating on it, the degrade run),
// "gpu-short" (the same, short, for tests and the lavapipe smoke).
func LoadScenario(name string) (*Scenario, error) {
	var data []byte
	var err error
	switch name {
	case "", "default":
		name = "scenarios/collision.toml"
		data, err = builtinScenarios.ReadFile(name)
	case "onepool", "short", "real", "real-short", "llm", "llm-short", "gpu", "gpu-short":
		name = "scenarios/collision-" + name + ".toml"
		data, err = builtinScenarios.ReadFile(name)
	case "capacity", "capacity-llm":
		name = "scenarios/" + name + ".toml"
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

// check checks a scenario read from its file and fills in its defaults (drain_timeout,
// a tag class's image size).
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
	if err := s.checkPools(); err != nil {
		return err
	}
	seen := map[string]bool{}
	for i := range s.Classes {
		if err := s.checkClass(&s.Classes[i], seen); err != nil {
			return err
		}
		if c := s.Classes[i]; c.Model == "ocr" && c.Image != s.ocrSide() {
			return fmt.Errorf("class %s: every ocr class sends the same detector input (image %d, not %d)", c.Name, s.ocrSide(), c.Image)
		}
	}
	if p := s.Capacity; p != nil {
		if err := s.checkCapacity(p); err != nil {
			return err
		}
	}
	if s.Tenant != nil {
		if err := s.Tenant.check(); err != nil {
			return fmt.Errorf("[tenant]: %w", err)
		}
	}
	for name, b := range s.Devices {
		if (name != "cpu" && name != GPUDevice && !strings.Contains(name, ":")) || b <= 0 {
			return fmt.Errorf("[devices]: %q = %d: want cpu, gpu or KIND:INDEX and a capacity > 0", name, b)
		}
	}
	if s.Degrade != nil {
		if err := s.checkDegrade(s.Degrade); err != nil {
			return fmt.Errorf("[degrade]: %w", err)
		}
	}
	return nil
}

// stdClasses are the classes a scenario may use.
var stdClasses = []string{subjects.ClassUrgent, subjects.ClassInteractive, subjects.ClassBatch}

// checkPools checks each [[pool]]: its name, models and classes.
func (s *Scenario) checkPools() error {
	for _, p := range s.Pools {
		if err := subjects.ValidateToken("pool", p.Name); err != nil {
			return err
		}
		for _, m := range p.Models {
			if _, ok := scenarioModels[m]; !ok {
				return fmt.Errorf("pool %s: unknown model %q (want tiny, tagger, heavy, vad or ocr)", p.Name, m)
			}
			if m == "heavy" && s.HeavyLayers == 0 {
				return fmt.Errorf("pool %s loads heavy but heavy_layers is 0", p.Name)
			}
		}
		for _, c := range p.Classes {
			if !slices.Contains(stdClasses, c) {
				return fmt.Errorf("pool %s: unknown class %q (want urgent, interactive or batch)", p.Name, c)
			}
		}
	}
	return nil
}

// checkClass checks a [[class]] (seen: the classes before it) and gives a tag class its
// default image size.
func (s *Scenario) checkClass(c *ScenarioClass, seen map[string]bool) error {
	if !slices.Contains(stdClasses, c.Name) || seen[c.Name] {
		return fmt.Errorf("class %q: want each of urgent, interactive, batch at most once", c.Name)
	}
	seen[c.Name] = true
	op, ok := scenarioModels[c.Model]
	if !ok || op != c.Op {
		return fmt.Errorf("class %s: model %q does not serve op %q (tiny, vad, ocr: infer; tagger, heavy: tag)", c.Name, c.Model, c.Op)
	}
	if (c.Model == "vad") != (c.Arrival == "stream") {
		return fmt.Errorf("class %s: the vad model takes arrival = \"stream\" (audio streams), and only it does", c.Name)
	}
	if c.Every < 0 || (c.Every > 0 && c.Arrival != "burst") {
		return fmt.Errorf("class %s: every (repeated bursts) must be > 0 and only on arrival = \"burst\"", c.Name)
	}
	if c.TargetP95 < 0 || c.MaxMissed < 0 || c.MaxMissed > 1 {
		return fmt.Errorf("class %s: target_p95 must be >= 0 and max_missed in [0, 1]", c.Name)
	}
	if c.Op == subjects.OpTag && c.Image == 0 {
		c.Image = 256
	}
	if c.Model == "ocr" {
		if c.Image == 0 {
			c.Image = OCRPathSide
		}
		if c.Image < 32 || c.Image%32 != 0 {
			return fmt.Errorf("class %s: the detector's image side must be a multiple of 32, got %d", c.Name, c.Image)
		}
	}
	if len(s.chain(c.Name, c.Model)) == 0 {
		return fmt.Errorf("class %s: no pool serves it with model %s", c.Name, c.Model)
	}
	if c.Timeout <= 0 {
		return fmt.Errorf("class %s: timeout must be > 0", c.Name)
	}
	return checkArrival(c)
}

// checkArrival checks that a class has what its arrival process needs.
func checkArrival(c *ScenarioClass) error {
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
	case "stream":
		if c.Interval <= 0 || c.Streams <= 0 {
			return fmt.Errorf("class %s: audio streams need interval (the frame period) > 0 and streams > 0", c.Name)
		}
	case "flood":
		if c.InFlight <= 0 {
			return fmt.Errorf("class %s: a flood needs inflight > 0", c.Name)
		}
	default:
		return fmt.Errorf("class %s: arrival %q (want periodic, poisson, burst, stream or flood)", c.Name, c.Arrival)
	}
	return nil
}

// checkCapacity checks [capacity]: its steps, and the classes and tenants it raises.
func (s *Scenario) checkCapacity(p *CapacityPlan) error {
	if len(p.Streams) == 0 || len(p.Streams) != len(p.Rates) {
		return fmt.Errorf("[capacity]: streams and rates must be lists of the same length > 0")
	}
	if s.classBy("stream") < 0 || s.classBy("poisson") < 0 {
		return fmt.Errorf("[capacity]: needs a class with arrival = \"stream\" and one with arrival = \"poisson\" (the loads it raises)")
	}
	for i := range p.Streams {
		if p.Streams[i] <= 0 || p.Rates[i] <= 0 {
			return fmt.Errorf("[capacity]: step %d: streams and rate must be > 0", i+1)
		}
	}
	if p.Window < 0 {
		return fmt.Errorf("[capacity]: window must be >= 0")
	}
	if len(p.Tenants) > 0 {
		if len(p.Tenants) != len(p.Streams) {
			return fmt.Errorf("[capacity]: tenants must be as long as streams")
		}
		if s.Tenant == nil {
			return fmt.Errorf("[capacity]: tenants needs a [tenant] table")
		}
		for i, n := range p.Tenants {
			if n < 0 {
				return fmt.Errorf("[capacity]: step %d: tenants must be >= 0", i+1)
			}
		}
	}
	return nil
}

// ocrSide is the detector's input side: its classes' image (OCRPathSide when no class
// sends to it).
func (s *Scenario) ocrSide() int {
	if i := slices.IndexFunc(s.Classes, func(c ScenarioClass) bool { return c.Model == "ocr" }); i >= 0 {
		return s.Classes[i].Image
	}
	return OCRPathSide
}

// classBy is the index of the first class with that arrival, or -1.
func (s *Scenario) classBy(arrival string) int {
	return slices.IndexFunc(s.Classes, func(c ScenarioClass) bool { return c.Arrival == arrival })
}

// frames is how many frames each stream of a stream class sends in the window: one
// every interval from the start, while before the window's end.
func (s *Scenario) frames(c ScenarioClass) int {
	if c.Arrival != "stream" {
		return 0
	}
	w, iv := s.Window.D()-c.Start.D(), c.Interval.D()
	if w <= 0 {
		return 0
	}
	return int((w + iv - 1) / iv)
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

// Schedule is the arrival schedule: deterministic for a seed, in time order. Stream and
// flood classes have none: their requests follow their own answers (runSchedule).
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
			for {
				for n := 0; n < c.Count; n++ {
					out = append(out, arrival{at + time.Duration(int64(c.Spread.D())*int64(n)/int64(c.Count)), ci})
				}
				if at += c.Every.D(); c.Every <= 0 || at >= window {
					break
				}
			}
		}
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].At < out[j].At })
	return out
}
