package cli

import "github.com/ortbus/ortbus/codec"

// adapterFlag is what the pool's state says of its live workers that serve on a Vulkan
// adapter that is not the GPU the pool's device names (adapter_mismatch = "flag": the
// heartbeat's adapter_mismatch), or "" when none does.
func adapterFlag(workers []codec.WorkerStatus, pool string) string {
	for _, wk := range workers {
		if wk.Pool == pool && wk.AdapterMismatch != "" && wk.State != codec.StateFailed {
			return "; ADAPTER MISMATCH (flagged, served all the same): " + oneLine(wk.AdapterMismatch, 200)
		}
	}
	return ""
}

// capacity is a device's capacity as the devices table shows it: its size, or, where it
// is unknown, that the device admits nothing, and why.
func capacity(d codec.DeviceStatus) string {
	if d.CapacityError != "" {
		return "unknown, admits nothing (" + oneLine(d.CapacityError, 120) + ")"
	}
	return mib(d.CapacityBytes)
}
