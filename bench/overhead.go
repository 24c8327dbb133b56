package bench

import (
	"context"
	"fmt"
	"io"
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
	// Traced (-trace) is the gateway path of a second system that traces every request
	// and exports its spans (overhead_trace.go); nil without -trace.
	Traced *TracedOverhead `json:"traced,omitempty"`
	// Page (-pages N) is the gateway path of a second system with N pages open on its
	// HTTP API, streaming (overhead_page.go); nil without -pages.
	Page *PageOverhead `json:"page,omitempty"`
}

// TracedOverhead is the traced gateway path of overhead -trace.
type TracedOverhead struct {
	Gateway LatencyUS `json:"gateway"`
	// MinusUntracedP50US is its p50 less the untraced gateway path's, in microseconds.
	MinusUntracedP50US float64 `json:"minus_untraced_p50_us"`
	// Exports and ExportBytes are the OTLP exports the sink took, and their bytes.
	Exports     int64 `json:"exports"`
	ExportBytes int64 `json:"export_bytes"`
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
	n := positiveOr(o.N, 3000)
	h, err := newHarness(&o, "overhead", 0)
	if err != nil {
		return nil, err
	}
	defer h.close()
	tinyDir := filepath.Join(h.w.models, onnxgen.TinyDir)
	x := []float32{1, 2, 3, 4}

	// (a) in-process: the same library, loaded into this process.
	inproc, closeSession, err := overheadInProcess(h, tinyDir, x)
	if err != nil {
		return nil, err
	}
	defer closeSession()

	sys, err := h.startSystem(ctx, "overhead", overheadConfig(h, tinyDir))
	if err != nil {
		return nil, err
	}
	defer sys.stop()

	xt := &codec.Tensor{Type: "float32", Shape: []int64{1, onnxgen.TinyDim}, Data: codec.Float32Bytes(x)}
	// (b) raw NATS: a work item straight to the pool's queue group.
	rawItem := codec.WorkItem{Request: codec.Request{Model: "tiny", Inputs: map[string]*codec.Tensor{"x": xt}}, Op: subjects.OpInfer}
	raw := rawPath(sys, rawItem)
	// (c) the gateway: the Go client's Infer.
	req := codec.Request{Model: "tiny", Class: subjects.ClassInteractive, Inputs: map[string]*codec.Tensor{"x": xt}}
	gw := func() error {
		c, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		_, err := sys.cl.Infer(c, req)
		return err
	}
	// (d) for reference: NATS alone, to a responder on a second connection.
	echoData, _ := codec.Marshal(&rawItem)
	echo, closeEcho, err := echoPath(sys, echoData)
	if err != nil {
		return nil, err
	}
	defer closeEcho()

	// Warm up every path, then measure in interleaved blocks so that drift of the
	// machine's state affects all three alike.
	paths := []timedPath{{name: "inprocess", f: inproc}, {name: "raw_nats", f: raw}, {name: "gateway", f: gw}, {name: "nats_echo", f: echo}}
	var sink *otlpSink
	if o.Trace {
		// (e) with -trace: the gateway path of a system that traces every request.
		traced, s, stopTraced, err := tracedPath(ctx, h, overheadConfig(h, tinyDir), req)
		if err != nil {
			return nil, err
		}
		defer stopTraced()
		sink, paths = s, append(paths, timedPath{name: "gateway_traced", f: traced})
	}
	var pages *pageRun
	if o.Pages > 0 {
		// (f) with -pages: the gateway path of a system with pages open, streaming.
		paged, run, stopPages, err := pagePath(ctx, h, overheadConfig(h, tinyDir), req, o.Pages, sys)
		if err != nil {
			return nil, err
		}
		defer stopPages()
		pages, paths = run, append(paths, timedPath{name: "gateway_page", f: paged})
	}
	pages.begin()
	sums, err := timeInterleaved(ctx, paths, overheadWarmup, n, 100)
	if err != nil {
		return nil, err
	}
	res := overheadResults(n, o.RelayReplies, sums[0], sums[1], sums[2], sums[3])
	if sink != nil {
		res.Traced = &TracedOverhead{Gateway: latencyUS(sums[4]), MinusUntracedP50US: round(us(sums[4].P50)-us(sums[2].P50), 1),
			Exports: sink.exports.Load(), ExportBytes: sink.bytes.Load()}
	}
	if res.Page, err = pages.result(ctx, sums[len(sums)-1], sums[2], positiveOr(o.pageIdle, pageIdleWindow)); err != nil {
		return nil, err
	}
	h.rep.Results = res
	res.print(o.out(), h.rep)
	return h.rep, nil
}

