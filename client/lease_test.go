package client

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/ortbus/ortbus/codec"
	"github.com/ortbus/ortbus/internal/testkit/testenv"
	"github.com/ortbus/ortbus/subjects"
)

// TestWaitLease: WaitLease sends one acquire with wait_ms — the wait asked for, cut to
// codec.MaxLeaseWaitMS, shortened so that the answer still lands within the caller's
// deadline (less the margin) — and returns the gateway's answer. A fake gateway on an
// in-process NATS server answers each request with its wait_ms in the holder field.
func TestWaitLease(t *testing.T) {
	nc := testenv.InProcessNATS(t)
	subj, err := subjects.API(subjects.OpLease)
	if err != nil {
		t.Fatal(err)
	}
	sent := make(chan codec.LeaseRequest, 16)
	sub, err := nc.Subscribe(subj, func(m *nats.Msg) {
		var req codec.LeaseRequest
		if codec.Unmarshal(m.Data, &req) != nil {
			return
		}
		sent <- req
		b, _ := codec.Marshal(&codec.LeaseReply{Lease: "granted", Device: req.Device, Bytes: req.Bytes, Class: req.Class})
		m.Respond(b)
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sub.Unsubscribe() })
	c := New(nc)
	req := &codec.LeaseRequest{Action: codec.LeaseRenew, Device: "cpu", Bytes: 1 << 20, Class: "urgent"}
	for _, tc := range []struct {
		name     string
		wait     time.Duration
		deadline time.Duration // 0: none
		lo, hi   int64         // the wait_ms sent
	}{
		{"plain", 2 * time.Second, 0, 2000, 2000},
		{"past the bound", time.Hour, 0, codec.MaxLeaseWaitMS, codec.MaxLeaseWaitMS},
		{"none", 0, 0, 0, 0},
		{"within a deadline", time.Minute, 10 * time.Second, 4000, 5000},
		{"a deadline shorter than the margin", time.Minute, time.Second, 0, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			if tc.deadline > 0 {
				var cancel context.CancelFunc
				ctx, cancel = context.WithTimeout(ctx, tc.deadline)
				defer cancel()
			}
			l, err := c.WaitLease(ctx, req, tc.wait)
			if err != nil || l.Lease != "granted" {
				t.Fatalf("WaitLease: %+v %v", l, err)
			}
			got := <-sent
			if got.Action != codec.LeaseAcquire || got.WaitMS < tc.lo || got.WaitMS > tc.hi || got.Device != "cpu" || got.Class != "urgent" {
				t.Errorf("sent %+v, want an acquire with wait_ms in %d..%d", got, tc.lo, tc.hi)
			}
			if len(sent) != 0 {
				t.Errorf("%d more requests sent", len(sent))
			}
		})
	}
	if req.Action != codec.LeaseRenew || req.WaitMS != 0 {
		t.Errorf("the caller's request changed: %+v", req)
	}
}
