package gateway

import (
	"math"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/ortbus/ortbus/codec"
)

// The classes' recent latency, for status (ClassStatus) and the page (page.go): read from
// the gateway's own metrics, the one record of what was answered, never counted twice.
//
//  1. Once a second (classTick) the window takes a sample: per class, the cumulative
//     buckets of ortbus_request_seconds (every op summed) and the counts of
//     ortbus_requests_total answered overloaded (shed) and deadline_exceeded (expired).
//  2. The last minute's p50 and p95 are those of the buckets' growth between the newest
//     sample and the one a minute older (the oldest kept while the window is younger),
//     interpolated within a bucket as Prometheus's histogram_quantile does.
//  3. Every classHistoryStep the last minute's p95 of each class joins its history, of
//     classHistoryLen points (10 minutes): the page's chart. A class with no result in
//     the minute has no point there (NaN, sent as null).
type classWindow struct {
	latency  *prometheus.HistogramVec
	requests *prometheus.CounterVec

	mu      sync.Mutex
	samples []classSample // oldest first, at most classWindowLen+1
	history map[string][]float64
	steps   int // samples taken since the last history point
}

// classSample is one sample of rule 1.
type classSample struct {
	at time.Time
	by map[string]*classTally
}

// classTally are one class's figures in a sample.
type classTally struct {
	buckets []float64 // cumulative counts at the upper bounds of latencyBuckets, then +Inf
	shed    float64
	expired float64
}

// The window's timing (rules 1 to 3).
const (
	classTick         = time.Second
	classWindowLen    = 60 // samples: a minute
	classHistoryStep  = 5  // samples between two history points
	classHistoryLen   = 120
	classQuantileLow  = 0.5
	classQuantileHigh = 0.95
)

func newClassWindow(m *metrics) *classWindow {
	return &classWindow{latency: m.latency, requests: m.requests, history: map[string][]float64{}}
}

// start samples every classTick until the returned stop is called.
func (cw *classWindow) start() (stop func()) { return every(classTick, cw.sample) }

// sample takes one sample at now (rule 1) and, every classHistoryStep, a history point.
func (cw *classWindow) sample(now time.Time) {
	s := classSample{at: now, by: cw.read()}
	cw.mu.Lock()
	defer cw.mu.Unlock()
	cw.samples = append(cw.samples, s)
	if len(cw.samples) > classWindowLen+1 {
		cw.samples = append(cw.samples[:0], cw.samples[len(cw.samples)-classWindowLen-1:]...)
	}
	if cw.steps++; cw.steps < classHistoryStep {
		return
	}
	cw.steps = 0
	first := cw.samples[0]
	for class, c := range s.by {
		h := append(cw.history[class], quantile(classQuantileHigh, c.buckets, first.by[class]))
		if len(h) > classHistoryLen {
			h = h[len(h)-classHistoryLen:]
		}
		cw.history[class] = h
	}
}

// read is the metrics' figures per class now.
func (cw *classWindow) read() map[string]*classTally {
	by := map[string]*classTally{}
	get := func(class string) *classTally {
		c := by[class]
		if c == nil {
			c = &classTally{buckets: make([]float64, len(latencyBuckets)+1)}
			by[class] = c
		}
		return c
	}
	collect(cw.latency, func(labels map[string]string, m *dto.Metric) {
		h := m.GetHistogram()
		if h == nil || labels["class"] == "" {
			return
		}
		c := get(labels["class"])
		for i, b := range h.GetBucket() {
			if i < len(latencyBuckets) {
				c.buckets[i] += float64(b.GetCumulativeCount())
			}
		}
		c.buckets[len(latencyBuckets)] += float64(h.GetSampleCount())
	})
	collect(cw.requests, func(labels map[string]string, m *dto.Metric) {
		if labels["class"] == "" {
			return
		}
		switch codec.Code(labels["code"]) {
		case codec.CodeOverloaded:
			get(labels["class"]).shed += m.GetCounter().GetValue()
		case codec.CodeDeadlineExceeded:
			get(labels["class"]).expired += m.GetCounter().GetValue()
		}
	})
	return by
}

