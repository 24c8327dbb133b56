package gateway

import (
	"strings"
	"testing"

	"github.com/nats-io/nats.go"

	"github.com/ortbus/ortbus/codec"
	"github.com/ortbus/ortbus/config"
)

func TestMapPrefix(t *testing.T) {
	m := map[string]string{"/srv/images": "/mnt/app-images", "/srv/images/deep": "/data/deep", "/srv/out/": "/mnt/out"}
	for _, tt := range []struct {
		in, out string
		ok      bool
	}{
		{"/srv/images/a.png", "/mnt/app-images/a.png", true},
		{"/srv/images", "/mnt/app-images", true},
		{"/srv/images/deep/x.png", "/data/deep/x.png", true}, // the longest prefix wins
		{"/srv/out/m.png", "/mnt/out/m.png", true},           // a trailing slash in the map is harmless
		{"/srv/images2/a.png", "", false},                    // component-wise, not by string prefix
		{"/etc/passwd", "", false},
		{"", "", true},
	} {
		got, ok := mapPrefix(m, tt.in)
		if got != tt.out || ok != tt.ok {
			t.Errorf("mapPrefix(%q) = %q, %v; want %q, %v", tt.in, got, ok, tt.out, tt.ok)
		}
		if ok && tt.in != "" {
			if back := unmapPrefix(m, got); back != tt.in {
				t.Errorf("unmapPrefix(%q) = %q, want %q back", got, back, tt.in)
			}
		}
	}
	if got, ok := mapPrefix(nil, "/any/path"); got != "/any/path" || !ok {
		t.Errorf("no map: %q %v", got, ok)
	}
	for in, want := range map[string]string{
		"/mnt/app-images/.ortbus-spool/s.png": "/srv/images/.ortbus-spool/s.png",
		"/mnt/app-images2/x.png":              "/mnt/app-images2/x.png", // under no `to`: unchanged
		"/tmp/x.png":                          "/tmp/x.png",
	} {
		if got := unmapPrefix(m, in); got != want {
			t.Errorf("unmapPrefix(%q) = %q, want %q", in, got, want)
		}
	}
	// Two prefixes mapped to one: the way back is deterministic.
	two := map[string]string{"/b": "/x", "/a": "/x"}
	for range 20 {
		if got := unmapPrefix(two, "/x/f"); got != "/a/f" {
			t.Fatalf("unmapPrefix with two froms = %q, want /a/f", got)
		}
	}
}

// pathMapGateway is a gateway that is not started, with a remote pool "gpu" that maps
// /srv/images to /mnt/app-images and a local pool "cpu" that maps nothing.
func pathMapGateway(t *testing.T) *Gateway {
	t.Helper()
	c, err := config.Parse([]byte(`
[nats]
embedded = true
[models.seg]
kind = "segment"
dir = "/models/seg"
[pools.gpu]
local = false
classes = ["interactive"]
models = ["seg"]
path_map = { "/srv/images" = "/mnt/app-images" }
[pools.cpu]
classes = ["interactive"]
models = ["seg"]
`), "")
	if err != nil {
		t.Fatal(err)
	}
	return loopGateway(c)
}

