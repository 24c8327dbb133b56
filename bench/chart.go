package bench

import (
	"bytes"
	"fmt"
	"image/color"
	"math"
	"os"
	"path/filepath"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
)

// The charts of collision and capacity, drawn with gonum.org/v1/plot: latency in ms on a
// log scale over whole decades, a title and a row of legend entries above the plot. A
// chart is a PNG of chartW x its height in pixels, or an SVG when its path ends in .svg.

// Chart colours: one per run.
var (
	chartBG     = color.RGBA{255, 255, 255, 255}
	chartInk    = color.RGBA{30, 30, 30, 255}
	chartGrid   = color.RGBA{225, 225, 225, 255}
	chartDead   = color.RGBA{200, 120, 0, 255}
	runColours  = []color.RGBA{{150, 150, 150, 255}, {40, 100, 200, 255}, {210, 60, 50, 255}}
	chartGroups = []string{"p50", "p95", "p99"}
)

// Chart sizes, in pixels.
const (
	chartW         = 1100
	collisionH     = 560
	capacityH      = 600
	chartDPI       = 96
	chartLineWidth = 2
)

// px is n pixels of a chart as a length.
func px(n float64) vg.Length { return vg.Length(n) * vg.Inch / chartDPI }

// gateColour is the colour of the run under the policy with the LLM tenant's gate.
var gateColour = color.RGBA{40, 160, 90, 255}

// chartRun is one run of the collision chart.
type chartRun struct {
	name    string
	colour  color.RGBA
	classes map[string]*ClassStats
	tenant  *TenantStats
}

// chartPanel is one panel of the collision chart: a class, or the LLM tenant's first
// token latency.
type chartPanel struct {
	name     string
	groups   []string                        // the three bars' names
	value    func(r chartRun, g int) float64 // 0: no bar
	line     string                          // the label's last line
	deadline float64                         // ms; 0: none
}

// writeChart draws, for each class of the scenario, its p50/p95/p99 latency (log scale)
// in the solo, policy and FIFO runs (and the policy run with the LLM tenant's gate, when
// made), with the class's deadline as a dashed line, and, with an LLM tenant, its first
// token latency (p50, p95, max) with its tokens/s per run; it writes it as a PNG.
func writeChart(path string, r *CollisionResults) error {
	runs, letters := collisionRuns(r)
	panels := collisionPanels(r, runs, letters)
	var sp span
	for _, pn := range panels {
		for _, run := range runs {
			for g := range pn.groups {
				sp.add(pn.value(run, g))
			}
		}
	}
	lo, hi := sp.bounds()
	// A deadline is drawn when it is near the data; far ones would squash the bars.
	shown := func(d float64) bool { return d > 0 && d <= 10*hi }
	for _, pn := range panels {
		if shown(pn.deadline) {
			hi = math.Max(hi, pn.deadline)
		}
	}
	ax := newLogAxis(lo, hi)
	p := ax.plot("latency (ms, log scale)")
	bars, ticks := drawPanels(p, ax, panels, runs, shown)
	legend, err := barLegend(p, runs, bars)
	if err != nil {
		return err
	}
	dead := &plotter.Line{LineStyle: deadlineStyle()}
	legend = append(legend, legendItem{"request deadline (timeout); a deadline miss counts as its deadline", []plot.Thumbnailer{dead}})
	p.X.Min, p.X.Max = 0, math.Max(float64(len(panels))*panelWidth, 1)
	p.X.Tick.Marker = ticks
	ax.fix(p)
	title := fmt.Sprintf("ortbus bench collision: latency per class, log scale (ms); scenario %s, seed %d", filepath.Base(r.Scenario.Name), r.Scenario.Seed)
	return saveChart(path, chartW, collisionH, p, title, legend, "")
}

