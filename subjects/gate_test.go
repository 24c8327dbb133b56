package subjects

import "testing"

// TestGateSubject: a device name becomes one token of the gate subject.
func TestGateSubject(t *testing.T) {
	for device, want := range map[string]string{
		"cuda:0":      "ortbus.gate.gw.cuda:0",
		"gpu.intel:0": "ortbus.gate.gw.gpu_intel:0",
		"a b*>":       "ortbus.gate.gw.a_b__",
	} {
		if got, err := Gate("gw", device); err != nil || got != want {
			t.Errorf("Gate(gw, %q) = %q, %v; want %q", device, got, err, want)
		}
	}
	if _, err := Gate("gw", ""); err == nil {
		t.Error("an empty device is accepted")
	}
	if _, err := Gate("g.w", "cpu"); err == nil {
		t.Error("a gateway id with a dot is accepted")
	}
}
