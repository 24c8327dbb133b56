package gateway

import (
	"log/slog"
	"sort"
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
// The budget (type budget) owns this concern: the leases (lease.go), the readings of
// foreign memory (foreign.go), the acquires waiting for room (leasewait.go) and the
// measures of pressed leases (press.go), each under its own lock or goroutine. Each of its decisions takes one
// configuration, read once by its caller (the gateway: conf), and reads no other: a
// reload meanwhile changes the next decision, never half of this one.
type budget struct {
	leases  *leases
	foreign *foreignMem   // the devices' readers and their latest readings (startForeign)
	waits   *leaseWaits   // the acquires waiting for room (leasewait.go)
	presses chan struct{} // the pressed leases to measure (press.go)

	// What it needs of the rest of the gateway, wired at construction (newGateway).
	id      string // the gateway's id, in each lease it grants
	log     *slog.Logger
	workers func() []health.Worker // the tracker's workers, live and dead
	pids    func() []int           // the supervised worker processes' pids
	kick    func()                 // asks the dispatch loop for a pass
}

// budgetNow is the budget as the supervisor uses it (memoryAdmission, reclaimer): each
// call takes the configuration in force once.
type budgetNow struct {
	b    *budget
	conf func() *config.Config
	idle func(pool string) bool
}

func (n budgetNow) remaining(device, pool, except string) (int64, bool) {
	return n.b.remaining(n.conf(), device, pool, except)
}
func (n budgetNow) admissionError(device, pool string, need int64) *codec.Error {
	return n.b.admissionError(n.conf(), device, pool, need)
}
func (n budgetNow) reclaim(device string, prio int) bool { return n.b.reclaim(n.conf(), device, prio) }
func (n budgetNow) pressing(device string) bool          { return n.b.pressing(device) }
func (n budgetNow) poolIdle(pool string) bool            { return n.idle(pool) }

// deviceBudget returns a device's capacity, safe fraction and budget in bytes under c (0
// when the capacity is unknown: no admission on that device).
func deviceBudget(c *config.Config, device string) (capacity int64, fraction float64, budget int64) {
	fraction = 0.85
	if d, ok := c.Devices[device]; ok {
		capacity, fraction = int64(d.Capacity), d.SafeFraction
	}
	if capacity == 0 {
		capacity, _, _ = devices.Capacity(device)
	}
	return capacity, fraction, int64(float64(capacity) * fraction)
}

// admitted sums the model peaks of the live (or starting) workers on a device, except
// the worker named except, under c.
func (b *budget) admitted(c *config.Config, device, except string) int64 {
	var sum int64
	for _, w := range b.workers() {
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

// remaining is the budget a new worker of pool on device may use (ok false: no
// admission): the budget less what is admitted, leased, and reserved for classes above
// the pool's, under c.
func (b *budget) remaining(c *config.Config, device, pool, except string) (int64, bool) {
	return b.left(c, device, except, c.PoolPriority(pool))
}

// left is device's budget less what is admitted (but the worker except), leased, foreign,
// and reserved against work of priority prio, under c (ok false: no admission).
func (b *budget) left(c *config.Config, device, except string, prio int) (int64, bool) {
	_, _, budget := deviceBudget(c, device)
	if budget <= 0 {
		return 0, false
	}
	leased, _ := b.leases.leased(device)
	return budget - b.admitted(c, device, except) - leased - b.foreignBytes(device, leased) - b.reservedAgainst(c, device, prio), true
}

// Reservations ([devices.NAME.reserve] CLASS = SIZE) keep part of a device's budget for a
// class: a pool or a lease may use the reservation of class C only if it serves C or a
// class of higher priority (a lower number), so batch pools and batch leases never can.
// What pools that may use a reservation have admitted fills it first.

// reservedAgainst is the part of device's reservations that work of priority prio may
// not use: for each class of a higher priority with a reservation, the reservation less
// what the workers of pools that may use it have admitted, under c.
func (b *budget) reservedAgainst(c *config.Config, device string, prio int) int64 {
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
		for _, w := range b.workers() {
			if w.Dead || c.Pools[w.HB.Pool] == nil || c.Pool(w.HB.Pool).Device != device || c.PoolPriority(w.HB.Pool) > cl.Priority {
				continue
			}
			filled += admittedOf(&w.HB)
		}
		out += max(0, int64(r)-filled)
	}
	return out
}

// admissionError is the refusal of a pool on a device whose budget cannot hold it: it
// names the device, the sum that would be admitted, and the budget, under c.
func (b *budget) admissionError(c *config.Config, device, pool string, need int64) *codec.Error {
	capacity, fraction, budget := deviceBudget(c, device)
	adm := b.admitted(c, device, "")
	leased, _ := b.leases.leased(device)
	foreign := b.foreignBytes(device, leased)
	var outside []string
	if leased > 0 {
		outside = append(outside, "leases "+mb(leased))
	}
	if foreign > 0 {
		outside = append(outside, "foreign processes "+mb(foreign))
	}
	if r := b.reservedAgainst(c, device, c.PoolPriority(pool)); r > 0 {
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

// deviceStatus reports every device that a pool or a [devices] table of c names.
func (b *budget) deviceStatus(c *config.Config) []codec.DeviceStatus {
	byDevice := map[string][]string{}
	for d := range c.Devices {
		byDevice[d] = nil
	}
	for _, name := range c.PoolNames() {
		d := c.Pool(name).Device
		byDevice[d] = append(byDevice[d], name)
	}
	var out []codec.DeviceStatus
	for d, pools := range byDevice {
		capacity, fraction, budget := deviceBudget(c, d)
		adm := b.admitted(c, d, "")
		leased, ls := b.leases.leased(d)
		var reserved int64
		for _, r := range c.Devices[d].Reserve {
			reserved += int64(r)
		}
		foreign := b.foreignBytes(d, leased)
		out = append(out, codec.DeviceStatus{Device: d, CapacityBytes: capacity, SafeFraction: fraction, BudgetBytes: budget,
			AdmittedBytes: adm, FreeBytes: max(0, budget-adm-leased-foreign), Pools: pools, LeasedBytes: leased, Leases: ls, ForeignBytes: foreign, ReservedBytes: reserved})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Device < out[j].Device })
	return out
}
