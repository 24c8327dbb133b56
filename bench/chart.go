package bench

import (
	"bytes"
	"fmt"
	"image"
	"image/color"
	"image/draw"
	"image/png"
	"math"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/image/font"
	"golang.org/x/image/font/basicfont"
	"golang.org/x/image/math/fixed"
)

// Chart colours: one per run.
var (
	chartBG     = color.RGBA{255, 255, 255, 255}
	chartInk    = color.RGBA{30, 30, 30, 255}
	chartGrid   = color.RGBA{225, 225, 225, 255}
	chartDead   = color.RGBA{200, 120, 0, 255}
	runColours  = []color.RGBA{{150, 150, 150, 255}, {40, 100, 200, 255}, {210, 60, 50, 255}}
	runNames    = []string{"solo", "policy", "fifo"}
	chartGroups = []string{"p50", "p95", "p99"}
)

// writeChart draws, for each class of the scenario, its p50/p95/p99 latency (log scale)
// in the solo, policy and FIFO runs, with the class's deadline as a dashed line, and
// writes it as a PNG.
func writeChart(path string, r *CollisionResults) error {
	classes := r.Scenario.Classes
	runs := []map[string]*ClassStats{r.Solo, nil, nil}
	if r.Policy != nil {
		runs[1] = r.Policy.Classes
	}
	if r.FIFO != nil {
		runs[2] = r.FIFO.Classes
	}
	value := func(s *ClassStats, g int) float64 {
		if s == nil {
			return 0
		}
		return []float64{s.P50MS, s.P95MS, s.P99MS}[g]
	}
	lo, hi := math.Inf(1), 0.0
	for _, c := range classes {
		for _, m := range runs {
			for g := range chartGroups {
				if v := value(m[c.Name], g); v > 0 {
					lo, hi = math.Min(lo, v), math.Max(hi, v)
				}
			}
		}
	}
	if hi == 0 {
		lo, hi = 1, 10
	}
	// A deadline is drawn when it is near the data; far ones would squash the bars.
	shown := func(d float64) bool { return d > 0 && d <= 10*hi }
	for _, c := range classes {
		if d := float64(c.Timeout.D().Milliseconds()); shown(d) {
			hi = math.Max(hi, d)
		}
	}
	lo = math.Max(lo, 0.01)
	decLo, decHi := math.Floor(math.Log10(lo)), math.Ceil(math.Log10(hi))
	if decHi <= decLo {
		decHi = decLo + 1
	}

	const W, H = 1100, 560
	const top, bottom, left = 80, 80, 70
	img := image.NewRGBA(image.Rect(0, 0, W, H))
	draw.Draw(img, img.Bounds(), image.NewUniform(chartBG), image.Point{}, draw.Src)
	text(img, 20, 26, chartInk, fmt.Sprintf("ortbus bench collision: latency per class, log scale (ms); scenario %s, seed %d", filepath.Base(r.Scenario.Name), r.Scenario.Seed))
	// Legend.
	lx := 20
	for i, n := range runNames {
		fill(img, image.Rect(lx, 40, lx+14, 54), runColours[i])
		text(img, lx+20, 52, chartInk, n)
		lx += 90
	}
	dashed(img, lx, 47, lx+30, chartDead)
	text(img, lx+36, 52, chartInk, "request deadline (timeout); a deadline miss counts as its deadline")

	plotH := H - top - bottom
	y := func(v float64) int {
		f := (math.Log10(v) - decLo) / (decHi - decLo)
		return top + plotH - int(f*float64(plotH))
	}
	panelW := (W - left - 20) / max(len(classes), 1)
	// Grid and y labels (once, on the left).
	for d := decLo; d <= decHi; d++ {
		yy := y(math.Pow(10, d))
		for x := left; x < W-20; x++ {
			img.Set(x, yy, chartGrid)
		}
		text(img, 8, yy+4, chartInk, fmtMS(math.Pow(10, d)))
	}
	for x := left; x < W-20; x++ {
		img.Set(x, top+plotH, chartInk)
	}
	for yy := top; yy <= top+plotH; yy++ {
		img.Set(left, yy, chartInk)
	}
	for ci, c := range classes {
		x0 := left + ci*panelW
		if ci > 0 {
			for yy := top; yy <= top+plotH; yy++ {
				img.Set(x0, yy, chartGrid)
			}
		}
		text(img, x0+panelW/2-len(c.Name)*7/2, H-30, chartInk, c.Name)
		// Deadline misses per run (solo/policy/fifo), "-" for a run not made.
		var parts []string
		count := 0
		for _, m := range runs {
			if s := m[c.Name]; s != nil {
				parts = append(parts, fmt.Sprint(s.DeadlineMisses))
				count = max(count, s.Count)
			} else {
				parts = append(parts, "-")
			}
		}
		misses := fmt.Sprintf("misses s/p/f: %s of %d", strings.Join(parts, "/"), count)
		text(img, x0+panelW/2-len(misses)*7/2, H-12, chartInk, misses)
		groupW := (panelW - 20) / len(chartGroups)
		barW := (groupW - 16) / len(runs)
		for g, gn := range chartGroups {
			gx := x0 + 10 + g*groupW
			text(img, gx+groupW/2-len(gn)*7/2-4, top+plotH+18, chartInk, gn)
			for ri, m := range runs {
				v := value(m[c.Name], g)
				if v <= 0 {
					continue
				}
				bx := gx + 4 + ri*barW
				by := y(math.Max(v, math.Pow(10, decLo)))
				fill(img, image.Rect(bx, by, bx+barW-3, top+plotH), runColours[ri])
			}
		}
		if d := float64(c.Timeout.D().Milliseconds()); shown(d) && d >= math.Pow(10, decLo) {
			dashed(img, x0+4, y(d), x0+panelW-4, chartDead)
			text(img, x0+6, y(d)-4, chartDead, fmtMS(d))
		}
	}
	return writePNG(path, img)
}

