package gateway

import (
	"log/slog"
	"math"
	"sort"
	"time"

	"github.com/ortbus/ortbus/codec"
	"github.com/ortbus/ortbus/config"
	"github.com/ortbus/ortbus/health"
	"github.com/ortbus/ortbus/subjects"
)

// The devices' memory budget (admission.go) as one concern: memoryBudget composes the parts
// that own its state, each under its own lock or goroutine — the lease table (lease.go),
// the readings of foreign memory (foreign.go), the acquires waiting for room
// (leasewait.go) and the measures of pressed leases (press.go) — wires their events to
// each other once (newBudget), and holds the operations that need several of them.
//
// Each of its decisions takes one configuration, read once by its caller (the gateway:
// conf), and gathers once what it decides over (a devicePlan: admission.go); it reads no
// other: a reload meanwhile changes the next decision, never half of this one.
type memoryBudget struct {
	admission admission
	leases    *leases
	foreign   *foreignMem
	waits     *leaseWaits
	presser   *presser

	id  string // the gateway's, carried by each lease it grants
	log *slog.Logger
	// starting is whether a local worker of a pool on a device is starting (relief.go;
	// wired by the gateway once its supervisor is built).
	starting startingOn
}

// newBudget is the budget of gateway id whose workers are the tracker's (workers), whose
// supervised processes' pids are pids, and whose dispatch loop kick asks for a pass. A
// foreign reading applies to the pressed leases (lease.go, rule 6) and, when it drops,
// wakes the waiting acquires; a pressed lease shrunk wakes the loop and the waiting
// acquires (press.go, rule 3).
func newBudget(id string, log *slog.Logger, kick func(), workers func() []health.Worker, pids func() []int) *memoryBudget {
	b := &memoryBudget{admission: admission{workers: workers}, leases: newLeases(), waits: newLeaseWaits(log), id: id, log: log}
	b.foreign = newForeign(log, workers, pids)
	b.presser = newPresser(b.leases, b.foreign, log, func() { kick(); b.waits.wake() })
	b.foreign.onRead, b.foreign.onDrop = b.presser.fromReading, b.waits.wake
	return b
}

// start runs the budget's goroutines until the returned stop is called, each under the
// configuration then in force (conf): the foreign readings (c's devices read once now,
// before the workers start, so that their budget knows it), the passes over the waiting
// acquires (stopped: those left answered unavailable), and the presser.
func (b *memoryBudget) start(c *config.Config, conf func() *config.Config) (stop func()) {
	stopForeign := b.foreign.start(c, conf)
	stopWaits := b.startWaits(conf)
	stopPresser := b.presser.start(conf)
	return func() { stopPresser(); stopWaits(); stopForeign() }
}

// budgetNow is the budget as the supervisor uses it (memoryAdmission, reclaimer): each
// call takes the configuration in force once.
type budgetNow struct {
	b    *memoryBudget
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
func (n budgetNow) pressing(device string) bool          { return n.b.presser.pressing(device) }
func (n budgetNow) poolIdle(pool string) bool            { return n.idle(pool) }

// plan is device's plan under c (admission.go) for work of priority prio, without the
// worker except: what is admitted, leased and measured now; and the leases it counts.
func (b *memoryBudget) plan(c *config.Config, device, except string, prio int) (devicePlan, []codec.LeaseReply) {
	p := b.admission.plan(c, device, except, prio)
	var ls []codec.LeaseReply
	p.leased, ls = b.leases.leased(device)
	p.measured = b.foreign.latest(device)
	return p, ls
}

// remaining is the budget a new worker of pool on device may use (ok false: no
// admission): the budget less what is admitted, leased, foreign, and reserved for classes
// above the pool's, under c.
func (b *memoryBudget) remaining(c *config.Config, device, pool, except string) (int64, bool) {
	return b.left(c, device, except, c.PoolPriority(pool))
}

// left is device's budget less what is admitted (but the worker except), leased, foreign,
// and reserved against work of priority prio, under c (ok false: no admission).
func (b *memoryBudget) left(c *config.Config, device, except string, prio int) (int64, bool) {
	p, _ := b.plan(c, device, except, prio)
	return p.left()
}

// admissionError is the refusal of a pool on a device whose budget cannot hold it: it
// names the device, the sum that would be admitted, and the budget, under c.
func (b *memoryBudget) admissionError(c *config.Config, device, pool string, need int64) *codec.Error {
	p, _ := b.plan(c, device, "", c.PoolPriority(pool))
	return p.poolRefusal(pool, need)
}

// deviceStatus reports every device that a pool or a [devices] table of c names.
func (b *memoryBudget) deviceStatus(c *config.Config) []codec.DeviceStatus {
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
		p, ls := b.plan(c, d, "", math.MinInt) // as for work that may use every reservation
		var reserved int64
		for _, r := range c.Devices[d].Reserve {
			reserved += int64(r)
		}
		out = append(out, p.status(pools, ls, reserved))
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Device < out[j].Device })
	return out
}