// TestOutPathMapped: a request's out_path is mapped to the pool's host like its path,
// refused at submit when some candidate pool cannot express it, and a segment reply's
// out_path comes back in the client's view, for msgpack and JSON clients.
func TestOutPathMapped(t *testing.T) {
	g := pathMapGateway(t)
	p := &pending{op: "segment", req: codec.Request{Path: "/srv/images/in.png", OutPath: "/srv/images/masks/out.png"}}
	if err := mapPaths(g.conf(), p, []string{"gpu", "cpu"}); err != nil {
		t.Fatalf("mapPaths: %v", err)
	}
	if out, ok := mapPrefix(g.conf().Pool("gpu").PathMap, p.req.OutPath); !ok || out != "/mnt/app-images/masks/out.png" {
		t.Errorf("out_path on gpu = %q, %v", out, ok)
	}
	if out, ok := mapPrefix(g.conf().Pool("cpu").PathMap, p.req.OutPath); !ok || out != p.req.OutPath {
		t.Errorf("out_path on cpu (no map) = %q, %v", out, ok)
	}
	bad := &pending{op: "segment", req: codec.Request{Path: "/srv/images/in.png", OutPath: "/tmp/out.png"}}
	err := mapPaths(g.conf(), bad, []string{"cpu", "gpu"})
	if err == nil || err.Code != codec.CodeForbiddenPath || err.Details["pool"] != "gpu" {
		t.Fatalf("unmappable out_path: %v, want forbidden_path for pool gpu", err)
	}
	if err := mapPaths(g.conf(), bad, []string{"cpu"}); err != nil {
		t.Errorf("a pool without a map takes any out_path: %v", err)
	}

	// The reply, as the gpu worker wrote it, reaches the client in its own view.
	workerView := "/mnt/app-images/.ortbus-spool/ortbus-segment-x.png"
	data, err2 := codec.Marshal(&codec.SegmentReply{OutPath: workerView, Width: 4, Height: 3})
	if err2 != nil {
		t.Fatal(err2)
	}
	for _, asJSON := range []bool{false, true} {
		var body []byte
		var rerr *codec.Error
		q := &pending{id: "r", op: "segment", asJSON: asJSON, reply: func(b []byte, e *codec.Error) { body, rerr = b, e }}
		g.d.relay(q, "gpu", &nats.Msg{Data: append([]byte(nil), data...)})
		if rerr != nil {
			t.Fatalf("relay (json %v): %v", asJSON, rerr)
		}
		var rep codec.SegmentReply
		if err := codec.Decode(body, &rep, asJSON); err != nil {
			t.Fatalf("reply (json %v): %v", asJSON, err)
		}
		if rep.OutPath != "/srv/images/.ortbus-spool/ortbus-segment-x.png" || rep.Width != 4 || rep.Height != 3 {
			t.Errorf("reply (json %v) = %+v, want out_path in the client's view", asJSON, rep)
		}
	}
	// From a pool without a map, the reply's bytes pass untouched.
	if got := relayed(g, "segment", "cpu", data); &got[0] != &data[0] {
		t.Error("a reply from a pool without a path_map was re-encoded")
	}
}