func fmtMS(v float64) string {
	switch {
	case v >= 1000:
		return fmt.Sprintf("%gs", v/1000)
	case v >= 1:
		return fmt.Sprintf("%gms", v)
	}
	return fmt.Sprintf("%gms", v)
}

func text(img *image.RGBA, x, y int, c color.Color, s string) {
	d := font.Drawer{Dst: img, Src: image.NewUniform(c), Face: basicfont.Face7x13, Dot: fixed.P(x, y)}
	d.DrawString(s)
}

func fill(img *image.RGBA, r image.Rectangle, c color.Color) {
	draw.Draw(img, r, image.NewUniform(c), image.Point{}, draw.Src)
}

func dashed(img *image.RGBA, x0, y, x1 int, c color.Color) {
	for x := x0; x < x1; x++ {
		if (x/6)%2 == 0 {
			img.Set(x, y, c)
			img.Set(x, y+1, c)
		}
	}
}

// Capacity chart: one colour per class, the policy solid with filled markers, FIFO dashed
// with hollow ones.
var classColours = map[string]color.RGBA{
	"urgent":      {210, 60, 50, 255},
	"interactive": {40, 100, 200, 255},
	"batch":       {120, 120, 120, 255},
}

// writeCapacityChart draws p95 per class (log scale) against the load step, for the
// policy and FIFO runs, with each class's target as a dotted line and each run's knee
// as a vertical line, and writes it as a PNG.
func writeCapacityChart(path string, r *CapacityResults) error {
	classes := r.Scenario.Classes
	runs := []struct {
		name string
		get  func(*CapacityStep) *CollisionRun
	}{{"policy", func(s *CapacityStep) *CollisionRun { return s.Policy }}, {"fifo", func(s *CapacityStep) *CollisionRun { return s.FIFO }}}
	lo, hi := math.Inf(1), 0.0
	for _, st := range r.Steps {
		for _, run := range runs {
			if cr := run.get(st); cr != nil {
				for _, s := range cr.Classes {
					if s.P95MS > 0 {
						lo, hi = math.Min(lo, s.P95MS), math.Max(hi, s.P95MS)
					}
				}
			}
		}
	}
	for _, t := range r.Targets {
		lo, hi = math.Min(lo, t.P95MS), math.Max(hi, t.P95MS)
	}
	if hi == 0 {
		lo, hi = 1, 10
	}
	lo = math.Max(lo, 0.01)
	decLo, decHi := math.Floor(math.Log10(lo)), math.Ceil(math.Log10(hi))
	if decHi <= decLo {
		decHi = decLo + 1
	}
	colour := func(class string) color.RGBA {
		if c, ok := classColours[class]; ok {
			return c
		}
		return chartInk
	}

	const W, H = 1100, 600
	const top, bottom, left, right = 90, 80, 70, 30
	img := image.NewRGBA(image.Rect(0, 0, W, H))
	draw.Draw(img, img.Bounds(), image.NewUniform(chartBG), image.Point{}, draw.Src)
	text(img, 20, 26, chartInk, fmt.Sprintf("ortbus bench capacity: p95 per class (log scale, ms) against load (audio streams : interactive rate/s); scenario %s, seed %d",
		filepath.Base(r.Scenario.Name), r.Seed))
	lx := 20
	for _, c := range classes {
		fill(img, image.Rect(lx, 40, lx+14, 54), colour(c.Name))
		text(img, lx+20, 52, chartInk, c.Name)
		lx += 40 + 7*len(c.Name)
	}
	line(img, lx, 47, lx+30, 47, chartInk, false)
	text(img, lx+36, 52, chartInk, "policy")
	line(img, lx+100, 47, lx+130, 47, chartInk, true)
	text(img, lx+136, 52, chartInk, "fifo")
	text(img, 20, 72, chartInk, "dotted: a class's p95 target; vertical: each run's knee (first step with a target missed)")

	plotH, plotW := H-top-bottom, W-left-right
	y := func(v float64) int {
		f := (math.Log10(math.Max(v, math.Pow(10, decLo))) - decLo) / (decHi - decLo)
		return top + plotH - int(f*float64(plotH))
	}
	n := max(len(r.Steps), 1)
	x := func(i int) int { return left + plotW*(2*i+1)/(2*n) }
	for d := decLo; d <= decHi; d++ {
		yy := y(math.Pow(10, d))
		for xx := left; xx < W-right; xx++ {
			img.Set(xx, yy, chartGrid)
		}
		text(img, 8, yy+4, chartInk, fmtMS(math.Pow(10, d)))
	}
	for xx := left; xx < W-right; xx++ {
		img.Set(xx, top+plotH, chartInk)
	}
	for yy := top; yy <= top+plotH; yy++ {
		img.Set(left, yy, chartInk)
	}
	for i, st := range r.Steps {
		lbl := fmt.Sprintf("%d:%g", st.Streams, st.Rate)
		text(img, x(i)-len(lbl)*7/2, top+plotH+18, chartInk, lbl)
	}
	text(img, left+plotW/2-70, H-30, chartInk, "load step (streams:rate)")
	for _, c := range classes {
		if t, ok := r.Targets[c.Name]; ok {
			col := colour(c.Name)
			for xx := left; xx < W-right; xx += 4 {
				img.Set(xx, y(t.P95MS), col)
			}
			text(img, W-right-110, y(t.P95MS)-4, col, c.Name+" "+fmtMS(t.P95MS))
		}
	}
	for ri, run := range runs {
		if k := r.Knee[run.name]; k != nil && k.Step > 0 {
			xx := x(k.Step-1) + 3*(2*ri-1)
			for yy := top; yy <= top+plotH; yy += 1 + ri*2 {
				img.Set(xx, yy, chartInk)
			}
			text(img, xx+4, top+12+14*ri, chartInk, run.name+" knee")
		}
		for _, c := range classes {
			col := colour(c.Name)
			prev := -1
			var py int
			for i, st := range r.Steps {
				cr := run.get(st)
				if cr == nil || cr.Classes[c.Name] == nil || cr.Classes[c.Name].P95MS <= 0 {
					prev = -1
					continue
				}
				yy := y(cr.Classes[c.Name].P95MS)
				if prev >= 0 {
					line(img, x(prev), py, x(i), yy, col, ri == 1)
				}
				marker(img, x(i), yy, col, ri == 0)
				prev, py = i, yy
			}
		}
	}
	return writePNG(path, img)
}