// lease answers one ortbus.v1.lease request of account (lease.go, rule 4; "": the local
// owner), under c alone. An acquire held back by the waiting acquires (leasewait.go,
// rule 2) is refused overloaded.
func (b *memoryBudget) lease(c *config.Config, req *codec.LeaseRequest, account string) (*codec.LeaseReply, *codec.Error) {
	if err := req.Validate(); err != nil {
		return nil, codec.AsError(err)
	}
	ttl := leaseTTL(c, req)
	now := leaseNow()
	if req.Action == codec.LeaseRenew && req.Bytes > 0 {
		return b.renewRelief(c, req, account, ttl, now)
	}
	if req.Action != codec.LeaseAcquire {
		r, e := b.leases.renewOrRelease(req, account, ttl, now)
		if r != nil && r.Released {
			b.waits.wake() // its room may be a waiting acquire's
		}
		return r, e
	}
	if e := b.waits.heldBack(c, req); e != nil {
		return nil, e
	}
	return b.acquire(c, req, account, ttl, now)
}

// acquire grants the acquire req of account for ttl from now if the device's budget holds
// it (lease.go, rule 1), under c alone: decided over one plan of the device, and granted
// by the lease table under its lock. Refused for memory, it presses the reclaimable
// leases of lower classes there (lease.go, rule 6).
func (b *memoryBudget) acquire(c *config.Config, req *codec.LeaseRequest, account string, ttl time.Duration, now time.Time) (*codec.LeaseReply, *codec.Error) {
	class := req.Class
	if class == "" {
		class = subjects.ClassInteractive
	}
	cl, ok := c.Classes[class]
	if !ok {
		return nil, codec.Errorf(codec.CodeBadRequest, "unknown class %q (classes: %v)", class, c.ClassNames()).With("field", "class")
	}
	if !knownDevice(c, req.Device) {
		return nil, codec.Errorf(codec.CodeBadRequest, "device %q is not one this gateway's pools or [devices] name", req.Device).With("field", "device")
	}
	// Reservations of classes above the lease's are not its to use (admission.go).
	p := b.admission.plan(c, req.Device, "", cl.Priority)
	if p.budgetBytes <= 0 {
		return nil, codec.Errorf(codec.CodeBadRequest, "device %q has no known capacity: declare [devices.%q] capacity to lease its memory", req.Device, req.Device).With("device", req.Device)
	}
	p.measured = b.foreign.latest(req.Device)
	x := &lease{LeaseReply: codec.LeaseReply{Gateway: b.id}, owner: account, pid: req.PID, host: req.Host, granted: req.Bytes}
	x.Device, x.Bytes, x.Class, x.Holder, x.Gate, x.Reclaim = req.Device, req.Bytes, class, req.Holder, req.Gate, req.Reclaim
	x.ExpiresUnixMS = now.Add(ttl).UnixMilli()
	refused := false
	r, e := b.leases.grant(x, now, func(leased int64) *codec.Error {
		p.leased = leased
		e := p.leaseRefusal(req.Bytes)
		refused = e != nil
		return e
	})
	if refused {
		b.leases.press(c, req.Device, cl.Priority, account, now)
		b.presser.poke()
	}
	if e == nil {
		b.log.Info("lease granted", "device", r.Device, "bytes", r.Bytes, "class", r.Class, "holder", r.Holder, "ttl", ttl)
	}
	return r, e
}

// reclaim presses the reclaimable leases on device of a class below prio, for a pool
// that needs their memory (supervise.go); false when none is pressed whose shrink this
// gateway can see (pressing); the classes' priorities are c's.
func (b *memoryBudget) reclaim(c *config.Config, device string, prio int) bool {
	b.leases.press(c, device, prio, "", leaseNow())
	b.presser.poke()
	return b.presser.pressing(device)
}

// serveLease answers one ortbus.v1.lease request of account under c: at once, or, for an
// acquire with wait_ms refused for room, when it is granted or its wait ends
// (leasewait.go).
func (b *memoryBudget) serveLease(c *config.Config, req *codec.LeaseRequest, account string, answer leaseAnswer) {
	l, e := b.lease(c, req, account)
	if e == nil || e.Code != codec.CodeOverloaded || req.Action != codec.LeaseAcquire || req.WaitMS <= 0 {
		answer(l, e)
		return
	}
	if e := b.waits.add(req, account, e, answer); e != nil {
		answer(nil, e)
	}
}

// grantWaiting is one pass over the waiting acquires under c (leasewait.go, rules 1 to
// 3), each tried as an acquire under c.
func (b *memoryBudget) grantWaiting(c *config.Config) {
	b.waits.pass(c, func(req *codec.LeaseRequest, account string) (*codec.LeaseReply, *codec.Error) {
		return b.acquire(c, req, account, leaseTTL(c, req), leaseNow())
	})
}

// startWaits runs the passes over the waiting acquires (leasewait.go, rule 3), each under
// the configuration then in force (conf), until the returned stop is called; stop
// answers the waiters left (rule 5).
func (b *memoryBudget) startWaits(conf func() *config.Config) (stop func()) {
	return b.waits.run(func() { b.grantWaiting(conf()) }, func() time.Duration { return b.leases.untilExpiry(leaseNow()) })
}
