package gateway

import (
	"cmp"
	"os"
	"slices"
	"sync"
	"time"

	"github.com/nats-io/nuid"

	"github.com/ortbus/ortbus/codec"
	"github.com/ortbus/ortbus/config"
	"github.com/ortbus/ortbus/subjects"
)

// Leases: memory on a device held by a process ortbus does not run (an LLM server, a
// speech recogniser, a game), granted through ortbus.v1.lease so that it takes part in
// the device's memory admission:
//
//  1. A lease is granted only if the device's budget holds it beside what is admitted
//     already (the peaks of live workers' models, the other leases, and the measured
//     memory of processes outside ortbus that the leases do not cover: foreign.go); else
//     the answer is overloaded naming the device, the sum and the budget, as for a pool.
//  2. A lease counts in the admission until it is released or expires: its holder renews
//     it within its ttl (at most gateway.lease_max_ttl), or loses it.
//  3. While an urgent or interactive lease is held on a device, that device counts as
//     busy with that class for the sharing policy (policy.go): batch is held to one unit.
//  4. The lease id is the holder's capability (renew, release). A lease also has an
//     owner, its tenant (identity.go): a renew or release from another tenant finds no
//     such lease, and a tenant other than the local owner holds at most
//     tenantBound(maxLeases) leases, so it cannot take every one. Status shows the local
//     owner every lease without its id; a tenant only its own, with their ids (ownedBy):
//     another tenant's leases count in a device's figures (leased_bytes, free_bytes) but
//     are not listed, so no application learns another's holders.
//  5. A device's leases cover up to their bytes of the memory that processes outside
//     ortbus are measured to use on it (a lease's holder is such a process, and nothing
//     tells which pid holds which lease): only usage past the leased bytes counts as
//     foreign, so a holder's memory is never counted twice. A holder should acquire
//     before it allocates: memory it already uses when it asks is foreign, counted beside
//     the lease asked for.
//  6. Reclaim: a lease whose holder gives memory back on demand (reclaim, the wrapper's
//     --on-pressure hook) and whose class is below the asker's is pressed when an
//     acquire on its device is refused for memory. A pressed lease's tag is in the
//     device's gate (gate.go, rule 3), so its holder runs its hook; each reading of the
//     device's processes (foreign.go; and every pressEvery while pressed, a fresh one:
//     press.go) that measures the holder's processes (the pid it gave and their
//     descendants, on this gateway's host only) below the lease's bytes shrinks the
//     lease to that measure and ends the press, and the waiting acquires are woken
//     (leasewait.go). A holder gives its memory back over time (munmap, a server
//     unloading layer by layer): a shrunk lease is measured on for pressSettle
//     (press.go), shrunk again as the measure keeps falling, and not pressed again
//     meanwhile (its hook ran once). A press ends on its own after pressFor. A pid from another host
//     is never measured here (that number here is another process), and a shrink only
//     lowers a lease: a holder that lies about its pid only loses its own reservation
//     (what it really uses is then foreign, rule 5, and still counted). A tenant (an
//     application's account) presses only its own leases: one app's refused acquire,
//     of whatever class it names, never runs another app's hook; the local owner and
//     the gateway's own pools (supervise.go) press any.
//
// Leases live in the gateway that granted them (one gateway per GPU host is the home
// setup); a renew or release that reaches another gateway finds no such lease.
type leases struct {
	mu sync.Mutex
	by map[string]*lease // by id
}

// lease is a lease as granted, and its owner (rule 4).
type lease struct {
	codec.LeaseReply
	owner     string    // its tenant (identity.go)
	pid       int       // its holder's process (rule 6), 0: unknown
	host      string    // ... on this host
	pressedAt time.Time // rule 6: pressed since (zero: not pressed)
	shrunkAt  time.Time // rule 6: last shrunk by a measure (press.go: measured on a while)
}

// pressFor bounds a press (rule 6).
const pressFor = 30 * time.Second

func newLeases() *leases { return &leases{by: map[string]*lease{}} }

