package gateway

import (
	"maps"
	"sync"
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
//   - Deadline feasibility: a pool whose measured service time for the request's model
//     cannot finish before the request's deadline, even if dispatched now, is skipped; if
//     every pool is infeasible the request is answered deadline_exceeded before it spends
//     compute.
//   - Degrade (per class): when the preferred pool's device is busy with other work, the
//     expected completion counts the units ahead of it; if that misses the deadline the
//     next pool of the chain is tried rather than waiting.
//
// Under gateway.policy = "fifo" none of these rules apply (the baseline for benchmarks).

// backgroundPriority is the priority from which a class yields a shared device.
const backgroundPriority = 2

// deviceLoad counts requests in flight per device and class. Owned by flights.
type deviceLoad map[string]map[string]int

func (d deviceLoad) add(device, class string, n int) {
	if d[device] == nil {
		d[device] = map[string]int{}
	}
	d[device][class] += n
}

// policyOn reports whether the sharing policy applies.
func (c *capacity) policyOn() bool { return c.cfg.Gateway.Policy != config.PolicyFIFO }

// shareAllows applies the one-unit rule to a background class on pool's device; reserved
// holds the pools that waiting higher-priority items keep.
func (c *capacity) shareAllows(pool, class string, reserved map[string]bool) bool {
	cl := c.cfg.Classes[class]
	if !c.policyOn() || cl.Priority < backgroundPriority {
		return true
	}
	device := c.cfg.Pools[pool].Device
	load := c.load[device]
	higher := false
	for other, n := range load {
		if n > 0 && c.cfg.Classes[other].Priority < cl.Priority {
			higher = true
		}
	}
	for rp := range reserved {
		if c.cfg.Pools[rp].Device == device {
			higher = true
		}
	}
	for other, n := range c.leased[device] {
		if oc := c.cfg.Classes[other]; n > 0 && oc != nil && oc.Priority < cl.Priority {
			higher = true
		}
	}
	if !higher {
		return true
	}
	unit := max(1, c.cfg.Pools[pool].MaxBatch)
	units := 1
	if cl.MinShare > 0 {
		units = max(1, int(cl.MinShare*float64(c.deviceSlots[device])))
	}
	return load[class] < units*unit
}

// estimator keeps a measured service time (moving average of the worker's time from
// taking an item to answering it) per pool, op and model.
type estimator struct {
	mu sync.Mutex
	m  map[estKey]time.Duration
}

type estKey struct{ pool, op, model string }

func (e *estimator) observe(k estKey, d time.Duration) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.m == nil {
		e.m = map[estKey]time.Duration{}
	}
	if old, ok := e.m[k]; ok {
		d = (old*7 + d) / 8
	}
	e.m[k] = d
}

func (e *estimator) get(k estKey) time.Duration {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.m[k]
}

// all is a copy of every measurement.
func (e *estimator) all() map[estKey]time.Duration {
	e.mu.Lock()
	defer e.mu.Unlock()
	return maps.Clone(e.m)
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
		device := c.cfg.Pools[k.pool].Device
		busy := 0
		for _, n := range c.load[device] {
			busy += n
		}
		slots := max(1, c.deviceSlots[device])
		est += est * time.Duration(busy) / time.Duration(slots)
	}
	return !c.now.Add(est).After(deadline)
}
