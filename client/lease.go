package client

import (
	"context"
	"time"

	"github.com/ortbus/ortbus/codec"
	"github.com/ortbus/ortbus/subjects"
)

// AcquireLease asks for bytes of memory on device for a process ortbus does not run (an
// LLM server, a game), counted in the device's memory admission until released or
// expired (ttl; 0: the gateway's default). A refusal is an overloaded *codec.Error whose
// details name the device, the sum and the budget.
func (c *Client) AcquireLease(ctx context.Context, device string, bytes int64, class, holder string, ttlMS int64) (*codec.LeaseReply, error) {
	return c.lease(ctx, &codec.LeaseRequest{Action: codec.LeaseAcquire, Device: device, Bytes: bytes, Class: class, Holder: holder, TTLMS: ttlMS})
}

// RenewLease extends a lease by ttlMS (0: the gateway's default) from now.
func (c *Client) RenewLease(ctx context.Context, lease string, ttlMS int64) (*codec.LeaseReply, error) {
	return c.lease(ctx, &codec.LeaseRequest{Action: codec.LeaseRenew, Lease: lease, TTLMS: ttlMS})
}

// ReleaseLease gives a lease's memory back.
func (c *Client) ReleaseLease(ctx context.Context, lease string) (*codec.LeaseReply, error) {
	return c.lease(ctx, &codec.LeaseRequest{Action: codec.LeaseRelease, Lease: lease})
}

func (c *Client) lease(ctx context.Context, req *codec.LeaseRequest) (*codec.LeaseReply, error) {
	var l codec.LeaseReply
	return &l, c.do(ctx, subjects.OpLease, req, &l)
}

// Lease sends any lease request (acquire with gate or reclaim, renew with the holder's
// pid): ortbus.v1.lease.
func (c *Client) Lease(ctx context.Context, req *codec.LeaseRequest) (*codec.LeaseReply, error) {
	return c.lease(ctx, req)
}

// leaseWaitMargin is the time WaitLease leaves the gateway's answer to arrive after the
// wait it asks for ends.
const leaseWaitMargin = 5 * time.Second

// WaitLease sends the acquire req, which the gateway keeps waiting up to wait (at most
// codec.MaxLeaseWaitMS) when the device's budget cannot hold it now, and grants on the
// event that makes room (gateway/leasewait.go): one request, no asking again. When the
// wait ends first, the answer is overloaded with the figures and waited_ms. A ctx
// deadline shortens the wait so that the answer still arrives within it (a grant that
// came after the client stopped listening would hold the memory until its ttl); without
// one, the request is bounded by the wait and a margin.
func (c *Client) WaitLease(ctx context.Context, req *codec.LeaseRequest, wait time.Duration) (*codec.LeaseReply, error) {
	r := *req
	r.Action = codec.LeaseAcquire
	if d, ok := ctx.Deadline(); ok {
		wait = min(wait, time.Until(d)-leaseWaitMargin)
	} else {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, max(wait, 0)+leaseWaitMargin)
		defer cancel()
	}
	r.WaitMS = 0
	if wait >= time.Millisecond {
		r.WaitMS = min(wait.Milliseconds(), codec.MaxLeaseWaitMS)
	}
	return c.lease(ctx, &r)
}