// collect calls f with each series of c, its labels by name.
func collect(c prometheus.Collector, f func(labels map[string]string, m *dto.Metric)) {
	ch := make(chan prometheus.Metric, 64)
	go func() { c.Collect(ch); close(ch) }()
	for pm := range ch {
		var m dto.Metric
		if pm.Write(&m) != nil {
			continue
		}
		labels := make(map[string]string, len(m.GetLabel()))
		for _, l := range m.GetLabel() {
			labels[l.GetName()] = l.GetValue()
		}
		f(labels, &m)
	}
}

// classFigures are one class's figures of the last minute (rule 2).
type classFigures struct {
	answered  int
	p50, p95  float64 // ms; NaN without answers
	shed, exp uint64
}

// figures are class's figures now (zero before the first sample).
func (cw *classWindow) figures(class string) classFigures {
	cw.mu.Lock()
	defer cw.mu.Unlock()
	f := classFigures{p50: math.NaN(), p95: math.NaN()}
	if len(cw.samples) == 0 {
		return f
	}
	last := cw.samples[len(cw.samples)-1].by[class]
	if last == nil {
		return f
	}
	first := cw.samples[0].by[class]
	f.shed, f.exp = uint64(last.shed), uint64(last.expired)
	f.answered = int(last.buckets[len(latencyBuckets)] - countOf(first))
	f.p50 = quantile(classQuantileLow, last.buckets, first)
	f.p95 = quantile(classQuantileHigh, last.buckets, first)
	return f
}

// history is class's p95 history (rule 3), oldest first, a copy.
func (cw *classWindow) historyOf(class string) []float64 {
	cw.mu.Lock()
	defer cw.mu.Unlock()
	return append([]float64(nil), cw.history[class]...)
}

// countOf is the answers counted in c (0 for none).
func countOf(c *classTally) float64 {
	if c == nil {
		return 0
	}
	return c.buckets[len(latencyBuckets)]
}

// quantile is the q-quantile in milliseconds of the answers counted in now but not in
// before (nil: none before), NaN when there are none (rule 2). Within the bucket where
// it falls it is interpolated linearly from the bucket's lower bound (0 for the first);
// in the +Inf bucket it is the highest finite bound.
func quantile(q float64, now []float64, before *classTally) float64 {
	delta := func(i int) float64 {
		if before == nil {
			return now[i]
		}
		return now[i] - before.buckets[i]
	}
	total := delta(len(latencyBuckets))
	if total <= 0 {
		return math.NaN()
	}
	rank := q * total
	lower, below := 0.0, 0.0
	for i, upper := range latencyBuckets {
		c := delta(i)
		if c >= rank {
			if c == below {
				return upper * 1e3
			}
			return (lower + (upper-lower)*(rank-below)/(c-below)) * 1e3
		}
		lower, below = upper, c
	}
	return latencyBuckets[len(latencyBuckets)-1] * 1e3
}

// fill sets cs's figures of the last minute (ClassStatus).
func (cw *classWindow) fill(cs *codec.ClassStatus) {
	f := cw.figures(cs.Name)
	cs.Answered1m, cs.Shed, cs.Expired = f.answered, f.shed, f.exp
	if !math.IsNaN(f.p50) {
		cs.P50MS1m, cs.P95MS1m = round3(f.p50), round3(f.p95)
	}
}

// round3 rounds v to 3 decimals (a microsecond in ms).
func round3(v float64) float64 { return math.Round(v*1e3) / 1e3 }

// classHistories are the p95 histories of g's configured classes (rule 3), for the page's
// snapshots (events.go); nil for a gateway without metrics (a test's).
func classHistories(g *Gateway) func() map[string][]float64 {
	if g.metrics == nil || g.metrics.window == nil {
		return nil
	}
	return func() map[string][]float64 {
		out := map[string][]float64{}
		for _, class := range g.conf().ClassNames() {
			out[class] = g.metrics.window.historyOf(class)
		}
		return out
	}
}
