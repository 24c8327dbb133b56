// Package telemetrytest turns tracing on for one test, its spans kept in memory: the
// tests of the packages that trace (gateway, worker) read what they exported.
package telemetrytest

import (
	"context"
	"testing"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/ortbus/ortbus/telemetry"
)

// Record turns tracing on for t, its spans kept in memory as they end; off again when t
// ends.
func Record(t testing.TB) *tracetest.InMemoryExporter {
	t.Helper()
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	telemetry.Use(tp)
	t.Cleanup(func() { telemetry.Use(nil); tp.Shutdown(context.Background()) })
	return exp
}
