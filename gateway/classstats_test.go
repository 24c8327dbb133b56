package gateway

import (
	"io"
	"log/slog"
	"math"
	"testing"
	"time"

	"github.com/ortbus/ortbus/codec"
	"github.com/ortbus/ortbus/config"
)

func TestQuantile(t *testing.T) {
	n := len(latencyBuckets) + 1
	counts := func(pairs ...float64) []float64 { // (bucket index, count in it) pairs -> cumulative
		c := make([]float64, n)
		for i := 0; i < len(pairs); i += 2 {
			for j := int(pairs[i]); j < n; j++ {
				c[j] += pairs[i+1]
			}
		}
		return c
	}
	// 100 answers in (5 ms, 10 ms]: the median is 7.5 ms, p95 9.75 ms.
	now := counts(4, 100)
	if got := quantile(0.5, now, nil); math.Abs(got-7.5) > 1e-9 {
		t.Errorf("p50 %v, want 7.5", got)
	}
	if got := quantile(0.95, now, nil); math.Abs(got-9.75) > 1e-9 {
		t.Errorf("p95 %v, want 9.75", got)
	}
	// What was counted before does not count: the last 100 are in (0.25 s, 0.5 s].
	before := &classTally{buckets: now}
	later := counts(4, 100, 9, 100)
	if got := quantile(0.5, later, before); got <= 250 || got > 500 {
		t.Errorf("p50 of the growth %v, want within (250, 500] ms", got)
	}
	if got := quantile(0.5, now, before); !math.IsNaN(got) {
		t.Errorf("no growth: %v, want NaN", got)
	}
	// Past the last bound: the last bound.
	if got := quantile(0.95, counts(float64(len(latencyBuckets)), 10), nil); got != latencyBuckets[len(latencyBuckets)-1]*1e3 {
		t.Errorf("over the last bound: %v", got)
	}
	// The first bucket interpolates from 0.
	if got := quantile(0.5, counts(0, 10), nil); math.Abs(got-0.25) > 1e-9 {
		t.Errorf("first bucket: %v, want 0.25 ms", got)
	}
}

// TestClassWindow: the window reads the gateway's own metrics: the last minute's
// answers and quantiles per class, shed and expired counts, and the p95 history.
func TestClassWindow(t *testing.T) {
	c, err := config.Parse([]byte("[nats]\nembedded = true\n"), "")
	if err != nil {
		t.Fatal(err)
	}
	m := newMetrics(c, func() *config.Config { return c }, slog.New(slog.NewTextHandler(io.Discard, nil)))
	cw := m.window
	if f := cw.figures("batch"); f.answered != 0 || !math.IsNaN(f.p95) {
		t.Fatalf("before a sample: %+v", f)
	}
	t0 := time.Unix(1000, 0)
	answer := func(class string, d time.Duration, n int) {
		for i := 0; i < n; i++ {
			m.latency.WithLabelValues("tag", class).Observe(d.Seconds())
			m.requests.WithLabelValues("tag", class, "bulk", "tagger", "ok").Inc()
		}
	}
	answer("batch", 7*time.Millisecond, 10) // before the first sample: not in any minute
	m.requests.WithLabelValues("tag", "batch", "", "", string(codec.CodeOverloaded)).Add(3)
	m.requests.WithLabelValues("tag", "batch", "bulk", "", string(codec.CodeDeadlineExceeded)).Add(2)
	cw.sample(t0)
	answer("batch", 300*time.Millisecond, 20)
	answer("interactive", 3*time.Millisecond, 5)
	for i := 1; i <= classHistoryStep; i++ {
		cw.sample(t0.Add(time.Duration(i) * time.Second))
	}
	f := cw.figures("batch")
	if f.answered != 20 || f.p50 <= 250 || f.p50 > 500 || f.shed != 3 || f.exp != 2 {
		t.Errorf("batch: %+v", f)
	}
	var cs codec.ClassStatus
	cs.Name = "interactive"
	cw.fill(&cs)
	if cs.Answered1m != 5 || cs.P50MS1m <= 2.5 || cs.P95MS1m > 5 || cs.Shed != 0 {
		t.Errorf("interactive: %+v", cs)
	}
	if h := cw.historyOf("batch"); len(h) != 1 || h[0] <= 250 {
		t.Errorf("batch history %v, want one point of the minute's p95", h)
	}
	// A minute later without answers: none in the window, the counts stay, and the
	// history gets a gap.
	for i := 1; i <= classWindowLen; i++ {
		cw.sample(t0.Add(time.Duration(classHistoryStep+i) * time.Second))
	}
	if f := cw.figures("batch"); f.answered != 0 || !math.IsNaN(f.p95) || f.shed != 3 {
		t.Errorf("a quiet minute later: %+v", f)
	}
	h := cw.historyOf("batch")
	if len(h) != 1+classWindowLen/classHistoryStep || !math.IsNaN(h[len(h)-1]) {
		t.Errorf("history after a quiet minute: %v", h)
	}
	if len(cw.samples) != classWindowLen+1 {
		t.Errorf("%d samples kept, want %d", len(cw.samples), classWindowLen+1)
	}
}
