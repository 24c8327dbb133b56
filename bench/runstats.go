package bench

// A run's statistics: CollisionRun (every class of one run) and ClassStats (one class's
// latencies, misses, errors, throughput and degraded answers), computed from the calls
// and stream frames the schedule runner (schedule.go) recorded.

import (
	"encoding/json"
	"time"

	"github.com/ortbus/ortbus/codec"
	"github.com/ortbus/ortbus/subjects"
)

// CollisionRun is one run of every class at once.
type CollisionRun struct {
	Classes map[string]*ClassStats
	// DrainMS is the time from the end of arrivals (the window) until the batch backlog
	// is empty (its last answer); 0 when it emptied within the window.
	DrainMS float64
	// Tenant is the LLM tenants' figures (nil: the run had none).
	Tenant *TenantStats
	// GPUMemory is the GPU's peak memory in the run, as its driver reports it (nil: the
	// scenario has no GPU).
	GPUMemory *MemoryPeak
}

// MarshalJSON writes the classes and drain_ms side by side, as the report schema has it
// (and llm_tenant, when the run had the tenant).
func (r *CollisionRun) MarshalJSON() ([]byte, error) {
	m := map[string]any{"drain_ms": r.DrainMS}
	if r.Tenant != nil {
		m["llm_tenant"] = r.Tenant
	}
	if r.GPUMemory != nil {
		m["gpu_memory"] = r.GPUMemory
	}
	for k, v := range r.Classes {
		m[k] = v
	}
	return json.Marshal(m)
}

// ClassStats are one class's statistics in one run. Latency percentiles are over the
// results and the deadline misses (a deadline_exceeded answer counts as its deadline, or
// its answer time if that was later); overloaded and other errors are counted apart.
// Queue wait is the results' timing.queue_us.
type ClassStats struct {
	Count    int     `json:"count"`
	OK       int     `json:"ok"`
	P50MS    float64 `json:"p50_ms"`
	P95MS    float64 `json:"p95_ms"`
	P99MS    float64 `json:"p99_ms"`
	MaxMS    float64 `json:"max_ms"`
	QueueP95 float64 `json:"queue_wait_p95_ms"`
	// DeadlineMisses are deadline_exceeded answers plus results that came after the
	// request's deadline (its timeout_ms).
	DeadlineMisses int `json:"deadline_misses"`
	Late           int `json:"late"`
	Overloaded     int `json:"overloaded"`
	// ThroughputPerS is results per second from the run's start to the class's last
	// result.
	ThroughputPerS float64 `json:"throughput_per_s"`
	// WindowThroughputPerS is results per second during the arrival window: results
	// received until the window's end (or the class's last result, if that came first)
	// over that time. For the batch flood this is its throughput during the collision.
	WindowThroughputPerS float64        `json:"window_throughput_per_s"`
	Errors               map[string]int `json:"errors,omitempty"`
	Unanswered           int            `json:"unanswered"`
	// Stream holds the audio streams' figures of a stream class (see stream.go); its
	// frames are the class's requests, their latency counted from each frame's due time.
	Stream *StreamStats `json:"stream,omitempty"`
	// Degraded, for a class whose chain has more than one pool, counts its results served
	// by a pool after the chain's first (degrade, or a spill), with their latency.
	Degraded *DegradeStats `json:"degraded,omitempty"`

	latencies []time.Duration // sorted; for the chart
}

// DegradeStats are a class's results served past its chain's first pool.
type DegradeStats struct {
	// Preferred is the chain's first pool; Count the results served by another.
	Preferred string  `json:"preferred"`
	Count     int     `json:"count"`
	P50MS     float64 `json:"p50_ms"`
	P95MS     float64 `json:"p95_ms"`
	MaxMS     float64 `json:"max_ms"`
}

