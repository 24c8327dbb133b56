package config

import (
	"strings"
	"testing"
)

// TestGateClass: [devices.NAME] gate_class names a configured class, or the config is
// refused naming the key.
func TestGateClass(t *testing.T) {
	c, err := Load(write(t, good+"\n[devices.\"cuda:0\"]\ncapacity = \"1GiB\"\ngate_class = \"interactive\"\n"))
	if err != nil {
		t.Fatal(err)
	}
	if got := c.Devices["cuda:0"].GateClass; got != "interactive" {
		t.Errorf("gate_class %q", got)
	}
	_, err = Load(write(t, good+"\n[devices.\"cuda:0\"]\ngate_class = \"nope\"\n"))
	if err == nil || !strings.Contains(err.Error(), `devices.cuda:0.gate_class: class "nope" is not configured`) {
		t.Fatalf("unknown gate_class: %v", err)
	}
}
