package bench

import (
	"encoding/xml"
	"fmt"
	"image"
	"image/color"
	"image/png"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ortbus/ortbus/config"
)

// chartCollision is a collision result with every run, the urgent and interactive
// deadlines near the data (drawn) and the batch one far above it (not drawn).
func chartCollision() *CollisionResults {
	cs := func(p50, p95, p99 float64, miss, n int) *ClassStats {
		return &ClassStats{P50MS: p50, P95MS: p95, P99MS: p99, DeadlineMisses: miss, Count: n}
	}
	sc := &Scenario{Name: "scenarios/collision.toml", Seed: 42, Classes: []ScenarioClass{
		{Name: "urgent", Timeout: config.Duration(200 * time.Millisecond)},
		{Name: "interactive", Timeout: config.Duration(10 * time.Second)},
		{Name: "batch", Timeout: config.Duration(10 * time.Minute)}}}
	return &CollisionResults{Scenario: sc,
		Solo:   map[string]*ClassStats{"urgent": cs(5, 8, 12, 0, 600), "interactive": cs(100, 150, 200, 0, 98), "batch": cs(3000, 9000, 12000, 0, 600)},
		Policy: &CollisionRun{Classes: map[string]*ClassStats{"urgent": cs(7, 15, 30, 0, 600), "interactive": cs(120, 200, 260, 0, 98), "batch": cs(5000, 15000, 20000, 0, 600)}},
		FIFO:   &CollisionRun{Classes: map[string]*ClassStats{"urgent": cs(150, 400, 900, 50, 600), "interactive": cs(1000, 3000, 5000, 3, 98), "batch": cs(4000, 12000, 18000, 0, 600)}},
	}
}

// chartCapacity is a capacity result of six steps, FIFO run to step 4, with both knees.
func chartCapacity() *CapacityResults {
	sc := &Scenario{Name: "scenarios/capacity.toml", Classes: []ScenarioClass{{Name: "urgent"}, {Name: "interactive"}, {Name: "batch"}}}
	r := &CapacityResults{Scenario: sc, Seed: 20261203, Targets: map[string]CapacityTarget{"urgent": {P95MS: 32}, "interactive": {P95MS: 500}},
		Knee: map[string]*CapacityKnee{"policy": {Step: 5}, "fifo": {Step: 3}}}
	for i := 0; i < 6; i++ {
		f := float64(i + 1)
		st := &CapacityStep{Step: i + 1, Streams: 1 << i, Rate: f,
			Policy: &CollisionRun{Classes: map[string]*ClassStats{"urgent": {P95MS: 7 * f}, "interactive": {P95MS: 190 + 40*f}, "batch": {P95MS: 650 + 200*f}}}}
		if i < 4 {
			st.FIFO = &CollisionRun{Classes: map[string]*ClassStats{"urgent": {P95MS: 13 * f}, "interactive": {P95MS: 360 + 70*f}, "batch": {P95MS: 700 + 150*f}}}
		}
		r.Steps = append(r.Steps, st)
	}
	return r
}

// readPNG decodes the PNG at path and checks its size.
func readPNG(t *testing.T, path string, w, h int) image.Image {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	img, err := png.Decode(f)
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	if b := img.Bounds(); b.Dx() != w || b.Dy() != h {
		t.Fatalf("%s is %dx%d, want %dx%d", path, b.Dx(), b.Dy(), w, h)
	}
	return img
}

// pixels counts the pixels of each colour of want in img.
func pixels(img image.Image, want []color.RGBA) []int {
	n := make([]int, len(want))
	b := img.Bounds()
	for y := b.Min.Y; y < b.Max.Y; y++ {
		for x := b.Min.X; x < b.Max.X; x++ {
			r, g, bl, _ := img.At(x, y).RGBA()
			for i, c := range want {
				if uint8(r>>8) == c.R && uint8(g>>8) == c.G && uint8(bl>>8) == c.B {
					n[i]++
				}
			}
		}
	}
	return n
}

// readSVG parses the SVG at path, checks its size (pixels at 96 dpi, in points) and
// returns its text.
func readSVG(t *testing.T, path string, w, h int) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var root struct {
		XMLName xml.Name `xml:"svg"`
		Width   string   `xml:"width,attr"`
		Height  string   `xml:"height,attr"`
	}
	if err := xml.Unmarshal(b, &root); err != nil {
		t.Fatalf("%s is not an SVG: %v", path, err)
	}
	if ww, hh := fmt.Sprintf("%gpt", float64(w)*0.75), fmt.Sprintf("%gpt", float64(h)*0.75); root.Width != ww || root.Height != hh {
		t.Fatalf("%s is %s x %s, want %s x %s", path, root.Width, root.Height, ww, hh)
	}
	return string(b)
}

