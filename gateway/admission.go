package gateway

import (
	"fmt"
	"strings"

	"github.com/ortbus/ortbus/codec"
	"github.com/ortbus/ortbus/config"
	"github.com/ortbus/ortbus/devices"
	"github.com/ortbus/ortbus/health"
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
//
// admission sums what the workers admit (it owns no state: the tracker owns the
// workers), and a devicePlan is what one decision knows of a device: one configuration's
// figures and one reading of what takes its budget, which its caller (memoryBudget:
// budget.go) gathers once. The decisions over a plan read nothing else: a reload
// meanwhile changes the next decision, never half of this one.
type admission struct {
	workers func() []health.Worker // the tracker's workers, live and dead (wired by newBudget)
}

// deviceBudget returns a device's capacity, safe fraction and budget in bytes under c;
// capacity 0 when it is unknown (no [devices.NAME] capacity and no reader: why says
// why), and then the device admits nothing.
func deviceBudget(c *config.Config, device string) (capacity int64, fraction float64, budgetBytes int64, why string) {
	fraction = 0.85
	if d, ok := c.Devices[device]; ok {
		capacity, fraction = int64(d.Capacity), d.SafeFraction
	}
	if capacity == 0 {
		var err error
		capacity, _, err = devices.Capacity(device)
		switch {
		case err != nil:
			why = err.Error()
		case capacity <= 0:
			why = "its reader gave no capacity"
		}
	}
	return capacity, fraction, int64(float64(capacity) * fraction), why
}

// admitted sums the model peaks of the live (or starting) workers on a device, except
// the worker named except, under c.
func (a admission) admitted(c *config.Config, device, except string) int64 {
	var sum int64
	for _, w := range a.workers() {
		if w.Dead || w.HB.Worker == except || c.Pools[w.HB.Pool] == nil || c.Pool(w.HB.Pool).Device != device {
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

// Reservations ([devices.NAME.reserve] CLASS = SIZE) keep part of a device's budget for a
// class: a pool or a lease may use the reservation of class C only if it serves C or a
// class of higher priority (a lower number), so batch pools and batch leases never can.
// What pools that may use a reservation have admitted fills it first.

// reservedAgainst is the part of device's reservations that work of priority prio may
// not use: for each class of a higher priority with a reservation, the reservation less
// what the workers of pools that may use it have admitted, under c.
func (a admission) reservedAgainst(c *config.Config, device string, prio int) int64 {
	d, ok := c.Devices[device]
	if !ok || len(d.Reserve) == 0 {
		return 0
	}
	var out int64
	for class, r := range d.Reserve {
		cl := c.Classes[class]
		if cl == nil || cl.Priority >= prio {
			continue // prio's own class, or a lower one: usable
		}
		var filled int64
		for _, w := range a.workers() {
			if w.Dead || c.Pools[w.HB.Pool] == nil || c.Pool(w.HB.Pool).Device != device || c.PoolPriority(w.HB.Pool) > cl.Priority {
				continue
			}
			filled += admittedOf(&w.HB)
		}
		out += max(0, int64(r)-filled)
	}
	return out
}

// devicePlan is one device's memory as one decision sees it: the figures of one
// configuration, and one reading of what takes the budget.
type devicePlan struct {
	device      string
	capacity    int64
	fraction    float64
	budgetBytes int64  // capacity x fraction; 0: unknown capacity, which admits nothing
	noCapacity  string // why the capacity is unknown ("" when known)
	admitted    int64  // the workers' peaks (but the worker the plan leaves out)
	reserved    int64  // the reservations the asker may not use (reservedAgainst)
	leased      int64  // the live leases' bytes
	measured    int64  // the latest reading of processes outside ortbus (foreign.go)
}

// plan is device's plan under c without the worker except, for work of priority prio,
// its leases' bytes and foreign reading left to its caller.
func (a admission) plan(c *config.Config, device, except string, prio int) devicePlan {
	capacity, fraction, budgetBytes, why := deviceBudget(c, device)
	return devicePlan{device: device, capacity: capacity, fraction: fraction, budgetBytes: budgetBytes, noCapacity: why,
		admitted: a.admitted(c, device, except), reserved: a.reservedAgainst(c, device, prio)}
}

// foreign is what the device's foreign usage takes beside its leases (foreign.go, rule 3).
func (p devicePlan) foreign() int64 { return foreignPast(p.measured, p.leased) }

// free is the budget less what is admitted, leased and foreign (reservations aside).
func (p devicePlan) free() int64 { return p.budgetBytes - p.admitted - p.leased - p.foreign() }

// left is the budget a new worker of the plan's priority may use (ok false: the
// device's capacity is unknown, and it admits nothing): free less the reservations it
// may not use.
func (p devicePlan) left() (int64, bool) {
	if p.budgetBytes <= 0 {
		return 0, false
	}
	return p.free() - p.reserved, true
}

// poolRefusal is the refusal of pool on the device, whose budget cannot hold need more:
// it names the device, the sum that would be admitted, and the budget.
func (p devicePlan) poolRefusal(pool string, need int64) *codec.Error {
	if p.budgetBytes <= 0 {
		return p.capacityRefusal(pool)
	}
	adm, foreign := p.admitted, p.foreign()
	var outside []string
	if p.leased > 0 {
		outside = append(outside, "leases "+mb(p.leased))
	}
	if foreign > 0 {
		outside = append(outside, "foreign processes "+mb(foreign))
	}
	if p.reserved > 0 {
		adm += p.reserved // reserved for higher classes: not this pool's to use
		outside = append(outside, "reserved for higher classes "+mb(p.reserved))
	}
	of := ""
	if len(outside) > 0 {
		adm += p.leased + foreign // the memory of processes outside ortbus counts as admitted
		of = " (" + strings.Join(outside, ", ") + ")"
	}
	e := codec.Errorf(codec.CodeOverloaded, "memory admission refused pool %s on device %s: admitted %s%s + %s needed = %s, over the budget of %s (capacity %s x %.2f)",
		pool, p.device, mb(adm), of, mb(need), mb(adm+need), mb(p.budgetBytes), mb(p.capacity), p.fraction).
		With("device", p.device).With("pool", pool).With("sum_bytes", adm+need).With("budget_bytes", p.budgetBytes).With("capacity_bytes", p.capacity)
	if foreign > 0 {
		e = e.With("foreign_bytes", foreign)
	}
	return e
}

// capacityRefusal is the refusal of pool on a device whose capacity is unknown (no
// [devices.NAME] capacity, no reader, or a budget of nothing): such a device admits
// nothing rather than everything, so that no worker serves there unaccounted.
func (p devicePlan) capacityRefusal(pool string) *codec.Error {
	why := p.noCapacity
	if why == "" {
		why = fmt.Sprintf("capacity %s x %.2f is no budget", mb(p.capacity), p.fraction)
	}
	return codec.Errorf(codec.CodeOverloaded, "memory admission refused pool %s on device %s: the device has no capacity reading (%s), and it admits nothing: declare [devices.%q] capacity = SIZE",
		pool, p.device, why, p.device).
		With("device", p.device).With("pool", pool).With("budget_bytes", 0).With("capacity_bytes", p.capacity)
}

// leaseRefusal is nil when the device's budget holds a lease of bytes beside what is
// admitted, leased and foreign, and the reservations the lease may not use (lease.go,
// rule 1); else the refusal, naming the device, the sum and the budget.
func (p devicePlan) leaseRefusal(bytes int64) *codec.Error {
	adm, foreign := p.admitted+p.reserved, p.foreign()
	sum := adm + p.leased + foreign + bytes
	if sum <= p.budgetBytes && sum >= 0 {
		return nil
	}
	return codec.Errorf(codec.CodeOverloaded, "memory admission refused a lease of %s on device %s: admitted %s + leased %s + foreign %s + %s = %s, over the budget of %s (capacity %s x %.2f)",
		mb(bytes), p.device, mb(adm), mb(p.leased), mb(foreign), mb(bytes), mb(sum), mb(p.budgetBytes), mb(p.capacity), p.fraction).
		With("device", p.device).With("sum_bytes", sum).With("budget_bytes", p.budgetBytes).With("capacity_bytes", p.capacity).
		With("admitted_bytes", adm).With("leased_bytes", p.leased).With("foreign_bytes", foreign)
}

// status is the device's figures as status reports them, with the pools that name it,
// its leases, and the sum of its reservations.
func (p devicePlan) status(pools []string, leases []codec.LeaseReply, reserved int64) codec.DeviceStatus {
	return codec.DeviceStatus{Device: p.device, CapacityBytes: p.capacity, CapacityError: p.noCapacity, SafeFraction: p.fraction, BudgetBytes: p.budgetBytes,
		AdmittedBytes: p.admitted, FreeBytes: max(0, p.free()), Pools: pools, LeasedBytes: p.leased, Leases: leases, ForeignBytes: p.foreign(), ReservedBytes: reserved}
}
