package bench

import (
	"context"
	"io"
	"net"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/ortbus/ortbus/client"
	"github.com/ortbus/ortbus/codec"
	"github.com/ortbus/ortbus/telemetry"
)

// overhead -trace: the cost of tracing on the gateway path. A second system, as the
// first, whose gateway and worker trace every request (OTEL_TRACES_SAMPLER=always_on)
// and export their spans over OTLP/HTTP to a sink in the bench process, is timed in the
// same interleaved blocks as the untraced system; each traced call carries a new
// sampled traceparent, as a traced app's would. The sink reads and counts each export
// and answers it as a collector does, so the exporters pay what they would pay for a
// collector on this host.

// otlpSink is an OTLP/HTTP trace endpoint that keeps nothing.
type otlpSink struct {
	url     string
	srv     *http.Server
	exports atomic.Int64 // export requests answered
	bytes   atomic.Int64 // their bodies' bytes
}

// startOTLPSink starts a sink on a loopback port.
func startOTLPSink() (*otlpSink, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	s := &otlpSink{url: "http://" + ln.Addr().String()}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/traces", func(w http.ResponseWriter, r *http.Request) {
		n, _ := io.Copy(io.Discard, http.MaxBytesReader(w, r.Body, 64<<20))
		s.exports.Add(1)
		s.bytes.Add(n)
		// An empty ExportTraceServiceResponse encodes as no bytes.
		w.Header().Set("Content-Type", "application/x-protobuf")
		w.WriteHeader(http.StatusOK)
	})
	s.srv = &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go s.srv.Serve(ln)
	return s, nil
}

func (s *otlpSink) close() { s.srv.Close() }

// env is the environment of a system that traces every request into s.
func (s *otlpSink) env() []string {
	return []string{"OTEL_EXPORTER_OTLP_ENDPOINT=" + s.url, "OTEL_EXPORTER_OTLP_PROTOCOL=http/protobuf", "OTEL_TRACES_SAMPLER=always_on"}
}

// tracedPath starts the traced system of overhead (cfg as the untraced one's) and
// returns its gateway path (one call of req), the sink, and their stop.
func tracedPath(ctx context.Context, h *harness, cfg sysConfig, req codec.Request) (func() error, *otlpSink, func(), error) {
	sink, err := startOTLPSink()
	if err != nil {
		return nil, nil, nil, err
	}
	path, err := h.w.writeConfig(h.o, "overhead-traced", cfg)
	if err != nil {
		sink.close()
		return nil, nil, nil, err
	}
	sys, err := startSystemEnv(ctx, h.o, h.w, "overhead-traced", path, sink.env(), nil)
	if err != nil {
		sink.close()
		return nil, nil, nil, err
	}
	call := func() error {
		tp, _ := telemetry.NewTraceparent()
		c, cancel := context.WithTimeout(client.WithTraceparent(ctx, tp, ""), 10*time.Second)
		defer cancel()
		_, err := sys.cl.Infer(c, req)
		return err
	}
	return call, sink, func() { sys.stop(); sink.close() }, nil
}
