package test

import (
	"bytes"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/ortbus/ortbus/codec"
	"github.com/ortbus/ortbus/config"
	"github.com/ortbus/ortbus/models/onnxgen"
)

// inferPool is the setup of the infer tests: an image root with a spool under it, and
// raw models generated into a temporary directory, served by one pool of a gateway.
type inferPool struct {
	root, spool string
	dir         string
	models      map[string]*config.Model
	files       map[string]string // model name -> its model.onnx
	order       []string
}

// newInferPool makes the image root and its spool, and an empty set of models.
func newInferPool(t *testing.T) *inferPool {
	t.Helper()
	root := imageRoot(t)
	spool := filepath.Join(root, "spool")
	if err := os.Mkdir(spool, 0o755); err != nil {
		t.Fatal(err)
	}
	return &inferPool{root: root, spool: spool, dir: t.TempDir(), models: map[string]*config.Model{}, files: map[string]string{}}
}

// add writes g as the raw model name.
func (p *inferPool) add(t *testing.T, name string, g *onnxgen.Graph) {
	t.Helper()
	d := filepath.Join(p.dir, name)
	p.files[name] = filepath.Join(d, onnxgen.ModelFile)
	if err := g.WriteFile(p.files[name]); err != nil {
		t.Fatal(err)
	}
	p.models[name] = &config.Model{Kind: config.KindRaw, Dir: d}
	p.order = append(p.order, name)
}

// start starts a gateway whose one pool, pool (ONNX Runtime lib, one thread, class
// interactive), serves the models added, and waits for its worker to be live.
func (p *inferPool) start(t *testing.T, pool, lib string) (*gatewayProc, map[string]codec.WorkerStatus) {
	t.Helper()
	dur := func(d time.Duration) config.Duration { return config.Duration(d) }
	c := &config.Config{
		NATS:     config.NATS{Embedded: true, Listen: "127.0.0.1:0"},
		Gateway:  config.Gateway{ShutdownGrace: dur(3 * time.Second)},
		Health:   config.Health{HeartbeatInterval: dur(gwHeartbeat), MissCount: gwMissCount},
		Security: config.Security{AllowedRoots: []string{p.root}, SpoolDir: p.spool},
		Classes:  map[string]*config.Class{"interactive": {Chain: []string{pool}}},
		Pools: map[string]*config.Pool{pool: {Runtime: lib, Threads: 1,
			Classes: []string{"interactive"}, Models: p.order}},
		Models: p.models,
	}
	c.SetOrder("models", p.order...)
	g := startGateway(t, writeConfigFile(t, filepath.Join(t.TempDir(), "gateway.toml"), c))
	return g, g.waitLive(t, pool, 1)
}

// infer sends req to the gateway's infer endpoint and returns its reply or its error.
func (g *gatewayProc) infer(t *testing.T, req *codec.Request) (*codec.InferReply, *codec.Error) {
	t.Helper()
	r := g.call(t, "infer", req, gwReplyBound)
	if r.Err != nil {
		return nil, r.Err
	}
	var rep codec.InferReply
	if err := codec.Unmarshal(r.Msg.Data, &rep); err != nil {
		t.Fatal(err)
	}
	return &rep, nil
}

// sameTensor reports an error unless got is want: type, shape, bytes and strings.
func sameTensor(t *testing.T, what string, got, want *codec.Tensor) {
	t.Helper()
	if got == nil || got.Type != want.Type || !slices.Equal(got.Shape, want.Shape) || !bytes.Equal(got.Data, want.Data) || !slices.Equal(got.Strings, want.Strings) {
		t.Errorf("%s = %s, want %s", what, describeTensor(got), describeTensor(want))
	}
}