// collisionRuns are the collision chart's runs, in their order (solo, policy + gate when
// made, policy, fifo unless the scenario has none; a run not made has no statistics), and
// their initials ("s/g/p/f").
func collisionRuns(r *CollisionResults) ([]chartRun, string) {
	runs := []chartRun{{"solo", runColours[0], r.Solo, r.SoloTenant}}
	if r.Gate != nil {
		runs = append(runs, chartRun{"policy + gate", gateColour, r.Gate.Classes, r.Gate.Tenant})
	}
	runs = append(runs, chartRun{name: "policy", colour: runColours[1]})
	if r.Policy != nil {
		runs[len(runs)-1].classes, runs[len(runs)-1].tenant = r.Policy.Classes, r.Policy.Tenant
	}
	if !r.Scenario.NoFIFO {
		runs = append(runs, chartRun{name: "fifo", colour: runColours[2]})
		if r.FIFO != nil {
			runs[len(runs)-1].classes, runs[len(runs)-1].tenant = r.FIFO.Classes, r.FIFO.Tenant
		}
	}
	var initials []string
	for _, run := range runs {
		initials = append(initials, run.name[:1])
	}
	if r.Gate != nil {
		initials[1] = "g"
	}
	return runs, strings.Join(initials, "/")
}

// perRun is each run's text for a panel's last line ("-" for a run without it), joined
// with "/".
func perRun(runs []chartRun, text func(chartRun) (string, bool)) string {
	var parts []string
	for _, run := range runs {
		if t, ok := text(run); ok {
			parts = append(parts, t)
		} else {
			parts = append(parts, "-")
		}
	}
	return strings.Join(parts, "/")
}

// collisionPanels are the collision chart's panels: one a class (its percentiles, its
// deadline misses per run) and, with an LLM tenant, its first token latency.
func collisionPanels(r *CollisionResults, runs []chartRun, letters string) []chartPanel {
	var panels []chartPanel
	for _, c := range r.Scenario.Classes {
		// Deadline misses per run, "-" for a run not made.
		count := 0
		misses := perRun(runs, func(run chartRun) (string, bool) {
			s := run.classes[c.Name]
			if s == nil {
				return "", false
			}
			count = max(count, s.Count)
			return fmt.Sprint(s.DeadlineMisses), true
		})
		panels = append(panels, chartPanel{name: c.Name, groups: chartGroups, deadline: float64(c.Timeout.D().Milliseconds()),
			line: fmt.Sprintf("misses %s: %s of %d", letters, misses, count),
			value: func(run chartRun, g int) float64 {
				s := run.classes[c.Name]
				if s == nil {
					return 0
				}
				return []float64{s.P50MS, s.P95MS, s.P99MS}[g]
			}})
	}
	if r.Scenario.Tenant != nil {
		rates := perRun(runs, func(run chartRun) (string, bool) {
			if run.tenant == nil {
				return "", false
			}
			return fmt.Sprintf("%.0f", run.tenant.TokensPerS), true
		})
		panels = append(panels, chartPanel{name: "llm first token", groups: []string{"p50", "p95", "max"},
			line: fmt.Sprintf("tokens/s %s: %s", letters, rates),
			value: func(run chartRun, g int) float64 {
				if run.tenant == nil {
					return 0
				}
				return []float64{run.tenant.FirstTokenP50MS, run.tenant.FirstTokenP95MS, run.tenant.FirstTokenMaxMS}[g]
			}})
	}
	return panels
}

// panelWidth is a collision panel's part of the x axis: a unit per group (p50, p95, p99),
// and half a unit either side.
var panelWidth = float64(len(chartGroups) + 1)

