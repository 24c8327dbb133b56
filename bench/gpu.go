package bench

// What the webgpu benches need to know of the machine: whether it has a GPU at all
// (findGPU), the Vulkan device Dawn takes (probeAdapter, over vulkan.Probe: the WebGPU
// EP is Dawn over Vulkan on Linux), and the environment Dawn wants (webgpuEnv).

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/ortbus/ortbus/devices/vulkan"
)

// GPU is what findGPU found.
type GPU struct {
	// Device is what a webgpu pool on the GPU names (cuda:0, drm:N); "" = no GPU.
	Device string `json:"device,omitempty"`
	// What says what was found (e.g. "NVIDIA H200 (nvidia-smi)"), or, with no GPU, what
	// was looked for and missing.
	What string `json:"what"`
	// PCIDevice is the GPU's PCI device id where nvidia-smi gives it (pci.device_id's
	// upper 16 bits), else 0: the Vulkan adapter a path runs on must have it.
	PCIDevice uint32 `json:"pci_device_id,omitempty"`
}

// NotGPUFigure marks a run whose Vulkan adapter is not the GPU it names.
const NotGPUFigure = "not a GPU figure"

// checkAdapter fails a run on GPU g whose Vulkan adapter a (the one Dawn takes) is not
// that GPU (vulkan.NotTheGPU: llvmpipe, or another vendor's or model's device), naming
// both: its figures would be another device's. Without a GPU (g.Device "") it passes:
// such a run is a smoke, labelled SmokeLabel.
func (g GPU) checkAdapter(a vulkan.Adapter) error {
	if g.Device == "" {
		return nil
	}
	if why := vulkan.NotTheGPU(a, g.Device, g.PCIDevice); why != "" {
		return fmt.Errorf("%s: the run would be on %s, but the GPU is %s (%s): %s", NotGPUFigure, a.Name, g.What, g.Device, why)
	}
	return nil
}

// findGPU decides whether this machine has a GPU for the webgpu EP: an nvidia-smi that
// lists a GPU (cuda:0), else a DRM render node (/dev/dri/renderD*: drm:N, N the card
// beside it). nvidiaSMI runs `nvidia-smi --query-gpu=name,pci.device_id
// --format=csv,noheader` (an exec.ErrNotFound error: no nvidia-smi); renderNodes are the
// render nodes' paths.
func findGPU(nvidiaSMI func() ([]byte, error), renderNodes []string) GPU {
	out, err := nvidiaSMI()
	var smi string
	switch {
	case errors.Is(err, exec.ErrNotFound):
		smi = "nvidia-smi not found"
	case err != nil:
		smi = fmt.Sprintf("nvidia-smi failed (%s)", oneLine(err.Error()))
	default:
		if line, _, _ := strings.Cut(strings.TrimSpace(string(out)), "\n"); strings.TrimSpace(line) != "" {
			name, pci := strings.TrimSpace(line), uint32(0)
			// "NVIDIA H200, 0x233510DE": the device id is the upper half.
			if i := strings.LastIndex(line, ","); i >= 0 {
				if v, err := strconv.ParseUint(strings.TrimPrefix(strings.ToLower(strings.TrimSpace(line[i+1:])), "0x"), 16, 32); err == nil {
					name, pci = strings.TrimSpace(line[:i]), uint32(v>>16)
				}
			}
			return GPU{Device: "cuda:0", What: name + " (nvidia-smi)", PCIDevice: pci}
		}
		smi = "nvidia-smi lists no GPU"
	}
	if len(renderNodes) > 0 {
		slices.Sort(renderNodes)
		return GPU{Device: drmDevice(renderNodes[0]), What: renderNodes[0] + " (DRM render node)"}
	}
	return GPU{What: "no NVIDIA GPU: " + smi + ", and no DRM render node (/dev/dri/renderD*)"}
}

// detectGPU is findGPU on this machine.
func detectGPU() GPU {
	nodes, _ := filepath.Glob("/dev/dri/renderD*")
	return findGPU(func() ([]byte, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		return exec.CommandContext(ctx, "nvidia-smi", "--query-gpu=name,pci.device_id", "--format=csv,noheader").Output()
	}, nodes)
}

// drmDevice is the device name (drm:N) of a render node: N is the card of the same DRM
// device (/sys/class/drm/renderDX/device/drm/cardN), else 0.
func drmDevice(node string) string {
	cards, _ := filepath.Glob(filepath.Join("/sys/class/drm", filepath.Base(node), "device", "drm", "card*"))
	for _, c := range cards {
		if n := strings.TrimPrefix(filepath.Base(c), "card"); n != "" && strings.Trim(n, "0123456789") == "" {
			return "drm:" + n
		}
	}
	return "drm:0"
}

// probeAdapter probes Vulkan in this process (vulkan.Probe: the same loader, drivers,
// VK_DRIVER_FILES and LD_LIBRARY_PATH as Dawn's in this process and its children) and
// returns the report and the adapter Dawn takes; an error says what is missing.
func probeAdapter(ctx context.Context) (*vulkan.Report, vulkan.Adapter, error) {
	r := vulkan.Probe(ctx)
	a, ok := r.Picked()
	if r.LoaderErr != "" || !ok {
		return r, a, errors.New(r.Problem())
	}
	return r, a, nil
}

// webgpuEnv sets XDG_RUNTIME_DIR, which Dawn reads, when it is unset: a private (0700)
// directory under dir. The bench process (its in-process loop), the gateway and its
// workers, and the onnxruntime-node runner inherit it. restore undoes it.
func webgpuEnv(dir string) (restore func(), err error) {
	if os.Getenv("XDG_RUNTIME_DIR") != "" {
		return func() {}, nil
	}
	d := filepath.Join(dir, "xdg-runtime")
	if err := os.MkdirAll(d, 0o700); err != nil {
		return nil, err
	}
	if err := os.Chmod(d, 0o700); err != nil {
		return nil, err
	}
	os.Setenv("XDG_RUNTIME_DIR", d)
	return func() { os.Unsetenv("XDG_RUNTIME_DIR") }, nil
}
