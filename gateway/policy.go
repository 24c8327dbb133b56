package gateway

import (
	"time"

	"github.com/ortbus/ortbus/config"
)

// The sharing policy of one device between classes (config gateway.policy = "priority").
// sched orders the queues by class; these rules decide, per pool and device, whether an
// item may go now:
//
//   - Background classes (priority 2 and below, i.e. batch) are held to one unit in flight
//     on a device while any higher class has work queued for, or running on, that device,
//     or holds a memory lease on it (lease.go): an urgent request then waits at most one
//     batch unit. A unit is one request, or one
//     dynamic batch of the pool (max_batch items). A class's min_share of the device's
//     slots raises that floor, which bounds the starvation of batch.
//   - A closed compute gate (gate.go, rule 1) takes the one unit away: while a device's gate
//     is closed, a tenant of a class above batch (an LLM server under `ortbus lease
//     --gate`) is paused there for latency work, and batch running its floor unit beside
//     that work would be batch going before the tenant. A background class then starts
//     units there only up to ⌊min_share × the device's live slots⌋ (0 when that is under
//     one slot); units already running finish. The gate opens when the latency work is
//     done, and at the latest after the tenant's max-pause, so batch waits no longer than
//     the tenant does.
//   - Reservation, with hysteresis: while a latency class (urgent or interactive, priority
//     below 2) has been active on a device within gateway.reserve_window (default 2s) —
//     had a request queued for, or running on, that device then or now — a background
//     class beyond its floor may not take the device's last free slot, so that the next
//     latency request finds a slot free instead of waiting for a batch unit to finish. The
//     window is the hysteresis: the slot is not handed to batch in each gap between two
//     latency requests, only once they have been gone for the whole window. A device's
//     free slots are its live workers' slots less those its requests in flight hold (a
//     pool that batches counts max_batch requests to a slot); a batch request that joins
//     a started dynamic batch takes no new slot. The floor (one unit, or min_share) is
//     never held back: batch is not starved by the rule, and on a device of a single slot
//     the rule changes nothing (that slot is batch's one unit, and a latency request waits
//     at most that unit); with two slots, batch keeps one while latency work comes. A
//     reserve_window of 0 turns the reservation off.
//   - Deadline feasibility: a pool whose measured service time for the request's model
//     cannot finish before the request's deadline, even if dispatched now, is skipped; if
//     every pool is infeasible the request is answered deadline_exceeded before it spends
//     compute.
//   - Degrade (per class): when the preferred pool's device is busy with other work, the
//     expected completion counts the units ahead of it; if that misses the deadline the
//     next pool of the chain is tried rather than waiting.
//
// Under gateway.policy = "fifo" none of these rules apply (the baseline for benchmarks).
//
// One rule holds under both policies:
//
//   - Prefetch: a background class may hold one item more than its running slots at each
//     live worker that takes items sent to it alone (pick.go), queued there, so that the
//     device does not idle between the end of one item and the arrival of the next (a
//     round trip through the gateway, and a file to read). Never for urgent or
//     interactive items, and not while a higher class has work queued for, running on, or
//     a lease on the device, nor, under the policy, while it reserves the device's last
//     slot: a prefetched item starts before anything the gateway sends later.

// backgroundPriority is the priority from which a class yields a shared device.
const backgroundPriority = 2

// policyOn reports whether the sharing policy applies.
func (c *capacity) policyOn() bool { return c.cfg.Gateway.Policy != config.PolicyFIFO }

// shareAllows applies the one-unit rule and the reservation to a background class on
// pool's device; reserved holds the pools that waiting higher-priority items keep.
func (c *capacity) shareAllows(pool, class string, reserved map[string]bool) bool {
	cl := c.cfg.Classes[class]
	if !c.policyOn() || cl.Priority < backgroundPriority {
		return true
	}
	device := c.cfg.Pool(pool).Device
	// Up to its floor a background class always goes.
	unit := c.slotSize(pool)
	units := int(cl.MinShare * float64(c.deviceSlots[device])) // min_share's whole slots
	if !c.gated[device] {
		// At least one unit, unless the device's compute gate is closed.
		units = max(1, units)
	}
	if c.load[device][class] < units*unit {
		return true
	}
	// Beyond it: not while a higher class has work queued for or running on the device
	// (the one-unit rule),
	for other, n := range c.load[device] {
		if n > 0 && c.cfg.Classes[other].Priority < cl.Priority {
			return false
		}
	}
	for rp := range reserved {
		if c.cfg.Pool(rp).Device == device {
			return false
		}
	}
	// or holds a memory lease on it,
	for other, n := range c.leased[device] {
		if oc := c.cfg.Classes[other]; n > 0 && oc != nil && oc.Priority < cl.Priority {
			return false
		}
	}
	// nor into the device's last free slot while a latency class was active there within
	// the window (the reservation).
	return !(c.reserving(device) && c.opensSlot(pool) && c.freeSlots(device) <= 1)
}