// drawPanels draws the panels' separators and deadlines (those shown), and returns each
// run's bars (a bar per run in each group) and the x ticks (a group's name, and the
// panel's under its middle group).
func drawPanels(p *plot.Plot, ax logAxis, panels []chartPanel, runs []chartRun, shown func(float64) bool) ([][]plotter.XYer, plot.ConstantTicks) {
	barW := 0.8 / float64(len(runs))
	bars := make([][]plotter.XYer, len(runs))
	var ticks plot.ConstantTicks
	for pi, pn := range panels {
		x0 := float64(pi) * panelWidth
		if pi > 0 {
			p.Add(vline(x0, ax, draw.LineStyle{Color: chartGrid, Width: px(1)}))
		}
		for g, gn := range pn.groups {
			gx := x0 + float64(g) + 1
			// Every label of three lines, so that they align: the middle group's names
			// the panel and its last line.
			label := gn + "\n \n "
			if g == len(pn.groups)/2 {
				label = gn + "\n" + pn.name + "\n" + pn.line
			}
			ticks = append(ticks, plot.Tick{Value: gx, Label: label})
			for ri, run := range runs {
				v := pn.value(run, g)
				if v <= 0 {
					continue
				}
				bx := gx - 0.4 + float64(ri)*barW
				bars[ri] = append(bars[ri], rect(bx, ax.min(), bx+0.9*barW, math.Max(v, ax.min())))
			}
		}
		if d := pn.deadline; shown(d) && d >= ax.min() {
			p.Add(hline(x0+0.1, x0+panelWidth-0.1, d, deadlineStyle()))
			if l, err := label(x0+0.15, d, fmtMS(d), chartDead); err == nil {
				p.Add(l)
			}
		}
	}
	return bars, ticks
}

// barLegend draws each run's bars in its colour and returns the legend's item of each run.
func barLegend(p *plot.Plot, runs []chartRun, bars [][]plotter.XYer) ([]legendItem, error) {
	legend := []legendItem{}
	for ri, run := range runs {
		poly, err := plotter.NewPolygon(bars[ri]...)
		if err != nil {
			return nil, err
		}
		poly.Color, poly.LineStyle = run.colour, draw.LineStyle{Color: run.colour, Width: px(0.5)}
		if len(bars[ri]) > 0 {
			p.Add(poly)
		}
		legend = append(legend, legendItem{run.name, []plot.Thumbnailer{poly}})
	}
	return legend, nil
}

// span is the range of the positive values a chart shows, for its log axis.
type span struct {
	lo, hi float64
	seen   bool
}

// add widens the span to v when v is positive.
func (s *span) add(v float64) {
	if v > 0 {
		s.widen(v)
	}
}

// widen widens the span to v.
func (s *span) widen(v float64) {
	if !s.seen {
		s.lo, s.hi, s.seen = math.Inf(1), 0, true
	}
	s.lo, s.hi = math.Min(s.lo, v), math.Max(s.hi, v)
}

// bounds is the span, or 1 to 10 ms when nothing above 0 was seen.
func (s span) bounds() (lo, hi float64) {
	if s.hi == 0 {
		return 1, 10
	}
	return s.lo, s.hi
}

func deadlineStyle() draw.LineStyle {
	return draw.LineStyle{Color: chartDead, Width: px(chartLineWidth), Dashes: []vg.Length{px(6), px(6)}}
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
	llmSteps := r.Scenario.Capacity != nil && len(r.Scenario.Capacity.Tenants) > 0
	all := capacitySeriesOf(r.Scenario.Classes, llmSteps)
	var sp span
	for _, st := range r.Steps {
		for _, run := range capacityRuns {
			if cr := run.get(st); cr != nil {
				for _, sr := range all {
					sp.add(sr.value(cr))
				}
			}
		}
	}
	for _, t := range r.Targets {
		sp.widen(t.P95MS)
	}
	ax := newLogAxis(sp.bounds())
	p := ax.plot("p95 (ms, log scale)")
	n := max(len(r.Steps), 1)
	xMin, xMax := -0.5, float64(n)-0.5
	stepAxis(p, r.Steps, llmSteps)
	// Targets, dotted, named at the right end.
	for _, c := range r.Scenario.Classes {
		if t, ok := r.Targets[c.Name]; ok {
			p.Add(hline(xMin, xMax, t.P95MS, draw.LineStyle{Color: classColour(c.Name), Width: px(1), Dashes: []vg.Length{px(1), px(3)}}))
			if l, err := label(xMax, t.P95MS, c.Name+" "+fmtMS(t.P95MS), classColour(c.Name)); err == nil {
				l.TextStyle[0].XAlign = draw.XRight
				p.Add(l)
			}
		}
	}
	legend := []legendItem{}
	for _, sr := range all {
		sw, _ := plotter.NewPolygon()
		sw.Color, sw.LineStyle = sr.colour, draw.LineStyle{Color: sr.colour, Width: px(0.5)}
		legend = append(legend, legendItem{sr.name, []plot.Thumbnailer{sw}})
	}
	for ri, run := range capacityRuns {
		drawKnee(p, ax, r.Knee[run.name], ri, run.name)
		for _, sr := range all {
			drawSeries(p, ax, r.Steps, run.get, sr, ri)
		}
		legend = append(legend, legendItem{run.name, []plot.Thumbnailer{
			&plotter.Line{LineStyle: seriesStyle(chartInk, ri == 1)},
			&plotter.Scatter{GlyphStyle: markerStyle(chartInk, ri == 0)},
		}})
	}
	p.X.Min, p.X.Max = xMin, xMax
	ax.fix(p)
	load := "audio streams : interactive rate/s"
	if llmSteps {
		load += " : llm tenants"
	}
	title := fmt.Sprintf("ortbus bench capacity: p95 per class (log scale, ms) against load (%s); scenario %s, seed %d",
		load, filepath.Base(r.Scenario.Name), r.Seed)
	return saveChart(path, chartW, capacityH, p, title, legend,
		"dotted: a class's p95 target; vertical: each run's knee (first step with a target missed)")
}

