package gateway

import (
	"fmt"
	"sort"
	"strings"

	"github.com/ortbus/ortbus/codec"
	"github.com/ortbus/ortbus/devices"
)

// Memory admission. Pools that name the same device share its memory: capacity (from the
// config's [devices.NAME] capacity, else read from the device) times its safe fraction is
// the budget, and the peaks of the models that live workers report (measured at load
// with a warm-up at the largest batch, or declared) are admitted against it. The
// supervisor starts the workers of a device one after another and tells each how much of
// the budget is left (ORTBUS_MEM_BUDGET); a worker refuses a model, or caps its dynamic
// batch, that would pass it, and a pool whose worker cannot fit is reported with the
// device, the sum and the budget.
//
// Leases of processes outside ortbus (lease.go) and the measured memory of the other
// processes outside ortbus (foreign.go) take their share of the budget too.

// deviceBudget returns a device's capacity, safe fraction and budget in bytes (0 when the
// capacity is unknown: no admission on that device).
func (g *Gateway) deviceBudget(device string) (capacity int64, fraction float64, budget int64) {
	fraction = 0.85
	if d, ok := g.conf().Devices[device]; ok {
		capacity, fraction = int64(d.Capacity), d.SafeFraction
	}
	if capacity == 0 {
		capacity, _, _ = devices.Capacity(device)
	}
	return capacity, fraction, int64(float64(capacity) * fraction)
}

// admitted sums the model peaks of the live (or starting) workers on a device, except
// the worker named except.
func (g *Gateway) admitted(device, except string) int64 {
	var sum int64
	for _, w := range g.tracker.Workers() {
		if w.Dead || w.HB.Worker == except || g.conf().Pools[w.HB.Pool] == nil || g.conf().Pool(w.HB.Pool).Device != device {
			continue
		}
		sum += admittedOf(&w.HB)
	}
	return sum
}

// admittedOf is what one worker takes of its device's budget: the sum of its models'
// peaks, or the memory its process is measured to hold on the device (the heartbeat's
// device_bytes, from the driver) when that is more — a GPU EP's buffer caches grow past
// what the warm-ups reached — so that, on a device with a per-process reader, admitted +
// leased + foreign is what the driver reports.
func admittedOf(hb *codec.Heartbeat) int64 {
	var sum int64
	for _, m := range hb.Models {
		sum += m.PeakBytes
	}
	if hb.DeviceSource != "" {
		sum = max(sum, hb.DeviceBytes)
	}
	return sum
}

// remaining is the budget a new worker of pool on device may use (ok false: no
// admission): the budget less what is admitted, leased, and reserved for classes above
// the pool's.
func (g *Gateway) remaining(device, pool, except string) (int64, bool) {
	_, _, budget := g.deviceBudget(device)
	if budget <= 0 {
		return 0, false
	}
	leased, _ := g.leases.leased(device)
	return budget - g.admitted(device, except) - leased - g.foreignBytes(device, leased) - g.reservedAgainst(device, g.conf().PoolPriority(pool)), true
}

// Reservations ([devices.NAME.reserve] CLASS = SIZE) keep part of a device's budget for a
// class: a pool or a lease may use the reservation of class C only if it serves C or a
// class of higher priority (a lower number), so batch pools and batch leases never can.
// What pools that may use a reservation have admitted fills it first.

// reservedAgainst is the part of device's reservations that work of priority prio may
// not use: for each class of a higher priority with a reservation, the reservation less
// what the workers of pools that may use it have admitted.
func (g *Gateway) reservedAgainst(device string, prio int) int64 {
	d, ok := g.conf().Devices[device]
	if !ok || len(d.Reserve) == 0 {
		return 0
	}
	var out int64
	for class, b := range d.Reserve {
		cl := g.conf().Classes[class]
		if cl == nil || cl.Priority >= prio {
			continue // prio's own class, or a lower one: usable
		}
		var filled int64
		for _, w := range g.tracker.Workers() {
			if w.Dead || g.conf().Pools[w.HB.Pool] == nil || g.conf().Pool(w.HB.Pool).Device != device || g.conf().PoolPriority(w.HB.Pool) > cl.Priority {
				continue
			}
			filled += admittedOf(&w.HB)
		}
		out += max(0, int64(b)-filled)
	}
	return out
}

// admissionError is the refusal of a pool on a device whose budget cannot hold it: it
// names the device, the sum that would be admitted, and the budget.
func (g *Gateway) admissionError(device, pool string, need int64) *codec.Error {
	capacity, fraction, budget := g.deviceBudget(device)
	adm := g.admitted(device, "")
	leased, _ := g.leases.leased(device)
	foreign := g.foreignBytes(device, leased)
	var outside []string
	if leased > 0 {
		outside = append(outside, "leases "+mb(leased))
	}
	if foreign > 0 {
		outside = append(outside, "foreign processes "+mb(foreign))
	}
	if r := g.reservedAgainst(device, g.conf().PoolPriority(pool)); r > 0 {
		adm += r // reserved for higher classes: not this pool's to use
		outside = append(outside, "reserved for higher classes "+mb(r))
	}
	of := ""
	if len(outside) > 0 {
		adm += leased + foreign // the memory of processes outside ortbus counts as admitted
		of = " (" + strings.Join(outside, ", ") + ")"
	}
	e := codec.Errorf(codec.CodeOverloaded, "memory admission refused pool %s on device %s: admitted %s%s + %s needed = %s, over the budget of %s (capacity %s x %.2f)",
		pool, device, mb(adm), of, mb(need), mb(adm+need), mb(budget), mb(capacity), fraction).
		With("device", device).With("pool", pool).With("sum_bytes", adm+need).With("budget_bytes", budget).With("capacity_bytes", capacity)
	if foreign > 0 {
		e = e.With("foreign_bytes", foreign)
	}
	return e
}

func mb(b int64) string { return fmt.Sprintf("%.1fMiB", float64(b)/(1<<20)) }

// deviceStatus reports every device that a pool or a [devices] table names.
func (g *Gateway) deviceStatus() []codec.DeviceStatus {
	byDevice := map[string][]string{}
	for d := range g.conf().Devices {
		byDevice[d] = nil
	}
	for _, name := range g.conf().PoolNames() {
		d := g.conf().Pool(name).Device
		byDevice[d] = append(byDevice[d], name)
	}
	var out []codec.DeviceStatus
	for d, pools := range byDevice {
		capacity, fraction, budget := g.deviceBudget(d)
		adm := g.admitted(d, "")
		leased, ls := g.leases.leased(d)
		var reserved int64
		for _, b := range g.conf().Devices[d].Reserve {
			reserved += int64(b)
		}
		foreign := g.foreignBytes(d, leased)
		out = append(out, codec.DeviceStatus{Device: d, CapacityBytes: capacity, SafeFraction: fraction, BudgetBytes: budget,
			AdmittedBytes: adm, FreeBytes: max(0, budget-adm-leased-foreign), Pools: pools, LeasedBytes: leased, Leases: ls, ForeignBytes: foreign, ReservedBytes: reserved})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Device < out[j].Device })
	return out
}
