package worker

import (
	"sync"

	"github.com/ortbus/ortbus/internal/fault"
)

// lateClaims is the fault hook's claim of a first attempt sent late (chaos tests only:
// fault.SlowClaim, ORTBUS_FAULT_INJECT=1 and a request path naming
// fault.MagicSlowClaim). The claim of the request's first attempt is held until the
// worker has claimed a later attempt of the same request, which the gateway sends when
// no claim came in time: the first attempt's claim then reaches the gateway after the
// second's, as a claim delayed on a loaded machine does — deterministically. Off, it
// holds nothing.
type lateClaims struct {
	mu   sync.Mutex
	held map[string]func() // request id -> its first attempt's claim, to be sent
}

// hold reports whether j's claim is held (send runs later); for a later attempt of a
// request whose first claim is held, it sends j's claim (send) and then the held one.
func (l *lateClaims) hold(j *job, send func()) bool {
	it := j.item
	if !fault.SlowClaim(it.Path, it.InputPaths) {
		return false
	}
	l.mu.Lock()
	if it.Attempt <= 1 {
		if l.held == nil {
			l.held = map[string]func(){}
		}
		l.held[it.ID] = send
		l.mu.Unlock()
		return true
	}
	first := l.held[it.ID]
	delete(l.held, it.ID)
	l.mu.Unlock()
	send()
	if first != nil {
		first()
	}
	return true
}