// capacityRuns are the capacity chart's runs: the policy's (solid, filled markers) and
// FIFO's (dashed, hollow ones).
var capacityRuns = []struct {
	name string
	get  func(*CapacityStep) *CollisionRun
}{{"policy", func(s *CapacityStep) *CollisionRun { return s.Policy }}, {"fifo", func(s *CapacityStep) *CollisionRun { return s.FIFO }}}

// capacitySeries is a line of the capacity chart: a value of each step's run.
type capacitySeries struct {
	name   string
	colour color.RGBA
	value  func(*CollisionRun) float64 // 0: none
}

// capacitySeriesOf are the capacity chart's series: a class's p95 each and, with LLM
// tenants in the steps, their first token latency's p95.
func capacitySeriesOf(classes []ScenarioClass, llmSteps bool) []capacitySeries {
	var all []capacitySeries
	for _, c := range classes {
		all = append(all, capacitySeries{c.Name, classColour(c.Name), func(cr *CollisionRun) float64 {
			if s := cr.Classes[c.Name]; s != nil {
				return s.P95MS
			}
			return 0
		}})
	}
	if llmSteps {
		all = append(all, capacitySeries{"llm first token", gateColour, func(cr *CollisionRun) float64 {
			if cr.Tenant != nil {
				return cr.Tenant.FirstTokenP95MS
			}
			return 0
		}})
	}
	return all
}

// classColour is a class's colour in the capacity chart (the ink for a class of its own).
func classColour(class string) color.RGBA {
	if c, ok := classColours[class]; ok {
		return c
	}
	return chartInk
}

// stepAxis labels the x axis with the load steps (streams:rate, and :tenants with LLM
// tenants in the steps).
func stepAxis(p *plot.Plot, steps []*CapacityStep, llmSteps bool) {
	var ticks plot.ConstantTicks
	for i, st := range steps {
		l := fmt.Sprintf("%d:%g", st.Streams, st.Rate)
		if llmSteps {
			l += fmt.Sprintf(":%d", st.Tenants)
		}
		ticks = append(ticks, plot.Tick{Value: float64(i), Label: l})
	}
	p.X.Tick.Marker = ticks
	p.X.Label.Text = "load step (streams:rate)"
	if llmSteps {
		p.X.Label.Text = "load step (streams:rate:llm tenants)"
	}
}

