package devices

import "strings"

// ProcessSource names the reader of one process's memory on device: "nvidia-smi" for
// cuda:N, "drm-fdinfo" for drm:N, "" where there is none (cpu, or a KIND ortbus cannot
// read). It is what a worker's heartbeat says its device_bytes came from.
func ProcessSource(device string) string {
	switch {
	case strings.HasPrefix(device, "cuda:"):
		return "nvidia-smi"
	case strings.HasPrefix(device, "drm:"):
		return "drm-fdinfo"
	}
	return ""
}
