package worker

import (
	"cmp"
	"errors"
	"log/slog"
	"slices"
	"strings"
	"sync"

	"github.com/ortbus/ortbus/codec"
	"github.com/ortbus/ortbus/internal/fault"
)

// A lost adapter at run time (issue 41, item 10): the GPU under a webgpu worker's
// sessions goes away while it serves (a driver reset, a device removed, the driver's
// process killed).
//
//  1. A run on the webgpu EP whose error says its device is lost (deviceLost: Dawn's
//     "Device lost", Vulkan's VK_ERROR_DEVICE_LOST) is the adapter's loss: that job is
//     answered provider_unavailable (details ep, adapter, error), and so is every job
//     whose run fails after it.
//  2. The first such loss fails every model the worker serves, with that error: its next
//     heartbeat lists them failed (state failed, error provider_unavailable), status shows
//     why, and the gateway passes the pool over for them (every live worker failed them:
//     gateway/capacity.go, modelDown), so their classes' chains go on to their next
//     pools. A request that reaches the worker meanwhile is answered model_unavailable
//     (details.error: the provider_unavailable). The copies' sessions are closed once no
//     job holds them. A lost device does not come back within a process: the pool serves
//     again once its workers are restarted (ortbus reload, or their exit) on a GPU that
//     is there, or fails at start (provider_unavailable) on one that is not.
//  3. Where the loss can be caused on purpose (tests: internal/fault, ORTBUS_FAULT_INJECT=1
//     and a request path with fault.MagicAdapterLost), the run fails with
//     fault.LostDeviceError before the runtime is called. A real loss (a GPU reset) cannot
//     be caused on lavapipe, where the tests run: Mesa's CPU device is never lost.
type adapterWatch struct {
	models  *modelSet
	adapter func() string // the worker's Vulkan adapter, for the answer's details
	log     *slog.Logger

	mu   sync.Mutex
	lost *codec.Error // the loss, once seen (rule 2)
}

// deviceLostText is what a run error on a lost GPU device says, lower-cased.
var deviceLostText = []string{"device lost", "devicelost", "device was lost", "device is lost", "vk_error_device_lost"}

// deviceLost reports whether err is a lost device's.
func deviceLost(err error) bool {
	if err == nil {
		return false
	}
	s := strings.ToLower(err.Error())
	return slices.ContainsFunc(deviceLostText, func(t string) bool { return strings.Contains(s, t) })
}

// injected is the run error the fault hook puts in place of a run of item (rule 3), or
// nil.
func injected(item *codec.WorkItem) error {
	if fault.AdapterLost(item.Path, item.InputPaths) {
		return errors.New(fault.LostDeviceError)
	}
	return nil
}

// check is the answer's error for a job whose run on ep returned err (rules 1 and 2):
// err, or provider_unavailable for a lost device on webgpu, after the first of which every
// model is failed.
func (a *adapterWatch) check(ep string, err error) error {
	if ep != "webgpu" || !deviceLost(err) {
		return err
	}
	adapter := cmp.Or(a.adapter(), "of this worker")
	e := codec.Errorf(codec.CodeProviderUnavailable, "the webgpu adapter was lost while running: %s (adapter %s)", bounded(err.Error()), adapter).
		With("ep", "webgpu").With("adapter", adapter).With("error", bounded(err.Error()))
	a.mu.Lock()
	first := a.lost == nil
	if first {
		a.lost = e
	}
	a.mu.Unlock()
	if first {
		a.log.Error("the webgpu adapter was lost: every model fails; the pool's classes go on to their next pools", "adapter", adapter, "error", err)
		a.models.failAll(e)
	}
	return e
}

// failAll fails every model of the set with e (a lost adapter: adapterlost.go, rule 2):
// each ready copy is retired (closed once no job holds it) and the model listed failed.
func (s *modelSet) failAll(e *codec.Error) {
	var closeNow []*loaded
	s.mu.Lock()
	for name, l := range s.ready {
		st := s.status[name]
		st.State, st.Error = codec.ModelFailed, e
		s.status[name] = st
		s.failed[name] = e
		delete(s.ready, name)
		if s.retireLocked(l) {
			closeNow = append(closeNow, l)
		}
	}
	s.mu.Unlock()
	for _, l := range closeNow {
		l.close()
	}
}