// degradeStats is the degrade figures of a class's calls (nil when its chain has one
// pool).
func degradeStats(sc *Scenario, c ScenarioClass, calls []call) *DegradeStats {
	chain := sc.chain(c.Name, c.Model)
	if len(chain) < 2 {
		return nil
	}
	d := &DegradeStats{Preferred: chain[0]}
	var lat []time.Duration
	for _, k := range calls {
		if k.Done && k.Code == "" && k.Pool != "" && k.Pool != chain[0] {
			d.Count++
			lat = append(lat, k.Latency())
		}
	}
	l := summarize(lat)
	d.P50MS, d.P95MS, d.MaxMS = ms(l.P50), ms(l.P95), ms(l.Max)
	return d
}

// collisionRun computes each class's statistics from its calls and its streams' frames,
// and the batch class's drain past the window.
func collisionRun(sc *Scenario, calls []call, frames [][]frameRec, start, windowEnd time.Time) *CollisionRun {
	run := &CollisionRun{Classes: map[string]*ClassStats{}}
	for ci, c := range sc.Classes {
		var mine []call
		for _, k := range calls {
			if k.Class == c.Name {
				mine = append(mine, k)
			}
		}
		for i := range frames[ci] {
			mine = append(mine, frames[ci][i].asCall(c.Name))
		}
		if len(mine) == 0 {
			continue
		}
		run.Classes[c.Name] = classStats(mine, start, windowEnd)
		run.Classes[c.Name].Degraded = degradeStats(sc, c, mine)
		if c.Arrival == "stream" {
			run.Classes[c.Name].Stream = streamStats(frames[ci], c.Streams)
		}
		if c.Name == subjects.ClassBatch {
			var last time.Time
			for _, k := range mine {
				if k.Done && k.Recv.After(last) {
					last = k.Recv
				}
			}
			run.DrainMS = ms(max(0, last.Sub(windowEnd)))
		}
	}
	return run
}

// classStats summarises one class's calls.
func classStats(calls []call, start, windowEnd time.Time) *ClassStats {
	s := &ClassStats{Count: len(calls), Errors: map[string]int{}}
	var lat, queue []time.Duration
	var lastOK time.Time
	for _, k := range calls {
		if !k.Done {
			s.Unanswered++
			continue
		}
		switch k.Code {
		case "":
			s.OK++
			lat = append(lat, k.Latency())
			queue = append(queue, time.Duration(k.QueueUS)*time.Microsecond)
			if k.Late() {
				s.Late++
				s.DeadlineMisses++
			}
			if k.Recv.After(lastOK) {
				lastOK = k.Recv
			}
		case string(codec.CodeDeadlineExceeded):
			s.DeadlineMisses++
			s.Errors[k.Code]++
			// A miss counts in the latencies as at least its deadline: it was not served
			// in time, however early the system said so.
			lat = append(lat, max(k.Latency(), k.Deadline))
		case codeSkipped:
			// A frame the client did not send: its deadline had passed (stream.go).
			s.DeadlineMisses++
			s.Errors[k.Code]++
			lat = append(lat, max(k.Latency(), k.Deadline))
		case string(codec.CodeOverloaded):
			s.Overloaded++
			s.Errors[k.Code]++
		default:
			s.Errors[k.Code]++
		}
	}
	if len(s.Errors) == 0 {
		s.Errors = nil
	}
	l, q := summarize(lat), summarize(queue)
	s.P50MS, s.P95MS, s.P99MS, s.MaxMS, s.QueueP95 = ms(l.P50), ms(l.P95), ms(l.P99), ms(l.Max), ms(q.P95)
	s.latencies = lat
	if span := lastOK.Sub(start); !lastOK.IsZero() && span > 0 {
		s.ThroughputPerS = round(float64(s.OK)/span.Seconds(), 2)
	}
	end := windowEnd
	if !lastOK.IsZero() && lastOK.Before(end) {
		end = lastOK
	}
	n := 0
	for _, k := range calls {
		if k.Done && k.Code == "" && !k.Recv.After(end) {
			n++
		}
	}
	if span := end.Sub(start); span > 0 {
		s.WindowThroughputPerS = round(float64(n)/span.Seconds(), 2)
	}
	return s
}
