package config

import (
	"strings"
	"testing"
)

// TestAdapterMismatch: adapter_mismatch is "refuse" (the default) or "flag", and only on a
// pool with webgpu in its chain; FlagsAdapterMismatch is true for "flag" alone.
func TestAdapterMismatch(t *testing.T) {
	webgpu := "[pools.gpu]\nep = \"webgpu\"\ndevice = \"cuda:0\"\nclasses = [\"batch\"]\nmodels = [\"tagger\"]\nlocal = false\n"
	for _, c := range []struct {
		pool, want string // want: "" = loads, else a part of the error
		flags      bool
	}{
		{webgpu, "", false},
		{webgpu + "adapter_mismatch = \"refuse\"\n", "", false},
		{webgpu + "adapter_mismatch = \"flag\"\n", "", true},
		{webgpu + "adapter_mismatch = \"warn\"\n", `pools.gpu.adapter_mismatch: want "refuse" or "flag", got "warn"`, false},
		{strings.Replace(webgpu, `ep = "webgpu"`, "ep = \"cpu\"\nfallback = [\"webgpu\"]", 1) + "adapter_mismatch = \"flag\"\n", "", true},
		{strings.Replace(webgpu, `ep = "webgpu"`, `ep = "cuda"`, 1) + "adapter_mismatch = \"flag\"\n", "pools.gpu.adapter_mismatch: \"flag\" needs webgpu", false},
	} {
		cfg, err := Load(write(t, good+c.pool))
		if c.want != "" {
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Errorf("%q: error %v, want %q", c.pool, err, c.want)
			}
			continue
		}
		if err != nil {
			t.Errorf("%q: %v", c.pool, err)
			continue
		}
		if p := cfg.Pools["gpu"]; p.FlagsAdapterMismatch() != c.flags || !p.UsesWebGPU() {
			t.Errorf("%q: flags %v, uses webgpu %v", c.pool, p.FlagsAdapterMismatch(), p.UsesWebGPU())
		}
	}
}
