package codec

import (
	"encoding/json"
	"testing"
)

// TestLeaseRequestWait: wait_ms is an acquire's, within 0 to MaxLeaseWaitMS; anything
// else is bad_request naming the field, and it travels under its wire name in both
// encodings.
func TestLeaseRequestWait(t *testing.T) {
	for _, ms := range []int64{0, 1, MaxLeaseWaitMS} {
		r := LeaseRequest{Action: LeaseAcquire, Device: "cpu", Bytes: 1, WaitMS: ms}
		if err := r.Validate(); err != nil {
			t.Errorf("wait_ms %d refused: %v", ms, err)
		}
	}
	for _, r := range []LeaseRequest{
		{Action: LeaseAcquire, Device: "cpu", Bytes: 1, WaitMS: -1},
		{Action: LeaseAcquire, Device: "cpu", Bytes: 1, WaitMS: MaxLeaseWaitMS + 1},
		{Action: LeaseAcquire, Device: "cpu", Bytes: 1, WaitMS: 1 << 62},
		{Action: LeaseRenew, Lease: "abc", WaitMS: 1000},
		{Action: LeaseRelease, Lease: "abc", WaitMS: 1000},
	} {
		e := AsError(r.Validate())
		if e == nil || e.Code != CodeBadRequest || e.Details["field"] != "wait_ms" {
			t.Errorf("%+v: %v, want bad_request on field wait_ms", r, e)
		}
	}
	req := LeaseRequest{Action: LeaseAcquire, Device: "cpu", Bytes: 1, WaitMS: 2500}
	b, err := Marshal(&req)
	if err != nil {
		t.Fatal(err)
	}
	var back LeaseRequest
	if err := Unmarshal(b, &back); err != nil || back.WaitMS != 2500 {
		t.Errorf("msgpack round trip: %+v %v", back, err)
	}
	var m map[string]any
	j, _ := json.Marshal(&req)
	if json.Unmarshal(j, &m) != nil || m["wait_ms"] != float64(2500) {
		t.Errorf("JSON %s lacks wait_ms", j)
	}
}

// TestLeaseRequestRelief: a renew may carry bytes > 0 (it asks for relief); negative
// bytes, or bytes on a release, are bad_request naming the field; relief travels under its
// wire name.
func TestLeaseRequestRelief(t *testing.T) {
	if err := (&LeaseRequest{Action: LeaseRenew, Lease: "abc", Bytes: 256 << 20}).Validate(); err != nil {
		t.Errorf("a renew asking for relief refused: %v", err)
	}
	for _, r := range []LeaseRequest{
		{Action: LeaseRenew, Lease: "abc", Bytes: -1},
		{Action: LeaseRelease, Lease: "abc", Bytes: 1},
	} {
		e := AsError(r.Validate())
		if e == nil || e.Code != CodeBadRequest || e.Details["field"] != "bytes" {
			t.Errorf("%+v: %v, want bad_request on field bytes", r, e)
		}
	}
	b, err := json.Marshal(&LeaseReply{Device: "cpu", Relief: true})
	if err != nil || !json.Valid(b) || string(b) != `{"device":"cpu","bytes":0,"class":"","expires_unix_ms":0,"relief":true}` {
		t.Errorf("reply with relief: %s %v", b, err)
	}
}
