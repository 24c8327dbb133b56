package gateway

import (
	"slices"
	"sync"
	"time"

	"github.com/nats-io/nuid"

	"github.com/ortbus/ortbus/codec"
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
//  4. The lease id is the holder's capability (renew, release); status lists leases
//     without it. A lease also has an owner, its tenant (identity.go): a renew or release
//     from another tenant finds no such lease, and a tenant other than the local owner
//     holds at most tenantBound(maxLeases) leases, so it cannot take every one.
//  5. A device's leases cover up to their bytes of the memory that processes outside
//     ortbus are measured to use on it (a lease's holder is such a process, and nothing
//     tells which pid holds which lease): only usage past the leased bytes counts as
//     foreign, so a holder's memory is never counted twice. A holder should acquire
//     before it allocates: memory it already uses when it asks is foreign, counted beside
//     the lease asked for.
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
	owner string // its tenant (identity.go)
}

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

// lease answers one ortbus.v1.lease request of the local owner.
func (g *Gateway) lease(req *codec.LeaseRequest) (*codec.LeaseReply, *codec.Error) {
	return g.leaseAs(req, "")
}

// leaseAs answers one ortbus.v1.lease request of tenant (rule 4).
func (g *Gateway) leaseAs(req *codec.LeaseRequest, tenant string) (*codec.LeaseReply, *codec.Error) {
	if err := req.Validate(); err != nil {
		return nil, codec.AsError(err)
	}
	ttl := g.conf().Gateway.LeaseDefaultTTL.D()
	if req.TTLMS > 0 {
		ttl = min(g.conf().Gateway.LeaseMaxTTL.D(), time.Duration(min(req.TTLMS, g.conf().Gateway.LeaseMaxTTL.D().Milliseconds()))*time.Millisecond)
	}
	l := g.leases
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
			c := x.LeaseReply
			c.Released = true
			return &c, nil
		}
		x.ExpiresUnixMS = now.Add(ttl).UnixMilli()
		c := x.LeaseReply
		return &c, nil
	}
	// acquire
	class := req.Class
	if class == "" {
		class = subjects.ClassInteractive
	}
	if _, ok := g.conf().Classes[class]; !ok {
		return nil, codec.Errorf(codec.CodeBadRequest, "unknown class %q (classes: %v)", class, g.conf().ClassNames()).With("field", "class")
	}
	if !g.knownDevice(req.Device) {
		return nil, codec.Errorf(codec.CodeBadRequest, "device %q is not one this gateway's pools or [devices] name", req.Device).With("field", "device")
	}
	capacity, fraction, budget := g.deviceBudget(req.Device)
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
	adm := g.admitted(req.Device, "")
	// Reservations of classes above the lease's are not its to use (admission.go).
	adm += g.reservedAgainst(req.Device, g.conf().Classes[class].Priority)
	foreign := g.foreignBytes(req.Device, leased)
	if sum := adm + leased + foreign + req.Bytes; sum > budget || sum < 0 {
		return nil, codec.Errorf(codec.CodeOverloaded, "memory admission refused a lease of %s on device %s: admitted %s + leased %s + foreign %s + %s = %s, over the budget of %s (capacity %s x %.2f)",
			mb(req.Bytes), req.Device, mb(adm), mb(leased), mb(foreign), mb(req.Bytes), mb(sum), mb(budget), mb(capacity), fraction).
			With("device", req.Device).With("sum_bytes", sum).With("budget_bytes", budget).With("capacity_bytes", capacity).
			With("admitted_bytes", adm).With("leased_bytes", leased).With("foreign_bytes", foreign)
	}
	x := &lease{LeaseReply: codec.LeaseReply{Lease: nuid.Next(), Device: req.Device, Bytes: req.Bytes, Class: class, Holder: req.Holder, ExpiresUnixMS: now.Add(ttl).UnixMilli()}, owner: tenant}
	l.by[x.Lease] = x
	g.log.Info("lease granted", "device", x.Device, "bytes", x.Bytes, "class", x.Class, "holder", x.Holder, "ttl", ttl)
	c := x.LeaseReply
	return &c, nil
}

// knownDevice reports whether device is named by a pool or a [devices] table.
func (g *Gateway) knownDevice(device string) bool {
	if _, ok := g.conf().Devices[device]; ok {
		return true
	}
	for _, p := range g.conf().Pools {
		if p.Device == device {
			return true
		}
	}
	return false
}
