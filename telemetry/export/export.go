// Package export sets up the export of ortbus's spans (package telemetry) with the
// OpenTelemetry SDK, from the standard environment variables alone: OTLP when
// OTEL_EXPORTER_OTLP_ENDPOINT or OTEL_EXPORTER_OTLP_TRACES_ENDPOINT names a receiver (or
// OTEL_TRACES_EXPORTER names an exporter: otlp, console), the protocol by
// OTEL_EXPORTER_OTLP_PROTOCOL, sampling by OTEL_TRACES_SAMPLER and
// OTEL_TRACES_SAMPLER_ARG, batching by OTEL_BSP_*, the service by OTEL_SERVICE_NAME and
// OTEL_RESOURCE_ATTRIBUTES. It is apart from telemetry so that what only propagates
// trace context (the client) does not link the exporters.
package export

import (
	"context"
	"log/slog"
	"os"
	"strings"
	"time"

	"go.opentelemetry.io/contrib/exporters/autoexport"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/ortbus/ortbus/telemetry"
)

// Configured reports whether the environment (getenv) asks for spans to be exported:
// an OTLP endpoint for traces, or a traces exporter other than none; never while
// OTEL_SDK_DISABLED is true. Without one, nothing is set up: no exporter would have
// anywhere to send (autoexport's default, OTLP to localhost, is not assumed).
func Configured(getenv func(string) string) bool {
	if strings.EqualFold(strings.TrimSpace(getenv("OTEL_SDK_DISABLED")), "true") {
		return false
	}
	if e := strings.TrimSpace(getenv("OTEL_TRACES_EXPORTER")); e != "" {
		return !strings.EqualFold(e, "none")
	}
	return strings.TrimSpace(getenv("OTEL_EXPORTER_OTLP_ENDPOINT")) != "" || strings.TrimSpace(getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")) != ""
}

// Setup turns tracing on for this process when the environment asks for it
// (Configured): an SDK tracer provider with the exporter autoexport makes of the
// variables, its sampler and batching from them too, and service (the default
// service.name; OTEL_SERVICE_NAME wins) on its resource. The returned function flushes
// and stops it (call it before exit, with a bounded ctx); without the variables it does
// nothing, and tracing stays off.
func Setup(ctx context.Context, service string) (shutdown func(context.Context) error, err error) {
	if !Configured(os.Getenv) {
		return func(context.Context) error { return nil }, nil
	}
	exp, err := autoexport.NewSpanExporter(ctx)
	if err != nil {
		return nil, err
	}
	// Later sources win: the environment's service name over the default.
	res, err := resource.New(ctx, resource.WithAttributes(attribute.String("service.name", service)), resource.WithTelemetrySDK(), resource.WithFromEnv())
	if err != nil {
		exp.Shutdown(ctx)
		return nil, err
	}
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp), sdktrace.WithResource(res))
	telemetry.Use(tp)
	return func(ctx context.Context) error {
		telemetry.Use(nil)
		return tp.Shutdown(ctx)
	}, nil
}

// flushBound bounds the export of the spans left at a process's exit.
const flushBound = 5 * time.Second

// Start is Setup for a command's main: a failure is logged and the command runs
// untraced (tracing is never a reason not to serve). The returned function, deferred
// in main, flushes what is left within flushBound.
func Start(service string, log *slog.Logger) (stop func()) {
	shutdown, err := Setup(context.Background(), service)
	if err != nil {
		log.Warn("tracing not set up; running without it", "err", err)
		return func() {}
	}
	if telemetry.Enabled() {
		log.Info("tracing on: spans exported as the OTEL_* variables say")
	}
	return func() {
		ctx, cancel := context.WithTimeout(context.Background(), flushBound)
		defer cancel()
		if err := shutdown(ctx); err != nil {
			log.Warn("flush the last spans", "err", err)
		}
	}
}