// drawKnee draws run ri's knee: a vertical line at its step, the runs a little apart.
func drawKnee(p *plot.Plot, ax logAxis, k *CapacityKnee, ri int, name string) {
	if k == nil || k.Step <= 0 {
		return
	}
	x := float64(k.Step-1) + 0.03*float64(2*ri-1)
	sty := draw.LineStyle{Color: chartInk, Width: px(1)}
	if ri == 1 {
		sty.Dashes = []vg.Length{px(2), px(2)}
	}
	p.Add(vline(x, ax, sty))
	if l, err := label(x, ax.max()/math.Pow(10, 0.04*float64(ri+1)*(ax.decHi-ax.decLo)), name+" knee", chartInk); err == nil {
		p.Add(l)
	}
}

// drawSeries draws one series of run ri over the steps: a line through the steps that
// have a value (broken where one has none) and a marker at each.
func drawSeries(p *plot.Plot, ax logAxis, steps []*CapacityStep, get func(*CapacityStep) *CollisionRun, sr capacitySeries, ri int) {
	var pts plotter.XYs
	flush := func() {
		if len(pts) > 1 {
			p.Add(&plotter.Line{XYs: pts, LineStyle: seriesStyle(sr.colour, ri == 1)})
		}
		pts = nil
	}
	var marks plotter.XYs
	for i, st := range steps {
		cr := get(st)
		if cr == nil || sr.value(cr) <= 0 {
			flush()
			continue
		}
		pt := plotter.XY{X: float64(i), Y: math.Max(sr.value(cr), ax.min())}
		pts, marks = append(pts, pt), append(marks, pt)
	}
	flush()
	if len(marks) > 0 {
		p.Add(&plotter.Scatter{XYs: marks, GlyphStyle: markerStyle(sr.colour, ri == 0)})
	}
}

// seriesStyle is a capacity series' line: solid, or dashed.
func seriesStyle(c color.Color, dashed bool) draw.LineStyle {
	s := draw.LineStyle{Color: c, Width: px(chartLineWidth)}
	if dashed {
		s.Dashes = []vg.Length{px(6), px(6)}
	}
	return s
}

// markerStyle is a capacity series' marker: a 9-pixel square, filled or hollow.
func markerStyle(c color.Color, filled bool) draw.GlyphStyle {
	s := draw.GlyphStyle{Color: c, Radius: px(4.5), Shape: draw.SquareGlyph{}}
	if filled {
		s.Shape = draw.BoxGlyph{}
	}
	return s
}

// logAxis is a chart's y axis: ms on a log scale over whole decades, from decLo to decHi
// (powers of ten).
type logAxis struct{ decLo, decHi float64 }

// newLogAxis is the decades around [lo, hi] (lo at least 0.01 ms; at least one decade).
func newLogAxis(lo, hi float64) logAxis {
	lo = math.Max(lo, 0.01)
	decLo, decHi := math.Floor(math.Log10(lo)), math.Ceil(math.Log10(hi))
	if decHi <= decLo {
		decHi = decLo + 1
	}
	return logAxis{decLo, decHi}
}

func (a logAxis) min() float64 { return math.Pow(10, a.decLo) }
func (a logAxis) max() float64 { return math.Pow(10, a.decHi) }

// plot is a plot on this axis: a grid line and a tick (in ms or s) at every decade.
func (a logAxis) plot(ylabel string) *plot.Plot {
	p := plot.New()
	p.BackgroundColor = chartBG
	p.Y.Scale = plot.LogScale{}
	var ticks plot.ConstantTicks
	for d := a.decLo; d <= a.decHi; d++ {
		ticks = append(ticks, plot.Tick{Value: math.Pow(10, d), Label: fmtMS(math.Pow(10, d))})
	}
	p.Y.Tick.Marker = ticks
	p.Y.Label.Text = ylabel
	for _, ax := range []*plot.Axis{&p.X, &p.Y} {
		ax.Color, ax.Tick.Color, ax.Tick.Label.Color, ax.Label.TextStyle.Color = chartInk, chartInk, chartInk, chartInk
	}
	g := plotter.NewGrid()
	g.Vertical.Color = nil
	g.Horizontal = draw.LineStyle{Color: chartGrid, Width: px(1)}
	p.Add(g)
	return p
}