// overheadWarmup is how many untimed calls of each path come first.
const overheadWarmup = 200

// overheadPool is the one pool of the overhead bench.
const overheadPool = "tiny"

// overheadInProcess loads the harness's runtime library into this process and opens the
// tiny model: it returns one call of it on x, and the session's close.
func overheadInProcess(h *harness, tinyDir string, x []float32) (func() error, func(), error) {
	rt, err := ort.Load(h.lib)
	if err != nil {
		return nil, nil, err
	}
	h.rep.Machine.Runtimes.BenchProcess = rt.Version
	sess, err := rt.NewSession(filepath.Join(tinyDir, onnxgen.ModelFile), ort.SessionConfig{IntraOpThreads: 1, InterOpThreads: 1})
	if err != nil {
		return nil, nil, err
	}
	inputs := []ort.Tensor{{Name: "x", Shape: []int64{1, onnxgen.TinyDim}, Data: x}}
	bg := context.Background()
	return func() error {
		_, err := sess.Run(bg, inputs)
		return err
	}, func() { sess.Close() }, nil
}

// overheadConfig is one single-worker, single-thread pool of the tiny model serving
// every class.
func overheadConfig(h *harness, tinyDir string) sysConfig {
	return sysConfig{
		Images: h.w.images, RelayReplies: h.o.RelayReplies,
		Pools: []poolSpec{{Name: overheadPool, Runtime: h.lib, Workers: 1, Slots: 1, Threads: 1,
			Classes: []string{subjects.ClassUrgent, subjects.ClassInteractive, subjects.ClassBatch}, Models: []string{"tiny"}}},
		Models: []modelSpec{{Name: "tiny", Kind: config.KindRaw, Dir: tinyDir}},
	}
}

