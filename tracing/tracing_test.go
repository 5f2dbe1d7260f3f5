package tracing_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http/httptest"
	"strings"
	"testing"

	"go.opentelemetry.io/otel"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/toolq/toolq/tracing"
)

// TestSetup sets the process environment (the exporters read it), so its
// cases do not run in parallel.
func TestSetup(t *testing.T) {
	ctx := context.Background()
	for _, name := range []string{"OTEL_TRACES_EXPORTER", "OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_PROTOCOL", "OTEL_SDK_DISABLED"} {
		t.Setenv(name, "")
	}
	// Nothing configured: no exporter, but W3C propagation is on.
	shutdown, err := tracing.Setup(ctx, "toolq-test")
	if err != nil {
		t.Fatal(err)
	}
	shutdown(ctx)
	if fields := otel.GetTextMapPropagator().Fields(); !strings.Contains(strings.Join(fields, ","), "traceparent") {
		t.Fatalf("propagator fields %v", fields)
	}
	// No traces exported: the provider the worker is given says so (it is
	// OpenTelemetry's no-op one, for which the worker builds no attributes).
	if _, ok := tracing.Provider().(noop.TracerProvider); !ok {
		t.Errorf("with no traces exported, Provider() is %T, want the no-op provider", tracing.Provider())
	}
	for _, tc := range []struct {
		env []string
		ok  bool
	}{
		{[]string{"OTEL_TRACES_EXPORTER", "console"}, true},
		{[]string{"OTEL_TRACES_EXPORTER", "none"}, true},
		{[]string{"OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4318"}, true},
		{[]string{"OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4317", "OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"}, true},
		{[]string{"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "http://127.0.0.1:4318/v1/traces", "OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf"}, true},
		{[]string{"OTEL_TRACES_EXPORTER", "zipkin-not-built-in"}, false},
		{[]string{"OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4317", "OTEL_EXPORTER_OTLP_PROTOCOL", "carrier-pigeon"}, false},
		{[]string{"OTEL_TRACES_EXPORTER", "zipkin-not-built-in", "OTEL_SDK_DISABLED", "true"}, true}, // disabled: nothing is built
	} {
		t.Run(strings.Join(tc.env, "="), func(t *testing.T) {
			for i := 0; i+1 < len(tc.env); i += 2 {
				t.Setenv(tc.env[i], tc.env[i+1])
			}
			shutdown, err := tracing.Setup(ctx, "toolq-test")
			if tc.ok != (err == nil) {
				t.Fatalf("err = %v, want ok %v", err, tc.ok)
			}
			if err != nil && strings.Contains(err.Error(), "\n") {
				t.Fatalf("not one line: %q", err)
			}
			if err == nil {
				// Traces exported (not disabled): the provider Setup
				// installed, whose spans record.
				_, span := tracing.Provider().Tracer("test").Start(ctx, "probe")
				if exported := !strings.Contains(strings.Join(tc.env, "="), "OTEL_SDK_DISABLED") && !strings.Contains(strings.Join(tc.env, "="), "=none"); span.IsRecording() != exported {
					t.Errorf("a span of Provider() records: %v, want %v", span.IsRecording(), exported)
				}
				span.End()
				sctx, cancel := context.WithTimeout(ctx, 0)
				defer cancel()
				shutdown(sctx)
			}
		})
	}
}

// TestLogLineCarriesTraceID: a line logged with a span's context carries
// that span's trace_id and span_id, in text and JSON; one without a span
// carries neither.
func TestLogLineCarriesTraceID(t *testing.T) {
	t.Parallel()
	tp := sdktrace.NewTracerProvider()
	ctx, span := tp.Tracer("test").Start(context.Background(), "op")
	defer span.End()
	traceID, spanID := span.SpanContext().TraceID().String(), span.SpanContext().SpanID().String()
	for _, format := range []string{"text", "json"} {
		var buf bytes.Buffer
		var h slog.Handler = slog.NewTextHandler(&buf, nil)
		if format == "json" {
			h = slog.NewJSONHandler(&buf, nil)
		}
		log := slog.New(tracing.NewLogHandler(h)).With("component", "test")
		log.InfoContext(ctx, "with span", "n", 1)
		line := buf.String()
		if format == "json" {
			var m map[string]any
			if err := json.Unmarshal([]byte(line), &m); err != nil {
				t.Fatal(err)
			}
			if m["trace_id"] != traceID || m["span_id"] != spanID || m["component"] != "test" {
				t.Fatalf("json line %s", line)
			}
		} else if !strings.Contains(line, "trace_id="+traceID) || !strings.Contains(line, "span_id="+spanID) {
			t.Fatalf("text line %s", line)
		}
		buf.Reset()
		log.InfoContext(context.Background(), "without span")
		if strings.Contains(buf.String(), "trace_id") {
			t.Fatalf("%s line without a span: %s", format, buf.String())
		}
	}
}

// TestMeterProvider: the Prometheus handler serves what the provider
// records, with no exporter configured.
func TestMeterProvider(t *testing.T) {
	t.Setenv("OTEL_METRICS_EXPORTER", "")
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "")
	ctx := context.Background()
	mp, handler, err := tracing.MeterProvider(ctx, "toolq-test")
	if err != nil {
		t.Fatal(err)
	}
	defer mp.Shutdown(ctx)
	c, _ := mp.Meter("test").Int64Counter("toolq.test.things")
	c.Add(ctx, 2)
	rec := httptest.NewRecorder()
	handler.ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	body, _ := io.ReadAll(rec.Body)
	if !strings.Contains(string(body), "toolq_test_things_total") || !strings.Contains(string(body), "go_goroutines") {
		t.Fatalf("/metrics:\n%s", body)
	}
	t.Setenv("OTEL_METRICS_EXPORTER", "nonesuch")
	if _, _, err := tracing.MeterProvider(ctx, "toolq-test"); err == nil {
		t.Fatal("unknown metrics exporter accepted")
	}
}

// TestLoggerProvider: OTel logs only when OTEL_LOGS_EXPORTER asks for them.
func TestLoggerProvider(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		exporter, disabled string
		want               bool
	}{{"", "", false}, {"none", "", false}, {"console", "", true}, {"console", "true", false}} {
		t.Setenv("OTEL_LOGS_EXPORTER", tc.exporter)
		t.Setenv("OTEL_SDK_DISABLED", tc.disabled)
		lp, err := tracing.LoggerProvider(ctx, "toolq-test")
		if err != nil || (lp != nil) != tc.want {
			t.Fatalf("OTEL_LOGS_EXPORTER=%q OTEL_SDK_DISABLED=%q: provider %v, err %v", tc.exporter, tc.disabled, lp != nil, err)
		}
		if lp != nil {
			// Below the handler's level, nothing reaches the provider either.
			var buf bytes.Buffer
			log := tracing.NewLogger(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelWarn}), lp, "test")
			if log.Enabled(ctx, slog.LevelInfo) {
				t.Error("info enabled under a warn handler")
			}
			log.Warn("kept")
			if !strings.Contains(buf.String(), "kept") {
				t.Errorf("text handler got %q", buf.String())
			}
			lp.Shutdown(ctx)
		}
	}
	t.Setenv("OTEL_SDK_DISABLED", "")
	t.Setenv("OTEL_LOGS_EXPORTER", "carrier-pigeon")
	if _, err := tracing.LoggerProvider(ctx, "toolq-test"); err == nil {
		t.Fatal("unknown logs exporter accepted")
	}
}