// fix sets the plot's y range to the axis' decades (after the plotters widened it).
func (a logAxis) fix(p *plot.Plot) { p.Y.Min, p.Y.Max = a.min(), a.max() }

// rect is a bar: the ring of the rectangle [x0, x1] x [y0, y1].
func rect(x0, y0, x1, y1 float64) plotter.XYs {
	return plotter.XYs{{X: x0, Y: y0}, {X: x0, Y: y1}, {X: x1, Y: y1}, {X: x1, Y: y0}}
}

// hline is a horizontal line at y from x0 to x1.
func hline(x0, x1, y float64, sty draw.LineStyle) *plotter.Line {
	return &plotter.Line{XYs: plotter.XYs{{X: x0, Y: y}, {X: x1, Y: y}}, LineStyle: sty}
}

// vline is a vertical line at x across the axis.
func vline(x float64, a logAxis, sty draw.LineStyle) *plotter.Line {
	return &plotter.Line{XYs: plotter.XYs{{X: x, Y: a.min()}, {X: x, Y: a.max()}}, LineStyle: sty}
}

// label is text just above (x, y), in colour c.
func label(x, y float64, text string, c color.Color) (*plotter.Labels, error) {
	l, err := plotter.NewLabels(plotter.XYLabels{XYs: plotter.XYs{{X: x, Y: y}}, Labels: []string{text}})
	if err != nil {
		return nil, err
	}
	l.TextStyle[0].Color = c
	l.Offset = vg.Point{X: px(2), Y: px(3)}
	return l, nil
}

// legendItem is one entry of a chart's legend row.
type legendItem struct {
	name   string
	thumbs []plot.Thumbnailer
}

// saveChart draws the plot under a band holding the title, the legend entries in a row
// and the caption ("" = none), on a w x h pixel canvas, and writes it to path (its
// folder made): as an SVG when path ends in .svg, else as a PNG.
func saveChart(path string, w, h int, p *plot.Plot, title string, legend []legendItem, caption string) error {
	format := "png"
	if strings.EqualFold(filepath.Ext(path), ".svg") {
		format = "svg"
	}
	cw, err := draw.NewFormattedCanvas(px(float64(w)), px(float64(h)), format)
	if err != nil {
		return err
	}
	dc := draw.New(cw)
	dc.FillPolygon(chartBG, []vg.Point{dc.Min, {X: dc.Min.X, Y: dc.Max.Y}, dc.Max, {X: dc.Max.X, Y: dc.Min.Y}})
	sty := p.Title.TextStyle
	sty.Color, sty.Font.Size, sty.XAlign, sty.YAlign = chartInk, vg.Points(11), draw.XLeft, draw.YBottom
	line := px(22)
	left, top := dc.Min.X+px(20), dc.Max.Y-px(8)
	// nextLine is the band's next line: its canvas and its text's baseline.
	nextLine := func() (draw.Canvas, vg.Point) {
		top -= line
		return draw.Crop(dc, 0, 0, top-dc.Min.Y, top+line-dc.Max.Y), vg.Point{X: left, Y: top + px(6)}
	}
	_, at := nextLine()
	dc.FillText(sty, at, title)
	row, _ := nextLine()
	x := left
	for _, it := range legend {
		l := plot.NewLegend()
		l.Left, l.Top, l.XOffs = true, true, x-dc.Min.X
		l.TextStyle.Color, l.TextStyle.Font.Size = chartInk, vg.Points(10)
		l.Add(it.name, it.thumbs...)
		l.Draw(row)
		x += l.ThumbnailWidth + l.TextStyle.Rectangle(" "+it.name).Max.X + px(24)
	}
	if caption != "" {
		_, at := nextLine()
		dc.FillText(sty, at, caption)
	}
	p.Draw(draw.Crop(dc, 0, 0, 0, top-px(8)-dc.Max.Y))
	var buf bytes.Buffer
	if _, err := cw.WriteTo(&buf); err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	return os.WriteFile(path, buf.Bytes(), 0o644)
}