// TestTensorPathsMapped: infer's input_paths, output_dir and output_paths are mapped to
// the pool's host like path (the request's own maps untouched, for a retry elsewhere),
// refused at submit naming the field when a candidate pool cannot express one, and the
// reply's output_paths come back in the client's view, for msgpack and JSON clients.
func TestTensorPathsMapped(t *testing.T) {
	g := pathMapGateway(t)
	req := codec.Request{
		InputPaths:  map[string]string{"x": "/srv/images/in/x.npy", "mask": "/srv/images/m.npy"},
		OutputPaths: map[string]string{"y": "/srv/images/out/y.npy"},
	}
	p := &pending{op: "infer", req: req}
	if err := mapPaths(g.conf(), p, []string{"gpu", "cpu"}); err != nil {
		t.Fatalf("mapPaths: %v", err)
	}
	r := p.req
	if field, path, ok := mapRequest(g.conf().Pools["gpu"].PathMap, &r); !ok {
		t.Fatalf("mapRequest: %s %s", field, path)
	}
	if r.InputPaths["x"] != "/mnt/app-images/in/x.npy" || r.InputPaths["mask"] != "/mnt/app-images/m.npy" || r.OutputPaths["y"] != "/mnt/app-images/out/y.npy" {
		t.Errorf("on gpu: input_paths %v output_paths %v", r.InputPaths, r.OutputPaths)
	}
	if p.req.InputPaths["x"] != "/srv/images/in/x.npy" || p.req.OutputPaths["y"] != "/srv/images/out/y.npy" {
		t.Errorf("mapping changed the request's own maps: %v %v", p.req.InputPaths, p.req.OutputPaths)
	}
	r = codec.Request{OutputDir: "/srv/images/out"}
	if _, _, ok := mapRequest(g.conf().Pools["gpu"].PathMap, &r); !ok || r.OutputDir != "/mnt/app-images/out" {
		t.Errorf("output_dir on gpu = %q, %v", r.OutputDir, ok)
	}
	for field, bad := range map[string]codec.Request{
		"input_paths.x":  {InputPaths: map[string]string{"a": "/srv/images/a.npy", "x": "/etc/x.npy"}},
		"output_dir":     {OutputDir: "/tmp"},
		"output_paths.y": {OutputPaths: map[string]string{"y": "/tmp/y.npy"}},
	} {
		err := mapPaths(g.conf(), &pending{op: "infer", req: bad}, []string{"cpu", "gpu"})
		if err == nil || err.Code != codec.CodeForbiddenPath || err.Details["pool"] != "gpu" || !strings.HasPrefix(err.Message, field+" ") {
			t.Errorf("unmappable %s: %v, want forbidden_path naming the field and pool gpu", field, err)
		}
		if err := mapPaths(g.conf(), &pending{op: "infer", req: bad}, []string{"cpu"}); err != nil {
			t.Errorf("a pool without a map takes any %s: %v", field, err)
		}
	}

	// The reply, as the gpu worker wrote it, reaches the client in its own view.
	y := &codec.Tensor{Type: "float32", Shape: []int64{1}, Data: make([]byte, 4)}
	data, err := codec.Marshal(&codec.InferReply{Outputs: map[string]*codec.Tensor{"z": y},
		OutputPaths: map[string]string{"y": "/mnt/app-images/out/y.npy", "w": "/elsewhere/w.npy"}})
	if err != nil {
		t.Fatal(err)
	}
	for _, asJSON := range []bool{false, true} {
		var body []byte
		var rerr *codec.Error
		q := &pending{id: "r", op: "infer", asJSON: asJSON, reply: func(b []byte, e *codec.Error) { body, rerr = b, e }}
		g.d.relay(q, "gpu", &nats.Msg{Data: append([]byte(nil), data...)})
		if rerr != nil {
			t.Fatalf("relay (json %v): %v", asJSON, rerr)
		}
		var rep codec.InferReply
		if err := codec.Decode(body, &rep, asJSON); err != nil {
			t.Fatalf("reply (json %v): %v", asJSON, err)
		}
		if rep.OutputPaths["y"] != "/srv/images/out/y.npy" || rep.OutputPaths["w"] != "/elsewhere/w.npy" || rep.Outputs["z"] == nil {
			t.Errorf("reply (json %v) = %+v, want output_paths in the client's view", asJSON, rep)
		}
	}
	if got := relayed(g, "infer", "cpu", data); &got[0] != &data[0] {
		t.Error("a reply from a pool without a path_map was re-encoded")
	}
	tag, _ := codec.Marshal(&codec.TagReply{General: map[string]float32{"x": 1}})
	if got := relayed(g, "tag", "gpu", tag); &got[0] != &tag[0] {
		t.Error("a reply of an op without paths was re-encoded")
	}
}

// relayed is what the client of a msgpack request of op gets when pool's worker replies
// data (relay).
func relayed(g *Gateway, op, pool string, data []byte) []byte {
	var got []byte
	g.d.relay(&pending{id: "r", op: op, reply: func(b []byte, _ *codec.Error) { got = b }}, pool, &nats.Msg{Data: data})
	return got
}

// TestMappedByAny: a path is another host's to check when one of the candidate pools maps
// a prefix it lies under (component-wise), and only then.
func TestMappedByAny(t *testing.T) {
	c := &config.Config{Pools: map[string]*config.Pool{
		"local":  {},
		"remote": {PathMap: map[string]string{"/clientview/images": "/srv/images"}},
	}}
	for _, x := range []struct {
		pools []string
		path  string
		want  bool
	}{
		{[]string{"local", "remote"}, "/clientview/images/red.png", true},
		{[]string{"remote"}, "/clientview/images", true},
		{[]string{"local"}, "/clientview/images/red.png", false},
		{[]string{"remote"}, "/clientview/images2/red.png", false},
		{[]string{"remote"}, "/etc/passwd", false},
		{nil, "/clientview/images/red.png", false},
	} {
		if got := mappedByAny(c, x.pools, x.path); got != x.want {
			t.Errorf("mappedByAny(%v, %s) = %v, want %v", x.pools, x.path, got, x.want)
		}
	}
}
