package bench

import (
	"context"
	"fmt"
	"path/filepath"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nuid"

	"github.com/ortbus/ortbus/client"
	"github.com/ortbus/ortbus/codec"
	"github.com/ortbus/ortbus/config"
	"github.com/ortbus/ortbus/models/onnxgen"
	"github.com/ortbus/ortbus/ort"
	"github.com/ortbus/ortbus/subjects"
)

// OverheadResults are the results of `bench overhead`: latency of one inference of the
// tiny model ([1,4] -> [1,4]) by three paths, measured in one run, interleaved in blocks.
type OverheadResults struct {
	// Model is the model every path runs.
	Model string `json:"model"`
	// N is the number of timed calls per path (after the warm-up).
	N int `json:"n"`
	// InProcess is ort.Session.Run in the bench process (ONNX Runtime 1.30.0, 1 thread).
	InProcess LatencyUS `json:"inprocess"`
	// RawNATS is one request/reply straight to a worker on infer.<pool>.interactive.
	RawNATS LatencyUS `json:"raw_nats"`
	// Gateway is the full client path: client.Infer -> ortbus.v1.infer -> gateway ->
	// worker -> gateway -> client.
	Gateway LatencyUS `json:"gateway"`
	// RelayReplies says the gateway relayed every reply (-relay); else a worker answered
	// the client straight.
	RelayReplies bool `json:"relay_replies"`
	// NATSEcho is, for reference, one request/reply through the same NATS server to a
	// responder in the bench process that answers at once: the bus's own floor.
	NATSEcho LatencyUS      `json:"nats_echo"`
	Ratios   OverheadRatios `json:"ratios"`
}

// LatencyUS are latency percentiles in microseconds.
type LatencyUS struct {
	P50 float64 `json:"p50_us"`
	P95 float64 `json:"p95_us"`
	P99 float64 `json:"p99_us"`
	Max float64 `json:"max_us"`
}

// OverheadRatios compare the gateway path to the others.
type OverheadRatios struct {
	GatewayOverInProcessP50 float64 `json:"gateway_over_inprocess_p50"`
	GatewayOverInProcessP99 float64 `json:"gateway_over_inprocess_p99"`
	GatewayOverRawP50       float64 `json:"gateway_over_raw_p50"`
	GatewayOverRawP99       float64 `json:"gateway_over_raw_p99"`
	// GatewayMinusInProcessP50US is gateway p50 - in-process p50, in microseconds.
	GatewayMinusInProcessP50US float64 `json:"gateway_minus_inprocess_p50_us"`
	GatewayMinusRawP50US       float64 `json:"gateway_minus_raw_p50_us"`
	// GatewayOverEchoP50 and RawOverEchoP50 compare each path's p50 with the same run's
	// NATS echo (issue 12's goals: <= 1.6 and <= 1.2); the p99 ratios likewise.
	GatewayOverEchoP50 float64 `json:"gateway_over_echo_p50"`
	RawOverEchoP50     float64 `json:"raw_over_echo_p50"`
	GatewayOverEchoP99 float64 `json:"gateway_over_echo_p99"`
	RawOverEchoP99     float64 `json:"raw_over_echo_p99"`
}

func latencyUS(s Summary) LatencyUS {
	return LatencyUS{P50: us(s.P50), P95: us(s.P95), P99: us(s.P99), Max: us(s.Max)}
}

