package jobs

import (
	"context"
	"fmt"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/ortbus/ortbus/codec"
)

// TestStoreErrorTransient: JetStream not answering — a deadline, no stream response, or no
// responder at all (a stream between leaders while a cluster's node is lost or the cluster
// has just formed) — is unavailable, which clients retry (client.WatchJob); anything else
// is internal.
func TestStoreErrorTransient(t *testing.T) {
	for _, c := range []struct {
		err  error
		want codec.Code
	}{
		{context.DeadlineExceeded, codec.CodeUnavailable},
		{jetstream.ErrNoStreamResponse, codec.CodeUnavailable},
		{nats.ErrNoResponders, codec.CodeUnavailable},
		{fmt.Errorf("stream info: %w", nats.ErrNoResponders), codec.CodeUnavailable},
		{fmt.Errorf("something else"), codec.CodeInternal},
	} {
		if e := storeError("count results", c.err); e.Code != c.want {
			t.Errorf("storeError(%v) = %s, want %s", c.err, e.Code, c.want)
		}
	}
}
