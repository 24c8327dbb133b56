package export

import (
	"context"
	"testing"

	"github.com/ortbus/ortbus/telemetry"
)

func TestConfigured(t *testing.T) {
	for _, c := range []struct {
		env  map[string]string
		want bool
	}{
		{nil, false},
		{map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"}, true},
		{map[string]string{"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://127.0.0.1:4318/v1/traces"}, true},
		{map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "  "}, false},
		{map[string]string{"OTEL_TRACES_EXPORTER": "console"}, true},
		{map[string]string{"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://x:4318"}, false},
		{map[string]string{"OTEL_SDK_DISABLED": "true", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://x:4318"}, false},
		{map[string]string{"OTEL_SDK_DISABLED": "false", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://x:4318"}, true},
	} {
		if got := Configured(func(k string) string { return c.env[k] }); got != c.want {
			t.Errorf("%v: Configured %v, want %v", c.env, got, c.want)
		}
	}
}

func TestSetupOff(t *testing.T) {
	for _, k := range []string{"OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_TRACES_EXPORTER", "OTEL_SDK_DISABLED"} {
		t.Setenv(k, "")
	}
	stop, err := Setup(context.Background(), "test")
	if err != nil || telemetry.Enabled() {
		t.Fatalf("Setup without the variables: err %v, enabled %v", err, telemetry.Enabled())
	}
	if err := stop(context.Background()); err != nil {
		t.Fatal(err)
	}
}

func TestSetupOn(t *testing.T) {
	t.Setenv("OTEL_TRACES_EXPORTER", "")
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:1") // nothing is sent: no span ends
	t.Setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf")
	stop, err := Setup(context.Background(), "test")
	if err != nil || !telemetry.Enabled() {
		t.Fatalf("Setup with an endpoint: err %v, enabled %v", err, telemetry.Enabled())
	}
	if _, span := telemetry.Tracer().Start(context.Background(), "x"); !span.IsRecording() {
		t.Fatal("the tracer does not record")
	}
	stop(context.Background())
	if telemetry.Enabled() {
		t.Fatal("still enabled after its stop")
	}
}
