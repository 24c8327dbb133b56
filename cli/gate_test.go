package cli

import (
	"bytes"
	"strings"
	"testing"

	"github.com/ortbus/ortbus/codec"
)

// TestPrintStatusGates: each gate is a row of the GATE ON table: device, class, paused
// now, paused share of the last minute, tenants.
func TestPrintStatusGates(t *testing.T) {
	var b bytes.Buffer
	PrintStatus(&b, &codec.StatusReply{Gates: []codec.GateStatus{{Device: "cuda:0", Class: "urgent", Paused: true, PausedShare1m: 0.125, Tenants: 2}}})
	out := b.String()
	if !strings.Contains(out, "GATE ON") || !strings.Contains(out, "cuda:0") || !strings.Contains(out, "12.5%") || !strings.Contains(out, "true") {
		t.Errorf("status without the gate row:\n%s", out)
	}
	b.Reset()
	PrintStatus(&b, &codec.StatusReply{})
	if strings.Contains(b.String(), "GATE ON") {
		t.Errorf("a gate table without gates:\n%s", b.String())
	}
}
