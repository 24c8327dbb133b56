package gateway

import (
	"strings"
	"testing"

	"github.com/ortbus/ortbus/codec"
)

// WorkerID: the ids of supervised workers carry their gateway's id, so two gateways on
// one bus never give the same id to workers of pools of the same name; every id is a
// valid worker id, however long or non-ASCII the pool and gateway names.
func TestWorkerID(t *testing.T) {
	for _, c := range []struct {
		pool      string
		slot, gen int
		gateway   string
		want      string
	}{
		{"fast", 0, 0, "gwa", "fast-0@gwa"},
		{"fast", 1, 0, "gwb", "fast-1@gwb"},
		{"fast", 0, 3, "gwa", "fast-0-r3@gwa"},
		{"cpu", 0, 0, "host-1234", "cpu-0@host-1234"},
	} {
		if got := WorkerID(c.pool, c.slot, c.gen, c.gateway); got != c.want {
			t.Errorf("WorkerID(%q, %d, %d, %q) = %q, want %q", c.pool, c.slot, c.gen, c.gateway, got, c.want)
		}
	}

	long := strings.Repeat("p", 128)
	gwLong := strings.Repeat("g", 120)
	pools := []string{"fast", "fo", long, long[:127] + "q", "café", "caf\u00e8", strings.Repeat("é", 64)}
	gateways := []string{"gwa", "gwb", gwLong + "-1", gwLong + "-2", "gw-é", "gw-è", "host-1234"}
	seen := map[string]string{}
	for _, p := range pools {
		for _, g := range gateways {
			for slot := range 3 {
				for gen := range 3 {
					id := WorkerID(p, slot, gen, g)
					if err := codec.CheckID("worker", id); err != nil {
						t.Fatalf("WorkerID(%q, %d, %d, %q): %v", p, slot, gen, g, err)
					}
					key := strings.Join([]string{p, g, string(rune('0' + slot)), string(rune('0' + gen))}, "|")
					if other, dup := seen[id]; dup {
						t.Fatalf("%q is the id of both %s and %s", id, other, key)
					}
					seen[id] = key
				}
			}
		}
	}
	// Long names keep its slot and generation readable and their pool's start.
	if id := WorkerID(long, 2, 1, gwLong+"-1"); !strings.HasPrefix(id, "ppp") || !strings.Contains(id, "-2-r1@ggg") {
		t.Errorf("long names: %q", id)
	}
}
