package demo

import (
	"strings"
	"testing"
	"time"
)

// TestBurstLines: answers from the result cache are counted apart from the pools that
// ran requests, per class.
func TestBurstLines(t *testing.T) {
	var all []burstResult
	for i := 0; i < 20; i++ {
		all = append(all, burstResult{class: "batch", pool: "bulk", cached: i < 18, d: time.Duration(i+1) * time.Millisecond})
	}
	all = append(all, burstResult{class: "interactive", pool: "fast", d: 3 * time.Millisecond},
		burstResult{class: "interactive", pool: "bulk", d: 5 * time.Millisecond})
	lines := burstLines(all, "interactive", "batch", "urgent")
	if len(lines) != 2 {
		t.Fatalf("%d lines, want one per class with answers: %q", len(lines), lines)
	}
	if !strings.Contains(lines[0], "interactive  run by bulk:1 fast:1, 0 answered from the cache") {
		t.Errorf("interactive: %q", lines[0])
	}
	if !strings.Contains(lines[1], "batch        run by bulk:2, 18 answered from the cache") || !strings.Contains(lines[1], "max 20ms") {
		t.Errorf("batch: %q", lines[1])
	}
	only := burstLines([]burstResult{{class: "batch", pool: "fast", cached: true, d: time.Millisecond}}, "batch")
	if len(only) != 1 || !strings.Contains(only[0], "run by no pool, 1 answered from the cache") {
		t.Errorf("only cached: %q", only)
	}
}