// TestSamplerFromEnvironment: OTEL_TRACES_SAMPLER chooses the sampler.
func TestSamplerFromEnvironment(t *testing.T) {
	ctx := context.Background()
	t.Setenv("OTEL_SDK_DISABLED", "")
	t.Setenv("OTEL_TRACES_EXPORTER", "otlp") // a provider, its exporter never reached (shut down at once)
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:1")
	for sampler, sampled := range map[string]bool{"always_off": false, "always_on": true, "traceidratio": false} {
		t.Setenv("OTEL_TRACES_SAMPLER", sampler)
		t.Setenv("OTEL_TRACES_SAMPLER_ARG", "0")
		shutdown, err := tracing.Setup(ctx, "toolq-test")
		if err != nil {
			t.Fatal(err)
		}
		_, span := otel.Tracer("test").Start(ctx, "op")
		if got := span.SpanContext().IsSampled(); got != sampled {
			t.Errorf("OTEL_TRACES_SAMPLER=%s: sampled %v", sampler, got)
		}
		span.End()
		sctx, cancel := context.WithTimeout(ctx, 0)
		shutdown(sctx)
		cancel()
	}
}

// TestNoTracesExportedWithExporterNone: OTEL_TRACES_EXPORTER=none is how
// the OTEL_* environment says "no traces" while OTEL_EXPORTER_OTLP_ENDPOINT
// sends the metrics and logs (the logs' "none" is honoured, and the
// metrics'): the worker is then given the no-op provider, and no span of
// Provider() records for an exporter that drops it.
func TestNoTracesExportedWithExporterNone(t *testing.T) {
	ctx := context.Background()
	for _, name := range []string{"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_PROTOCOL", "OTEL_SDK_DISABLED"} {
		t.Setenv(name, "")
	}
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4318")
	t.Setenv("OTEL_TRACES_EXPORTER", "none")
	shutdown, err := tracing.Setup(ctx, "toolq-test")
	if err != nil {
		t.Fatal(err)
	}
	defer shutdown(ctx)
	if _, ok := tracing.Provider().(noop.TracerProvider); !ok {
		_, span := tracing.Provider().Tracer("test").Start(ctx, "probe")
		defer span.End()
		t.Errorf("OTEL_TRACES_EXPORTER=none: Provider() is %T (a span records: %v), want the no-op provider: the worker builds every attribute, and the SDK records every span, for nothing",
			tracing.Provider(), span.IsRecording())
	}
}