// prefetch is how many items of class pool may hold at its workers beyond their running
// slots now (the prefetch rule): one per live direct worker serving class, or 0.
func (c *capacity) prefetch(pool, class string, reserved map[string]bool) int {
	cl := c.cfg.Classes[class]
	if cl == nil || cl.Priority < backgroundPriority {
		return 0
	}
	device := c.cfg.Pool(pool).Device
	for other, n := range c.load[device] {
		if oc := c.cfg.Classes[other]; n > 0 && oc != nil && oc.Priority < cl.Priority {
			return 0
		}
	}
	for other, n := range c.leased[device] {
		if oc := c.cfg.Classes[other]; n > 0 && oc != nil && oc.Priority < cl.Priority {
			return 0
		}
	}
	for rp := range reserved {
		if c.cfg.Pool(rp).Device == device {
			return 0
		}
	}
	if c.policyOn() && c.reserving(device) {
		return 0
	}
	n := 0
	for _, w := range c.workers {
		if w.serves(pool, class) {
			n++
		}
	}
	return n
}

// reserves reports whether the activity of class keeps a device's last free slot from
// background classes: a latency class, under the policy, with a reserve window.
func (c *capacity) reserves(class string) bool {
	cl := c.cfg.Classes[class]
	return c.policyOn() && c.cfg.Gateway.ReserveWindow > 0 && cl != nil && cl.Priority < backgroundPriority
}

// reserving reports whether a latency class has been active on device within the reserve
// window: it has requests running there, or was last seen queued or running there less
// than the window ago.
func (c *capacity) reserving(device string) bool {
	for class, n := range c.load[device] {
		if n > 0 && c.reserves(class) {
			return true
		}
	}
	for class, at := range c.active[device] {
		if c.reserves(class) && c.now.Sub(at) < c.cfg.Gateway.ReserveWindow.D() {
			return true
		}
	}
	return false
}

// slotSize is how many requests in flight in pool hold one slot: max_batch in a pool that
// batches, else one.
func (c *capacity) slotSize(pool string) int { return max(1, c.cfg.Pool(pool).MaxBatch) }

// opensSlot reports whether one more request in pool takes a slot of its own rather than
// joining a started dynamic batch.
func (c *capacity) opensSlot(pool string) bool { return c.pools[pool].busy%c.slotSize(pool) == 0 }

// freeSlots is how many of device's live slots no request in flight holds.
func (c *capacity) freeSlots(device string) int {
	free := 0
	for name, pc := range c.pools {
		if pc.live && c.cfg.Pool(name).Device == device {
			size := c.slotSize(name)
			free += max(0, pc.workerSlots-(pc.busy+size-1)/size)
		}
	}
	return free
}

// feasible reports whether a request of class, measured under k (its pool, op and
// model), could finish before deadline if dispatched now, counting, when degrade is on,
// the units already in flight on the pool's device. A pool with no measurement yet is
// feasible.
func (c *capacity) feasible(k estKey, class string, deadline time.Time) bool {
	if !c.policyOn() {
		return true
	}
	est := c.est[k]
	if est <= 0 {
		return true
	}
	if c.cfg.Classes[class].Degrade {
		device := c.cfg.Pool(k.pool).Device
		busy := 0
		for _, n := range c.load[device] {
			busy += n
		}
		slots := max(1, c.deviceSlots[device])
		est += est * time.Duration(busy) / time.Duration(slots)
	}
	return !c.now.Add(est).After(deadline)
}
