package gateway

import (
	"slices"
	"testing"

	"github.com/nats-io/nats.go/micro"

	"github.com/ortbus/ortbus/codec"
)

const deviceConfig = `
[nats]
url = "nats://127.0.0.1:1"
[security]
allowed_roots = ["/srv"]
[classes.interactive]
chain = ["igpu", "gpu", "cpu"]
[pools.igpu]
local = false
device = "igpu:0"
classes = ["interactive"]
models = ["tagger"]
[pools.gpu]
local = false
device = "cuda:0"
classes = ["interactive"]
models = ["tagger"]
[pools.cpu]
local = false
device = "cpu"
classes = ["interactive"]
models = ["tagger"]
[models.tagger]
kind = "tagger-pixai"
dir = "/srv/m/tagger"
`

// A request's device keeps only the candidate pools on that device (for the first try
// and for retries); a device no pool of the chain is on is unknown_pool.
func TestRequestDevice(t *testing.T) {
	g := unitGatewayOf(t, deviceConfig)
	for device, want := range map[string][]string{"": {"igpu", "gpu", "cpu"}, "cuda:0": {"gpu"}, "cpu": {"cpu"}, "tpu:9": nil} {
		p := &pending{op: "tag", class: "interactive", req: codec.Request{Device: device}}
		if got := candidates(g.conf(), p); !slices.Equal(got, want) {
			t.Errorf("device %q: candidates %v, want %v", device, got, want)
		}
		if got := (loopEnv{g.d}).retryPools(p); !slices.Equal(got, want) {
			t.Errorf("device %q: retry pools %v, want %v", device, got, want)
		}
	}
	b, _ := codec.Marshal(&codec.Request{ID: "d1", Path: "/srv/a.png", Device: "tpu:9"})
	r := &fakeRequest{data: b, headers: micro.Headers{}, reply: "_INBOX.dev.1"}
	g.handle("tag", r, false)
	if len(r.replies) != 1 || r.replies[0].code == "" {
		t.Fatalf("replies %+v, want one error", r.replies)
	}
	var e codec.Error
	if err := codec.Unmarshal(r.replies[0].body, &e); err != nil || e.Code != codec.CodeUnknownPool || e.Details["device"] != "tpu:9" {
		t.Fatalf("error %+v (%v), want unknown_pool naming the device", e, err)
	}
}