// checkChart writes a chart with write as the PNG pngPath and as the SVG svgPath, checks both are
// chartW x h pixels, that the PNG has a series in each of colours (100 pixels or more),
// and returns the SVG's text.
func checkChart(t *testing.T, write func(string) error, pngPath, svgPath string, h int, colours []color.RGBA) string {
	t.Helper()
	if err := write(pngPath); err != nil {
		t.Fatal(err)
	}
	img := readPNG(t, pngPath, chartW, h)
	for i, n := range pixels(img, colours) {
		if n < 100 {
			t.Errorf("%s: colour %d: %d pixels, want a series drawn in it", pngPath, i, n)
		}
	}
	if err := write(svgPath); err != nil {
		t.Fatal(err)
	}
	return readSVG(t, svgPath, chartW, h)
}

func hex(c color.RGBA) string { return fmt.Sprintf("#%02X%02X%02X", c.R, c.G, c.B) }

// TestCollisionChart: the collision chart is a PNG (or an SVG for a .svg path) of its
// size, with a bar of each run's colour, the drawn deadlines, and the title, legend and
// class labels.
func TestCollisionChart(t *testing.T) {
	dir := t.TempDir()
	res := chartCollision()
	p := filepath.Join(dir, "sub", "collision.png")
	s := filepath.Join(dir, "collision.svg")
	text := checkChart(t, func(path string) error { return writeChart(path, res) }, p, s, collisionH,
		append(append([]color.RGBA{}, runColours...), chartDead))
	for _, want := range []string{"ortbus bench collision", "seed 42", ">solo<", ">policy<", ">fifo<", ">request deadline", ">urgent<", ">interactive<", ">batch<",
		"misses s/p/f: 0/0/50 of 600", ">p50<", ">p95<", ">p99<", ">200ms<", ">10s<", hex(runColours[0]), hex(runColours[1]), hex(runColours[2]), hex(chartDead)} {
		if !strings.Contains(text, want) {
			t.Errorf("SVG lacks %q", want)
		}
	}
	if strings.Contains(text, ">600s<") {
		t.Errorf("SVG shows the batch deadline, far above the data")
	}
	// A run not made is "-", and a chart without figures still draws.
	res.FIFO, res.Solo = nil, nil
	if err := writeChart(s, res); err != nil {
		t.Fatal(err)
	}
	if text := readSVG(t, s, chartW, collisionH); !strings.Contains(text, "misses s/p/f: -/0/- of 600") {
		t.Errorf("SVG lacks the misses of the policy run alone")
	}
	empty := &CollisionResults{Scenario: &Scenario{Name: "x", Classes: []ScenarioClass{{Name: "urgent"}}}}
	if err := writeChart(p, empty); err != nil {
		t.Fatal(err)
	}
	readPNG(t, p, chartW, collisionH)
}

// TestCapacityChart: the capacity chart is a PNG (or an SVG) of its size, with each
// class's colour, the steps on the x axis, the targets and the knees.
func TestCapacityChart(t *testing.T) {
	dir := t.TempDir()
	res := chartCapacity()
	p := filepath.Join(dir, "capacity.png")
	text := checkChart(t, func(path string) error { return writeCapacityChart(path, res) }, p, filepath.Join(dir, "capacity.svg"), capacityH,
		[]color.RGBA{classColours["urgent"], classColours["interactive"], classColours["batch"]})
	for _, want := range []string{"ortbus bench capacity", "seed 20261203", ">1:1<", ">32:6<", "load step (streams:rate)", ">policy knee<", ">fifo knee<",
		">urgent 32ms<", ">interactive 500ms<", "dotted: a class", hex(classColours["urgent"]), hex(classColours["interactive"]), hex(classColours["batch"])} {
		if !strings.Contains(text, want) {
			t.Errorf("SVG lacks %q", want)
		}
	}
	if err := writeCapacityChart(p, &CapacityResults{Scenario: &Scenario{Name: "x"}}); err != nil {
		t.Fatal(err)
	}
	readPNG(t, p, chartW, capacityH)
}