// line draws a 2-pixel line from (x0, y0) to (x1, y1), dashed when asked.
func line(img *image.RGBA, x0, y0, x1, y1 int, c color.Color, dashed bool) {
	dx, dy := x1-x0, y1-y0
	steps := max(abs(dx), abs(dy), 1)
	for i := 0; i <= steps; i++ {
		if dashed && (i/6)%2 == 1 {
			continue
		}
		xx, yy := x0+dx*i/steps, y0+dy*i/steps
		img.Set(xx, yy, c)
		img.Set(xx, yy+1, c)
		img.Set(xx+1, yy, c)
	}
}

// marker draws a 9x9 square, filled or hollow.
func marker(img *image.RGBA, x, y int, c color.Color, filled bool) {
	if filled {
		fill(img, image.Rect(x-4, y-4, x+5, y+5), c)
		return
	}
	for i := -4; i <= 4; i++ {
		img.Set(x+i, y-4, c)
		img.Set(x+i, y+4, c)
		img.Set(x-4, y+i, c)
		img.Set(x+4, y+i, c)
	}
}

func abs(v int) int {
	if v < 0 {
		return -v
	}
	return v
}

// writePNG encodes img as a PNG file at path, making its folder.
func writePNG(path string, img image.Image) error {
	var buf bytes.Buffer
	if err := png.Encode(&buf, img); err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	return os.WriteFile(path, buf.Bytes(), 0o644)
}