// Overhead measures the gateway path against an in-process ORT call and a raw NATS
// request to the worker, on the tiny model.
func Overhead(ctx context.Context, o Options) (*Report, error) {
	if err := o.resolve(); err != nil {
		return nil, err
	}
	n := o.N
	if n <= 0 {
		n = 3000
	}
	lib, err := o.runtimeLib(RuntimeVersion)
	if err != nil {
		return nil, err
	}
	w, err := newWorkdir(&o, 0)
	if err != nil {
		return nil, err
	}
	defer w.close()
	rep := newReport("overhead")
	defer rep.finish()
	tinyDir := filepath.Join(w.models, onnxgen.TinyDir)

	// (a) in-process: the same library, loaded into this process.
	rt, err := ort.Load(lib)
	if err != nil {
		return nil, err
	}
	rep.Machine.Runtimes.BenchProcess = rt.Version
	sess, err := rt.NewSession(filepath.Join(tinyDir, onnxgen.ModelFile), ort.SessionConfig{IntraOpThreads: 1, InterOpThreads: 1})
	if err != nil {
		return nil, err
	}
	defer sess.Close()
	x := []float32{1, 2, 3, 4}
	inputs := []ort.Tensor{{Name: "x", Shape: []int64{1, onnxgen.TinyDim}, Data: x}}
	bg := context.Background()
	inproc := func() error {
		_, err := sess.Run(bg, inputs)
		return err
	}

	const pool = "tiny"
	cfg, err := w.writeConfig(&o, "overhead", sysConfig{
		Images: w.images, RelayReplies: o.RelayReplies,
		Pools: []poolSpec{{Name: pool, Runtime: lib, Workers: 1, Slots: 1, Threads: 1,
			Classes: []string{subjects.ClassUrgent, subjects.ClassInteractive, subjects.ClassBatch}, Models: []string{"tiny"}}},
		Models: []modelSpec{{Name: "tiny", Kind: config.KindRaw, Dir: tinyDir}},
	})
	if err != nil {
		return nil, err
	}
	sys, err := startSystem(ctx, &o, w, "overhead", cfg)
	if err != nil {
		return nil, err
	}
	defer sys.stop()
	sys.runtimes(ctx, &rep.Machine.Runtimes)

	xt := &codec.Tensor{Type: "float32", Shape: []int64{1, onnxgen.TinyDim}, Data: codec.Float32Bytes(x)}
	// (b) raw NATS: a work item straight to the pool's queue group.
	rawSubj, _ := subjects.Infer(pool, subjects.ClassInteractive)
	rawItem := codec.WorkItem{Request: codec.Request{Model: "tiny", Inputs: map[string]*codec.Tensor{"x": xt}}, Op: subjects.OpInfer}
	raw := func() error {
		rawItem.ID = nuid.Next()
		data, err := codec.Marshal(&rawItem)
		if err != nil {
			return err
		}
		m, err := sys.nc.Request(rawSubj, data, 10*time.Second)
		if err != nil {
			return err
		}
		var r codec.InferReply
		return client.Decode(m, &r)
	}
	// (c) the gateway: the Go client's Infer.
	gw := func() error {
		c, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		_, err := sys.cl.Infer(c, codec.Request{Model: "tiny", Class: subjects.ClassInteractive, Inputs: map[string]*codec.Tensor{"x": xt}})
		return err
	}

	// (d) for reference: NATS alone, to a responder on a second connection.
	echoNC, err := nats.Connect(sys.ready.NATSURL, nats.Name("ortbus bench echo"))
	if err != nil {
		return nil, err
	}
	defer echoNC.Close()
	echoSub, err := echoNC.Subscribe("ortbus.bench.echo", func(m *nats.Msg) { m.Respond(m.Data) })
	if err != nil {
		return nil, err
	}
	defer echoSub.Unsubscribe()
	if err := echoNC.Flush(); err != nil {
		return nil, err
	}
	echoData, _ := codec.Marshal(&rawItem)
	echo := func() error {
		_, err := sys.nc.Request("ortbus.bench.echo", echoData, 10*time.Second)
		return err
	}

	paths := []struct {
		name string
		f    func() error
		ds   []time.Duration
	}{{name: "inprocess", f: inproc}, {name: "raw_nats", f: raw}, {name: "gateway", f: gw}, {name: "nats_echo", f: echo}}
	// Warm up every path, then measure in interleaved blocks so that drift of the
	// machine's state affects all three alike.
	for i := range paths {
		for j := 0; j < 200; j++ {
			if err := paths[i].f(); err != nil {
				return nil, fmt.Errorf("warm-up of %s: %w", paths[i].name, err)
			}
		}
	}
	const block = 100
	for done := 0; done < n; done += block {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		for i := range paths {
			for j := 0; j < min(block, n-done); j++ {
				t0 := time.Now()
				if err := paths[i].f(); err != nil {
					return nil, fmt.Errorf("%s: %w", paths[i].name, err)
				}
				paths[i].ds = append(paths[i].ds, time.Since(t0))
			}
		}
	}
	in, rw, g, ec := summarize(paths[0].ds), summarize(paths[1].ds), summarize(paths[2].ds), summarize(paths[3].ds)
	res := &OverheadResults{Model: "tiny (onnxgen, x [1,4] -> y)", N: n, RelayReplies: o.RelayReplies, InProcess: latencyUS(in), RawNATS: latencyUS(rw), Gateway: latencyUS(g),
		NATSEcho: latencyUS(ec)}
	res.Ratios = OverheadRatios{
		GatewayOverInProcessP50: ratio(float64(g.P50), float64(in.P50)), GatewayOverInProcessP99: ratio(float64(g.P99), float64(in.P99)),
		GatewayOverRawP50: ratio(float64(g.P50), float64(rw.P50)), GatewayOverRawP99: ratio(float64(g.P99), float64(rw.P99)),
		GatewayMinusInProcessP50US: round(us(g.P50)-us(in.P50), 1), GatewayMinusRawP50US: round(us(g.P50)-us(rw.P50), 1),
		GatewayOverEchoP50: ratio(float64(g.P50), float64(ec.P50)), RawOverEchoP50: ratio(float64(rw.P50), float64(ec.P50)),
		GatewayOverEchoP99: ratio(float64(g.P99), float64(ec.P99)), RawOverEchoP99: ratio(float64(rw.P99), float64(ec.P99)),
	}
	rep.Results = res

	out := o.out()
	fmt.Fprintf(out, "overhead: tiny model, %d calls per path (after 200 warm-up), one at a time\n", n)
	tw := table(out)
	fmt.Fprintln(tw, "path\tp50 µs\tp95 µs\tp99 µs\tmax µs\t")
	for _, r := range []struct {
		n string
		l LatencyUS
	}{{"in-process ORT", res.InProcess}, {"raw NATS to worker", res.RawNATS}, {"gateway (client.Infer)", res.Gateway}, {"(NATS echo, no work)", res.NATSEcho}} {
		fmt.Fprintf(tw, "%s\t%.1f\t%.1f\t%.1f\t%.1f\t\n", r.n, r.l.P50, r.l.P95, r.l.P99, r.l.Max)
	}
	tw.Flush()
	rt0 := res.Ratios
	okDiff, okRaw := rt0.GatewayMinusInProcessP50US <= 300, rt0.GatewayOverRawP50 <= 3
	fmt.Fprintf(out, "gateway - in-process p50: %.1f µs (target <= 300 µs: %s)\n", rt0.GatewayMinusInProcessP50US, verdict(okDiff))
	fmt.Fprintf(out, "gateway / raw NATS p50: %.2fx, p99: %.2fx (target p50 <= 3x: %s)\n", rt0.GatewayOverRawP50, rt0.GatewayOverRawP99, verdict(okRaw))
	fmt.Fprintf(out, "gateway / in-process p50: %.1fx, p99: %.1fx\n", rt0.GatewayOverInProcessP50, rt0.GatewayOverInProcessP99)
	okGwEcho, okRawEcho := rt0.GatewayOverEchoP50 <= 1.6, rt0.RawOverEchoP50 <= 1.2
	fmt.Fprintf(out, "gateway / NATS echo p50: %.2fx, p99: %.2fx (target p50 <= 1.6x: %s)\n", rt0.GatewayOverEchoP50, rt0.GatewayOverEchoP99, verdict(okGwEcho))
	fmt.Fprintf(out, "raw NATS / NATS echo p50: %.2fx, p99: %.2fx (target p50 <= 1.2x: %s)\n", rt0.RawOverEchoP50, rt0.RawOverEchoP99, verdict(okRawEcho))
	if o.RelayReplies {
		fmt.Fprintln(out, "replies: relayed by the gateway (-relay)")
	} else {
		fmt.Fprintln(out, "replies: straight from the worker to the client")
	}
	if !okGwEcho {
		rep.note("target missed: gateway p50 is %.2fx the NATS echo (target <= 1.6x)", rt0.GatewayOverEchoP50)
	}
	if !okRawEcho {
		rep.note("target missed: raw NATS p50 is %.2fx the NATS echo (target <= 1.2x)", rt0.RawOverEchoP50)
	}
	if !okDiff {
		rep.note("target missed: gateway p50 is %.1f µs above in-process (target <= 300 µs)", rt0.GatewayMinusInProcessP50US)
	}
	if !okRaw {
		rep.note("target missed: gateway p50 is %.2fx raw NATS (target <= 3x)", rt0.GatewayOverRawP50)
	}
	return rep, nil
}