// held is how many leases tenant holds: l.mu held.
func (l *leases) held(tenant string) int {
	n := 0
	for _, x := range l.by {
		if x.owner == tenant {
			n++
		}
	}
	return n
}

// maxLeases bounds the leases held at once; past it acquire is answered overloaded.
const maxLeases = 1024

// leaseNow is the clock of leases (tests move it).
var leaseNow = time.Now

// expire drops the leases past their expiry: l.mu held.
func (l *leases) expire(now time.Time) {
	for id, x := range l.by {
		if now.UnixMilli() >= x.ExpiresUnixMS {
			delete(l.by, id)
		}
	}
}

// leased sums the live leases on device, and returns them (ids removed), newest last.
func (l *leases) leased(device string) (int64, []codec.LeaseReply) {
	if l == nil {
		return 0, nil
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.expire(leaseNow())
	var sum int64
	var out []codec.LeaseReply
	for _, x := range l.by {
		if x.Device == device {
			sum += x.Bytes
			c := x.LeaseReply
			c.Lease = ""
			out = append(out, c)
		}
	}
	slices.SortFunc(out, func(a, b codec.LeaseReply) int { return int(a.ExpiresUnixMS - b.ExpiresUnixMS) })
	return sum, out
}

// ownedBy returns tenant's own live leases on device, ids included (rule 4), newest last.
func (l *leases) ownedBy(device, tenant string) []codec.LeaseReply {
	if l == nil {
		return nil
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.expire(leaseNow())
	var out []codec.LeaseReply
	for _, x := range l.by {
		if x.Device == device && x.owner == tenant {
			out = append(out, x.LeaseReply)
		}
	}
	slices.SortFunc(out, func(a, b codec.LeaseReply) int { return cmp.Compare(a.ExpiresUnixMS, b.ExpiresUnixMS) })
	return out
}

// byDevice counts the live leases per device and class (rule 3), for a snapshot.
func (l *leases) byDevice() classCounts {
	out := classCounts{}
	if l == nil {
		return out
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.expire(leaseNow())
	for _, x := range l.by {
		out.add(x.Device, x.Class, 1)
	}
	return out
}

// lease answers one ortbus.v1.lease request of tenant (rule 4; "": the local owner),
// under c alone. An acquire held back by the waiting acquires (leasewait.go, rule 2) is
// refused overloaded.
func (b *budget) lease(c *config.Config, req *codec.LeaseRequest, tenant string) (*codec.LeaseReply, *codec.Error) {
	if err := req.Validate(); err != nil {
		return nil, codec.AsError(err)
	}
	ttl := leaseTTL(c, req)
	l := b.leases
	now := leaseNow()
	switch req.Action {
	case codec.LeaseRenew, codec.LeaseRelease:
		l.mu.Lock()
		defer l.mu.Unlock()
		l.expire(now)
		x, ok := l.by[req.Lease]
		if !ok || (tenant != "" && x.owner != tenant) {
			return nil, codec.Errorf(codec.CodeBadRequest, "no lease %q here (expired, released, or granted by another gateway)", req.Lease).With("field", "lease")
		}
		if req.Action == codec.LeaseRelease {
			delete(l.by, req.Lease)
			r := x.LeaseReply
			r.Released = true
			b.waits.wake() // its room may be a waiting acquire's
			return &r, nil
		}
		x.ExpiresUnixMS = now.Add(ttl).UnixMilli()
		if req.PID > 0 {
			x.pid, x.host = req.PID, req.Host
		}
		x.Pressed = !x.pressedAt.IsZero()
		r := x.LeaseReply
		return &r, nil
	}
	if e := b.waits.heldBack(c, req); e != nil {
		return nil, e
	}
	return b.acquire(c, req, tenant, ttl, now)
}

// leaseTTL is the ttl req asks for, within c's bounds (rule 2).
func leaseTTL(c *config.Config, req *codec.LeaseRequest) time.Duration {
	ttl := c.Gateway.LeaseDefaultTTL.D()
	if req.TTLMS > 0 {
		ttl = min(c.Gateway.LeaseMaxTTL.D(), time.Duration(min(req.TTLMS, c.Gateway.LeaseMaxTTL.D().Milliseconds()))*time.Millisecond)
	}
	return ttl
}

// acquire grants the acquire req of tenant for ttl from now if the device's budget holds
// it (rule 1), under c alone; refused for memory, it presses the reclaimable leases of
// lower classes there (rule 6).
func (b *budget) acquire(c *config.Config, req *codec.LeaseRequest, tenant string, ttl time.Duration, now time.Time) (*codec.LeaseReply, *codec.Error) {
	l := b.leases
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
	capacity, fraction, budget := deviceBudget(c, req.Device)
	if budget <= 0 {
		return nil, codec.Errorf(codec.CodeBadRequest, "device %q has no known capacity: declare [devices.%q] capacity to lease its memory", req.Device, req.Device).With("device", req.Device)
	}
	// Checked and granted under the lock: two acquires cannot both take the last bytes.
	l.mu.Lock()
	defer l.mu.Unlock()
	l.expire(now)
	if len(l.by) >= maxLeases {
		return nil, codec.Errorf(codec.CodeOverloaded, "%d leases are held; release some first", len(l.by))
	}
	if tenant != "" {
		if n := l.held(tenant); n >= tenantBound(maxLeases) {
			return nil, codec.Errorf(codec.CodeOverloaded, "you hold %d leases, this gateway's bound for one owner; release some first", n).With("limit", tenantBound(maxLeases))
		}
	}
	var leased int64
	for _, x := range l.by {
		if x.Device == req.Device {
			leased += x.Bytes
		}
	}
	adm := b.admitted(c, req.Device, "")
	// Reservations of classes above the lease's are not its to use (admission.go).
	adm += b.reservedAgainst(c, req.Device, cl.Priority)
	foreign := b.foreignBytes(req.Device, leased)
	if sum := adm + leased + foreign + req.Bytes; sum > budget || sum < 0 {
		l.press(req.Device, cl.Priority, tenant, func(class string) int { return classPriority(c, class) }, now)
		b.pokePresser()
		return nil, codec.Errorf(codec.CodeOverloaded, "memory admission refused a lease of %s on device %s: admitted %s + leased %s + foreign %s + %s = %s, over the budget of %s (capacity %s x %.2f)",
			mb(req.Bytes), req.Device, mb(adm), mb(leased), mb(foreign), mb(req.Bytes), mb(sum), mb(budget), mb(capacity), fraction).
			With("device", req.Device).With("sum_bytes", sum).With("budget_bytes", budget).With("capacity_bytes", capacity).
			With("admitted_bytes", adm).With("leased_bytes", leased).With("foreign_bytes", foreign)
	}
	x := &lease{LeaseReply: codec.LeaseReply{Lease: nuid.Next(), Device: req.Device, Bytes: req.Bytes, Class: class, Holder: req.Holder, ExpiresUnixMS: now.Add(ttl).UnixMilli(),
		Gateway: b.id, Gate: req.Gate, Reclaim: req.Reclaim}, owner: tenant, pid: req.PID, host: req.Host}
	l.by[x.Lease] = x
	b.log.Info("lease granted", "device", x.Device, "bytes", x.Bytes, "class", x.Class, "holder", x.Holder, "ttl", ttl)
	r := x.LeaseReply
	return &r, nil
}

// knownDevice reports whether device is named by a pool or a [devices] table of c.
func knownDevice(c *config.Config, device string) bool {
	if _, ok := c.Devices[device]; ok {
		return true
	}
	for _, p := range c.Pools {
		if p.Device == device {
			return true
		}
	}
	return false
}

// press marks the reclaimable leases on device of a class below prio (prio(class) above
// it) as pressed, from now, for owner (a tenant: only its own; "": any) (rule 6): l.mu
// held.
func (l *leases) press(device string, asker int, owner string, prio func(string) int, now time.Time) {
	for _, x := range l.by {
		if x.Device == device && x.Reclaim && prio(x.Class) > asker && x.pressedAt.IsZero() && !x.settling(now) && (owner == "" || x.owner == owner) {
			x.pressedAt = now
			x.Pressed = true
		}
	}
}

// gatedHere is what the gates need of one device's leases: how many are gated, and the
// tags of the pressed ones (gate.go).
type gatedHere struct {
	gated int
	tags  []string
}

// gated is, per device with a gated or a pressed lease, what its gate needs; presses
// past pressFor end here (rule 6).
func (l *leases) gated(now time.Time) map[string]gatedHere {
	out := map[string]gatedHere{}
	if l == nil {
		return out
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.expire(now)
	for _, x := range l.by {
		if !x.pressedAt.IsZero() && now.Sub(x.pressedAt) >= pressFor {
			x.pressedAt, x.Pressed = time.Time{}, false
		}
		if !x.Gate && x.pressedAt.IsZero() {
			continue
		}
		h := out[x.Device]
		if x.Gate {
			h.gated++
		}
		if !x.pressedAt.IsZero() {
			h.tags = append(h.tags, codec.LeaseTag(x.Lease))
		}
		out[x.Device] = h
	}
	for d, h := range out {
		slices.Sort(h.tags)
		out[d] = h
	}
	return out
}

// pressedHere reports whether device has a pressed lease whose holder is on host.
func (l *leases) pressedHere(device, host string) bool {
	if l == nil {
		return false
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, x := range l.by {
		if x.Device == device && x.measured(leaseNow()) && x.pid > 0 && x.host == host {
			return true
		}
	}
	return false
}

// shrinkPressed applies a reading of device's processes (pid -> bytes) to its pressed
// leases whose holders are on host (rule 6): one whose processes (tree: each pid's
// descendants) measure below its bytes is shrunk to that, and pressed no more. It
// returns the leases shrunk, as holder names, for the log.
func (l *leases) shrinkPressed(device, host string, usage map[int]int64, tree func(pid int) []int) []codec.LeaseReply {
	now := leaseNow()
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []codec.LeaseReply
	for _, x := range l.by {
		if x.Device != device || !x.measured(now) || x.pid <= 0 || x.host != host {
			continue
		}
		var used int64
		for _, pid := range tree(x.pid) {
			used += usage[pid]
		}
		if used < x.Bytes {
			x.Bytes = used
			x.pressedAt, x.Pressed, x.shrunkAt = time.Time{}, false, now
			c := x.LeaseReply
			c.Lease = ""
			out = append(out, c)
		}
	}
	return out
}

// reclaim presses the reclaimable leases on device of a class below prio, for a pool
// that needs their memory (supervise.go); false when none is pressed whose shrink this
// gateway can see (pressing); the classes' priorities are c's.
func (b *budget) reclaim(c *config.Config, device string, prio int) bool {
	l := b.leases
	l.mu.Lock()
	l.expire(leaseNow())
	l.press(device, prio, "", func(class string) int { return classPriority(c, class) }, leaseNow())
	l.mu.Unlock()
	b.pokePresser()
	return b.pressing(device)
}

// pressing reports whether a lease on device is pressed and its holder measurable here:
// the device is measurable (press.go), and the holder gave a pid of this host (rule 6).
// A pressed lease that is not is worth no wait: nothing here would shrink it.
func (b *budget) pressing(device string) bool {
	host, _ := os.Hostname()
	if !b.measurable(device) || host == "" {
		return false
	}
	l := b.leases
	l.mu.Lock()
	defer l.mu.Unlock()
	l.expire(leaseNow())
	now := leaseNow()
	for _, x := range l.by {
		if x.Device == device && !x.pressedAt.IsZero() && now.Sub(x.pressedAt) < pressFor && x.pid > 0 && x.host == host {
			return true
		}
	}
	return false
}

// pressedOn reports whether a lease on device is pressed at now: l.mu held.
func (l *leases) pressedOn(device string, now time.Time) bool {
	for _, x := range l.by {
		if x.Device == device && !x.pressedAt.IsZero() && now.Sub(x.pressedAt) < pressFor {
			return true
		}
	}
	return false
}

// classPriority is class's priority in c (-1: unknown).
func classPriority(c *config.Config, class string) int {
	if cl := c.Classes[class]; cl != nil {
		return cl.Priority
	}
	return -1
}
