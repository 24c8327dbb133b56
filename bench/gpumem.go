package bench

// The GPU's memory during a collision run, as its driver reports it: the device's used
// memory (devices.Used: nvidia-smi for cuda:N, the DRM sysfs where the driver publishes
// it for drm:N) sampled every memEvery from before the run's tenants start until every
// answer is in, its peak set against the device's budget (capacity x safe fraction, the
// gateway's admission budget). The readings are the whole device's: every process on it,
// ortbus's workers, the LLM tenant and any other, as the budget has to hold them all.

import (
	"sync"
	"time"
)

// memEvery is the sampling period: an nvidia-smi call takes about 25 ms.
const memEvery = 100 * time.Millisecond

// NoMemoryReading is what a run reports where the device has no driver reading of its
// memory (the CPU, lavapipe's logical GPU): there is no peak to give.
const NoMemoryReading = "n/a (no driver memory reading)"

// MemoryPeak is the GPU's memory in one run.
type MemoryPeak struct {
	// Reading is where the figures come from (nvidia-smi, DRM sysfs), or
	// NoMemoryReading.
	Reading string `json:"reading"`
	// Samples is how many readings were taken; PeakUsedBytes the largest.
	Samples       int   `json:"samples"`
	PeakUsedBytes int64 `json:"peak_used_bytes"`
	// BudgetBytes is the device's budget (capacity x safe fraction) and PeakOfBudget
	// the peak as a fraction of it (0 without a reading).
	BudgetBytes  int64   `json:"budget_bytes"`
	PeakOfBudget float64 `json:"peak_of_budget"`
}

// Within reports whether the peak stayed within the budget (false without a reading).
func (m *MemoryPeak) Within() bool {
	return m != nil && m.Samples > 0 && m.PeakUsedBytes <= m.BudgetBytes
}

// memWatch samples a device's used memory during runs.
type memWatch struct {
	// read is one reading (ok false: none); reading names where it comes from.
	read    func() (int64, bool)
	reading string
	budget  int64
	every   time.Duration
}

// start begins sampling (a nil watch samples nothing); stop ends it and returns the peak
// (nil for a nil watch). stop may be called more than once: the later calls return the
// first one's figures.
func (m *memWatch) start() (stop func() *MemoryPeak) {
	if m == nil {
		return func() *MemoryPeak { return nil }
	}
	peak := &MemoryPeak{Reading: m.reading, BudgetBytes: m.budget}
	if m.read == nil {
		peak.Reading = NoMemoryReading
		return func() *MemoryPeak { return peak }
	}
	done := make(chan struct{})
	var wg sync.WaitGroup
	sample := func() {
		if used, ok := m.read(); ok {
			peak.Samples++
			peak.PeakUsedBytes = max(peak.PeakUsedBytes, used)
		}
	}
	wg.Go(func() {
		t := time.NewTicker(m.every)
		defer t.Stop()
		for {
			sample()
			select {
			case <-done:
				sample()
				return
			case <-t.C:
			}
		}
	})
	var once sync.Once
	return func() *MemoryPeak {
		once.Do(func() {
			close(done)
			wg.Wait()
			if peak.Samples == 0 {
				peak.Reading = NoMemoryReading
			}
			if peak.BudgetBytes > 0 && peak.Samples > 0 {
				peak.PeakOfBudget = round(float64(peak.PeakUsedBytes)/float64(peak.BudgetBytes), 4)
			}
		})
		return peak
	}
}
