package test

import (
	"path/filepath"
	"testing"
	"time"

	"github.com/ortbus/ortbus/codec"
)

// TestPauseBatch: through a real gateway and worker, an app pauses batch. A batch request
// sent meanwhile waits while an interactive one sent after it is answered; status lists the
// pause; the app's resume lets the batch request through, with its result. Then a pause of
// a moment ends on its own: a batch request sent during it is answered after its end.
func TestPauseBatch(t *testing.T) {
	t.Parallel()
	c := tinyConfig(t, imageRoot(t), "p", 3*time.Second, "interactive", "batch")
	g := startGateway(t, writeConfigFile(t, filepath.Join(t.TempDir(), "gateway.toml"), c))
	g.waitLive(t, "p", 1)
	pause := func(req codec.PauseRequest) codec.PauseReply {
		t.Helper()
		b, _ := codec.Marshal(&req)
		m, err := g.NC.Request("ortbus.v1.pause", b, 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		var pr codec.PauseReply
		if err := codec.Unmarshal(m.Data, &pr); err != nil || pr.Class != "batch" {
			t.Fatalf("pause reply %s: %+v %v", m.Data, pr, err)
		}
		return pr
	}
	in := newInbox(t, g.NC)
	x := map[string]*codec.Tensor{"x": {Type: "float32", Shape: []int64{1, 4}, Data: codec.Float32Bytes([]float32{1, 2, 3, 4})}}
	batch := func(key string) {
		g.post(t, in, "infer", key, &codec.Request{Model: "tiny", Class: "batch", TimeoutMS: 120_000, Inputs: x})
	}

	if pr := pause(codec.PauseRequest{Class: "batch", ForMS: time.Minute.Milliseconds()}); pr.UntilUnixMS == 0 {
		t.Fatalf("pause reply %+v", pr)
	}
	if st := g.status(t); len(st.Pauses) != 1 || st.Pauses[0].Class != "batch" {
		t.Fatalf("status pauses %+v", st.Pauses)
	}
	batch("batch")
	g.post(t, in, "infer", "interactive", &codec.Request{Model: "tiny", Class: "interactive", Inputs: x})
	if k := in.key(in.next(t, "the interactive answer")); k != "interactive" {
		t.Fatalf("first answer %s, want the interactive one while batch is paused", k)
	}
	if pr := pause(codec.PauseRequest{Action: codec.PauseResume, Class: "batch"}); !pr.Resumed {
		t.Fatal("the resume found no pause")
	}
	m := in.next(t, "the batch answer after the resume")
	if r := gwDecode(t, m); in.key(m) != "batch" || r.Err != nil {
		t.Fatalf("after the resume: %s %+v", in.key(m), r.Err)
	}

	// A pause of a moment, not resumed: it ends on its own.
	until := time.UnixMilli(pause(codec.PauseRequest{Class: "batch", ForMS: 1000}).UntilUnixMS)
	batch("expiry")
	m = in.next(t, "the batch answer after the pause's end")
	if r := gwDecode(t, m); in.key(m) != "expiry" || r.Err != nil {
		t.Fatalf("after the pause's end: %s %+v", in.key(m), r.Err)
	}
	if now := time.Now(); now.Before(until) {
		t.Fatalf("the batch request was answered %s before its pause ended", until.Sub(now))
	}
	if st := g.status(t); len(st.Pauses) != 0 {
		t.Fatalf("status pauses after the end: %+v", st.Pauses)
	}
}
