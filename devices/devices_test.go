package devices

import (
	"strings"
	"testing"
)

func TestCPUCapacity(t *testing.T) {
	b, src, err := Capacity("cpu")
	if err != nil || b < 64<<20 || !strings.Contains(src, "meminfo") {
		t.Fatalf("cpu capacity %d from %q: %v", b, src, err)
	}
	if _, ok := Used("cpu"); ok {
		t.Fatal("Used(cpu) should have no reader")
	}
	if _, _, err := Capacity("gpu.intel:0"); err == nil || !strings.Contains(err.Error(), "capacity") {
		t.Fatalf("unknown device: %v", err)
	}
}
