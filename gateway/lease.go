package gateway

import (
	"cmp"
	"slices"
	"sync"
	"time"

	"github.com/nats-io/nuid"

	"github.com/ortbus/ortbus/codec"
	"github.com/ortbus/ortbus/config"
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
//     owner, its account (account.go): a renew or release from another account finds no
//     such lease, and an account other than the local owner holds at most
//     accountBound(maxLeases) leases, so it cannot take every one. Status shows the local
//     owner every lease without its id; an account only its own, with their ids (ownedBy):
//     another account's leases count in a device's figures (leased_bytes, free_bytes) but
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
//     unloading layer by layer): a shrunk lease is measured on for pressSettle,
//     shrunk again as the measure keeps falling, and not pressed again meanwhile (its
//     hook ran once). A press ends on its own after pressFor. A pid from another host
//     is never measured here (that number here is another process), and a shrink only
//     lowers a lease: a holder that lies about its pid only loses its own reservation
//     (what it really uses is then foreign, rule 5, and still counted). An account (an
//     application's account) presses only its own leases: one app's refused acquire,
//     of whatever class it names, never runs another app's hook; the local owner and
//     the gateway's own pools (supervise.go) press any.
//  7. Relief: a shrunk lease is grown back, at most to its acquire's bytes, when its
//     holder asks (a renew with bytes) and nothing presses its device any more
//     (relief.go).
//
// Leases live in the gateway that granted them (one gateway per GPU host is the home
// setup); a renew or release that reaches another gateway finds no such lease.
//
// leases is the lease table: it owns the leases, under its lock. Whether a lease fits
// its device's budget is admission's decision (admission.go), which the budget
// (budget.go) hands to grant; the table grants it under its lock, so that two acquires
// cannot both take the last bytes.
type leases struct {
	mu sync.Mutex
	by map[string]*lease // by id
}

// lease is a lease as granted, and its owner (rule 4).
type lease struct {
	codec.LeaseReply
	owner     string    // its account (account.go)
	pid       int       // its holder's process (rule 6), 0: unknown
	host      string    // ... on this host
	pressedAt time.Time // rule 6: pressed since (zero: not pressed)
	shrunkAt  time.Time // rule 6: last shrunk by a measure (measured on a while)
	granted   int64     // the bytes its acquire was granted: what relief grows it back to at most (relief.go)
}

// pressFor bounds a press; pressSettle is how long a shrunk lease is measured on (rule 6).
const (
	pressFor    = 30 * time.Second
	pressSettle = time.Second
)

// pressed reports whether x is pressed at now (rule 6).
func (x *lease) pressed(now time.Time) bool {
	return !x.pressedAt.IsZero() && now.Sub(x.pressedAt) < pressFor
}

// settling reports whether x was shrunk within pressSettle of now: measured on, not
// pressed again (rule 6).
func (x *lease) settling(now time.Time) bool {
	return !x.shrunkAt.IsZero() && now.Sub(x.shrunkAt) < pressSettle
}

// measured reports whether x's holder is measured at now (rule 6): x is pressed, or
// settling.
func (x *lease) measured(now time.Time) bool { return x.pressed(now) || x.settling(now) }

// heldOn reports whether x's holder gave its pid, on host (rule 6: only such a holder is
// measured there).
func (x *lease) heldOn(host string) bool { return x.pid > 0 && x.host == host }

// listed is x as status lists it: without its id (rule 4).
func (x *lease) listed() codec.LeaseReply {
	c := x.LeaseReply
	c.Lease = ""
	return c
}

func newLeases() *leases { return &leases{by: map[string]*lease{}} }

// heldBy is how many leases account holds: l.mu held.
func (l *leases) heldBy(account string) int {
	n := 0
	for _, x := range l.by {
		if x.owner == account {
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

// leaseTTL is the ttl req asks for, within c's bounds (rule 2).
func leaseTTL(c *config.Config, req *codec.LeaseRequest) time.Duration {
	ttl := c.Gateway.LeaseDefaultTTL.D()
	if req.TTLMS > 0 {
		ttl = min(c.Gateway.LeaseMaxTTL.D(), time.Duration(min(req.TTLMS, c.Gateway.LeaseMaxTTL.D().Milliseconds()))*time.Millisecond)
	}
	return ttl
}

// classPriority is class's priority in c (-1: unknown).
func classPriority(c *config.Config, class string) int {
	if cl := c.Classes[class]; cl != nil {
		return cl.Priority
	}
	return -1
}

// grant adds x, with a new id, at now, if the table's bounds hold it (maxLeases, and
// accountBound(maxLeases) for an owner other than the local one: rule 4) and fits, given
// the bytes leased on x's device now, finds room for it (nil: rule 1); it returns the
// lease as granted. Checked and granted under the lock: two acquires cannot both take
// the last bytes.
func (l *leases) grant(x *lease, now time.Time, fits func(leased int64) *codec.Error) (*codec.LeaseReply, *codec.Error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.expire(now)
	if len(l.by) >= maxLeases {
		return nil, codec.Errorf(codec.CodeOverloaded, "%d leases are held; release some first", len(l.by))
	}
	if x.owner != "" {
		if n := l.heldBy(x.owner); n >= accountBound(maxLeases) {
			return nil, codec.Errorf(codec.CodeOverloaded, "you hold %d leases, this gateway's bound for one owner; release some first", n).With("limit", accountBound(maxLeases))
		}
	}
	var leased int64
	for _, y := range l.by {
		if y.Device == x.Device {
			leased += y.Bytes
		}
	}
	if e := fits(leased); e != nil {
		return nil, e
	}
	x.Lease = nuid.Next()
	l.by[x.Lease] = x
	r := x.LeaseReply
	return &r, nil
}

// renewOrRelease answers a renew or a release of account ("": the local owner) at now:
// a renew extends the lease by ttl (rule 2) and notes its holder's pid and host when
// given (rule 6); a release drops it. A lease of another account is not found (rule 4).
func (l *leases) renewOrRelease(req *codec.LeaseRequest, account string, ttl time.Duration, now time.Time) (*codec.LeaseReply, *codec.Error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.expire(now)
	x, ok := l.by[req.Lease]
	if !ok || (account != "" && x.owner != account) {
		return nil, codec.Errorf(codec.CodeBadRequest, "no lease %q here (expired, released, or granted by another gateway)", req.Lease).With("field", "lease")
	}
	if req.Action == codec.LeaseRelease {
		delete(l.by, req.Lease)
		r := x.LeaseReply
		r.Released = true
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

// leased sums the live leases on device, and returns them (ids removed), newest last.
func (l *leases) leased(device string) (int64, []codec.LeaseReply) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.expire(leaseNow())
	var sum int64
	var out []codec.LeaseReply
	for _, x := range l.by {
		if x.Device == device {
			sum += x.Bytes
			out = append(out, x.listed())
		}
	}
	slices.SortFunc(out, byExpiry)
	return sum, out
}

// ownedBy returns account's own live leases on device, ids included (rule 4), newest last.
func (l *leases) ownedBy(device, account string) []codec.LeaseReply {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.expire(leaseNow())
	var out []codec.LeaseReply
	for _, x := range l.by {
		if x.Device == device && x.owner == account {
			out = append(out, x.LeaseReply)
		}
	}
	slices.SortFunc(out, byExpiry)
	return out
}

// byExpiry orders leases by their expiry, the newest last.
func byExpiry(a, b codec.LeaseReply) int { return cmp.Compare(a.ExpiresUnixMS, b.ExpiresUnixMS) }

// byDevice counts the live leases per device and class (rule 3), for a snapshot.
func (l *leases) byDevice() classCounts {
	out := classCounts{}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.expire(leaseNow())
	for _, x := range l.by {
		out.add(x.Device, x.Class, 1)
	}
	return out
}

// untilExpiry is how long from now until the next lease expires (an hour when none is
// held).
func (l *leases) untilExpiry(now time.Time) time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	next := int64(0)
	for _, x := range l.by {
		if next == 0 || x.ExpiresUnixMS < next {
			next = x.ExpiresUnixMS
		}
	}
	if next == 0 {
		return time.Hour
	}
	return max(time.Millisecond, time.UnixMilli(next).Sub(now))
}

// press marks the reclaimable leases on device of a class below asker's priority (a
// class of a greater priority number in c) as pressed, from now, for owner (an account:
// only its own; "": any) (rule 6); a lease settling from a shrink is not pressed again.
func (l *leases) press(c *config.Config, device string, asker int, owner string, now time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.expire(now)
	for _, x := range l.by {
		if x.Device == device && x.Reclaim && classPriority(c, x.Class) > asker && x.pressedAt.IsZero() && !x.settling(now) && (owner == "" || x.owner == owner) {
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
	l.mu.Lock()
	defer l.mu.Unlock()
	l.expire(now)
	for _, x := range l.by {
		if !x.pressedAt.IsZero() && !x.pressed(now) {
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

// anyLease reports whether a live lease matches match at now (which reads it under the
// table's lock).
func (l *leases) anyLease(now time.Time, match func(x *lease) bool) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.expire(now)
	for _, x := range l.by {
		if match(x) {
			return true
		}
	}
	return false
}

// pressedOn reports whether a lease on device is pressed at now.
func (l *leases) pressedOn(device string, now time.Time) bool {
	return l.anyLease(now, func(x *lease) bool { return x.Device == device && x.pressed(now) })
}

// pressedHere reports whether a lease on device is pressed at now and its holder
// measurable on host (rule 6).
func (l *leases) pressedHere(device, host string, now time.Time) bool {
	return l.anyLease(now, func(x *lease) bool { return x.Device == device && x.pressed(now) && x.heldOn(host) })
}

// measuredHere reports whether a lease on device is measured at now (pressed or
// settling) and its holder measurable on host (rule 6).
func (l *leases) measuredHere(device, host string, now time.Time) bool {
	return l.anyLease(now, func(x *lease) bool { return x.Device == device && x.measured(now) && x.heldOn(host) })
}

// anyMeasured reports whether a lease is measured (pressed or settling) at now.
func (l *leases) anyMeasured(now time.Time) bool {
	return l.anyLease(now, func(x *lease) bool { return x.measured(now) })
}

// measuredHolders maps each device with a measured lease (pressed or settling) whose
// holder is on host to those holders' pids, at now.
func (l *leases) measuredHolders(host string, now time.Time) map[string][]int {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := map[string][]int{}
	for _, x := range l.by {
		if x.measured(now) && x.heldOn(host) {
			out[x.Device] = append(out[x.Device], x.pid)
		}
	}
	return out
}

// shrinkPressed applies a reading of device's processes (pid -> bytes) to its measured
// leases whose holders are on host (rule 6): one whose processes (tree: each pid's
// descendants) measure below its bytes is shrunk to that, and pressed no more. It
// returns the leases shrunk, ids removed, for the log.
func (l *leases) shrinkPressed(device, host string, usage map[int]int64, tree func(pid int) []int) []codec.LeaseReply {
	now := leaseNow()
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []codec.LeaseReply
	for _, x := range l.by {
		if x.Device != device || !x.measured(now) || !x.heldOn(host) {
			continue
		}
		var used int64
		for _, pid := range tree(x.pid) {
			used += usage[pid]
		}
		if used < x.Bytes {
			x.Bytes = used
			x.pressedAt, x.Pressed, x.shrunkAt = time.Time{}, false, now
			out = append(out, x.listed())
		}
	}
	return out
}
