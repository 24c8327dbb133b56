package bench

import (
	"sync/atomic"
	"testing"
	"time"
)

// TestMemWatch: the watch keeps the largest reading and how many it took (one at its
// start and one at its stop at least, so no wait is needed), sets the peak against the
// budget, and stop is idempotent; without a reader, or on a nil watch, there is no peak
// to give, and it says so.
func TestMemWatch(t *testing.T) {
	var n atomic.Int64
	readings := []int64{300 << 20, 900 << 20, 500 << 20}
	w := &memWatch{reading: "nvidia-smi (memory.used)", budget: 1000 << 20, every: time.Hour,
		read: func() (int64, bool) { return readings[min(int(n.Add(1))-1, len(readings)-1)], true }}
	stop := w.start()
	p := stop()
	if p.Samples != 2 || p.PeakUsedBytes != 900<<20 || p.PeakOfBudget != 0.9 || !p.Within() || p.Reading != w.reading {
		t.Fatalf("peak %+v, want 2 samples, 900 MiB, 0.9 of the budget, within it", p)
	}
	if again := stop(); again != p || again.Samples != 2 {
		t.Fatalf("a second stop gave %+v", again)
	}
	over := &memWatch{reading: "x", budget: 100, every: time.Hour, read: func() (int64, bool) { return 101, true }}
	if p := over.start()(); p.Within() || p.PeakOfBudget <= 1 {
		t.Fatalf("a peak over the budget: %+v", p)
	}
	failing := &memWatch{reading: "x", budget: 100, every: time.Hour, read: func() (int64, bool) { return 0, false }}
	if p := failing.start()(); p.Samples != 0 || p.Reading != NoMemoryReading || p.Within() {
		t.Fatalf("a reader that never reads: %+v", p)
	}
	if p := (&memWatch{budget: 100}).start()(); p.Reading != NoMemoryReading || p.BudgetBytes != 100 || p.Within() {
		t.Fatalf("no reader: %+v", p)
	}
	var none *memWatch
	if p := none.start()(); p != nil {
		t.Fatalf("a nil watch gave %+v", p)
	}
}