// rawPath is one request of item straight to the pool's interactive queue group.
func rawPath(sys *system, item codec.WorkItem) func() error {
	rawSubj, _ := subjects.Infer(overheadPool, subjects.ClassInteractive)
	return func() error {
		item.ID = nuid.Next()
		data, err := codec.Marshal(&item)
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
}

// echoPath is one request of data to a responder, on a second connection to the
// system's NATS server, that answers at once; and its close.
func echoPath(sys *system, data []byte) (func() error, func(), error) {
	echoNC, err := nats.Connect(sys.ready.NATSURL, nats.Name("ortbus bench echo"))
	if err != nil {
		return nil, nil, err
	}
	echoSub, err := echoNC.Subscribe("ortbus.bench.echo", func(m *nats.Msg) { m.Respond(m.Data) })
	if err != nil {
		echoNC.Close()
		return nil, nil, err
	}
	closeEcho := func() {
		echoSub.Unsubscribe()
		echoNC.Close()
	}
	if err := echoNC.Flush(); err != nil {
		closeEcho()
		return nil, nil, err
	}
	return func() error {
		_, err := sys.nc.Request("ortbus.bench.echo", data, 10*time.Second)
		return err
	}, closeEcho, nil
}

// overheadResults are the figures of the four paths' percentiles.
func overheadResults(n int, relay bool, in, rw, g, ec Summary) *OverheadResults {
	res := &OverheadResults{Model: "tiny (onnxgen, x [1,4] -> y)", N: n, RelayReplies: relay, InProcess: latencyUS(in), RawNATS: latencyUS(rw), Gateway: latencyUS(g),
		NATSEcho: latencyUS(ec)}
	res.Ratios = OverheadRatios{
		GatewayOverInProcessP50: ratio(float64(g.P50), float64(in.P50)), GatewayOverInProcessP99: ratio(float64(g.P99), float64(in.P99)),
		GatewayOverRawP50: ratio(float64(g.P50), float64(rw.P50)), GatewayOverRawP99: ratio(float64(g.P99), float64(rw.P99)),
		GatewayMinusInProcessP50US: round(us(g.P50)-us(in.P50), 1), GatewayMinusRawP50US: round(us(g.P50)-us(rw.P50), 1),
		GatewayOverEchoP50: ratio(float64(g.P50), float64(ec.P50)), RawOverEchoP50: ratio(float64(rw.P50), float64(ec.P50)),
		GatewayOverEchoP99: ratio(float64(g.P99), float64(ec.P99)), RawOverEchoP99: ratio(float64(rw.P99), float64(ec.P99)),
	}
	return res
}

// print prints the table and the targets' verdicts, and notes the targets missed.
func (res *OverheadResults) print(out io.Writer, rep *Report) {
	fmt.Fprintf(out, "overhead: tiny model, %d calls per path (after %d warm-up), one at a time\n", res.N, overheadWarmup)
	var rows []string
	for _, r := range []struct {
		n string
		l LatencyUS
	}{{"in-process ORT", res.InProcess}, {"raw NATS to worker", res.RawNATS}, {"gateway (client.Infer)", res.Gateway}, {"(NATS echo, no work)", res.NATSEcho}} {
		rows = append(rows, fmt.Sprintf("%s\t%.1f\t%.1f\t%.1f\t%.1f\t", r.n, r.l.P50, r.l.P95, r.l.P99, r.l.Max))
	}
	if tr := res.Traced; tr != nil {
		rows = append(rows, fmt.Sprintf("gateway, traced (-trace)\t%.1f\t%.1f\t%.1f\t%.1f\t", tr.Gateway.P50, tr.Gateway.P95, tr.Gateway.P99, tr.Gateway.Max))
	}
	if pg := res.Page; pg != nil {
		rows = append(rows, fmt.Sprintf("gateway, %d page(s) open (-pages)\t%.1f\t%.1f\t%.1f\t%.1f\t", pg.Pages, pg.Gateway.P50, pg.Gateway.P95, pg.Gateway.P99, pg.Gateway.Max))
	}
	printTable(out, "path\tp50 µs\tp95 µs\tp99 µs\tmax µs\t", rows...)
	rt0 := res.Ratios
	okDiff, okRaw := rt0.GatewayMinusInProcessP50US <= 300, rt0.GatewayOverRawP50 <= 3
	fmt.Fprintf(out, "gateway - in-process p50: %.1f µs (target <= 300 µs: %s)\n", rt0.GatewayMinusInProcessP50US, verdict(okDiff))
	fmt.Fprintf(out, "gateway / raw NATS p50: %.2fx, p99: %.2fx (target p50 <= 3x: %s)\n", rt0.GatewayOverRawP50, rt0.GatewayOverRawP99, verdict(okRaw))
	fmt.Fprintf(out, "gateway / in-process p50: %.1fx, p99: %.1fx\n", rt0.GatewayOverInProcessP50, rt0.GatewayOverInProcessP99)
	okGwEcho, okRawEcho := rt0.GatewayOverEchoP50 <= 1.6, rt0.RawOverEchoP50 <= 1.2
	fmt.Fprintf(out, "gateway / NATS echo p50: %.2fx, p99: %.2fx (target p50 <= 1.6x: %s)\n", rt0.GatewayOverEchoP50, rt0.GatewayOverEchoP99, verdict(okGwEcho))
	fmt.Fprintf(out, "raw NATS / NATS echo p50: %.2fx, p99: %.2fx (target p50 <= 1.2x: %s)\n", rt0.RawOverEchoP50, rt0.RawOverEchoP99, verdict(okRawEcho))
	if tr := res.Traced; tr != nil {
		fmt.Fprintf(out, "traced - untraced gateway p50: %.1f µs (every request traced; %d OTLP exports, %d bytes, to a sink here)\n", tr.MinusUntracedP50US, tr.Exports, tr.ExportBytes)
	}
	if pg := res.Page; pg != nil {
		fmt.Fprintf(out, "page open - none gateway p50: %.1f µs (%d page(s) streaming: %d snapshot events, %d bytes, in %.2f s)\n", pg.MinusPlainP50US, pg.Pages, pg.Events, pg.EventBytes, pg.WallS)
		fmt.Fprintf(out, "gateway CPU, idle for %.1f s: %.2f ms/s with the page(s) open (%d events), %.2f ms/s without\n", pg.IdleS, pg.IdleCPUMSPerS, pg.IdleEvents, pg.PlainIdleCPUMSPerS)
	}
	if res.RelayReplies {
		fmt.Fprintln(out, "replies: relayed by the gateway (-relay)")
	} else {
		fmt.Fprintln(out, "replies: straight from the worker to the client")
	}
	rep.target(okGwEcho, "gateway p50 is %.2fx the NATS echo (target <= 1.6x)", rt0.GatewayOverEchoP50)
	rep.target(okRawEcho, "raw NATS p50 is %.2fx the NATS echo (target <= 1.2x)", rt0.RawOverEchoP50)
	rep.target(okDiff, "gateway p50 is %.1f µs above in-process (target <= 300 µs)", rt0.GatewayMinusInProcessP50US)
	rep.target(okRaw, "gateway p50 is %.2fx raw NATS (target <= 3x)", rt0.GatewayOverRawP50)
}
