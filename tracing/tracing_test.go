package tracing_test

import (
	"context"
	"strings"
	"testing"

	"go.opentelemetry.io/otel"

	"github.com/toolq/toolq/tracing"
)

func TestSetup(t *testing.T) {
	env := func(kv ...string) func(string) string {
		m := map[string]string{}
		for i := 0; i+1 < len(kv); i += 2 {
			m[kv[i]] = kv[i+1]
		}
		return func(k string) string { return m[k] }
	}
	ctx := context.Background()
	// Nothing configured: no exporter, but W3C propagation is on.
	shutdown, err := tracing.Setup(ctx, "toolq-test", env())
	if err != nil {
		t.Fatal(err)
	}
	shutdown(ctx)
	if fields := otel.GetTextMapPropagator().Fields(); !strings.Contains(strings.Join(fields, ","), "traceparent") {
		t.Fatalf("propagator fields %v", fields)
	}
	for _, ok := range []func(string) string{
		env("OTEL_TRACES_EXPORTER", "console"),
		env("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4318"),
	} {
		shutdown, err := tracing.Setup(ctx, "toolq-test", ok)
		if err != nil {
			t.Fatal(err)
		}
		shutdown(ctx)
	}
	for _, bad := range []func(string) string{
		env("OTEL_TRACES_EXPORTER", "zipkin"),
		env("OTEL_EXPORTER_OTLP_ENDPOINT", "http://x:4317", "OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"),
	} {
		if _, err := tracing.Setup(ctx, "toolq-test", bad); err == nil || strings.Contains(err.Error(), "\n") {
			t.Errorf("accepted or not one line: %v", err)
		}
	}
}
