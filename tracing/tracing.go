// Package tracing sets up OpenTelemetry for toolq's commands and names what
// toolq records: the attribute keys of its spans and the W3C trace context
// that travels in NATS headers from the publisher's send span to the
// consumer's process span.
//
// Configuration is the standard OTEL_* environment: OTEL_TRACES_EXPORTER
// (otlp, console or none), OTEL_EXPORTER_OTLP_ENDPOINT and the other
// OTEL_EXPORTER_OTLP_* variables, OTEL_SERVICE_NAME, OTEL_RESOURCE_ATTRIBUTES.
// With none of them set no spans are exported, but trace context still
// propagates, so a caller's trace continues through toolq.
package tracing

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	"go.opentelemetry.io/otel/exporters/stdout/stdouttrace"
	"go.opentelemetry.io/otel/propagation"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
)

// Attribute keys toolq sets beside the OpenTelemetry messaging conventions.
const (
	KeyKey           = attribute.Key("toolq.key")
	KeyTool          = attribute.Key("toolq.tool")
	KeyToolClass     = attribute.Key("toolq.tool.class")
	KeyDeliveryCount = attribute.Key("toolq.delivery.count")
	KeyLedgerOutcome = attribute.Key("toolq.ledger.outcome")
	KeyToolOutcome   = attribute.Key("toolq.tool.outcome")
	KeyToolUseID     = attribute.Key("toolq.tool_use_id")
	KeyConversation  = attribute.Key("toolq.conversation_id")
	KeyResultStatus  = attribute.Key("toolq.result.status")
	KeyDuplicate     = attribute.Key("toolq.duplicate")
	KeyDownstream    = attribute.Key("toolq.downstream") // the origin an HTTP tool calls
	KeyAttempt       = attribute.Key("toolq.attempt")    // the claim's fencing token
	KeyErrorCode     = attribute.Key("toolq.error.code") // the tool's error code
	KeyVerdict       = attribute.Key("toolq.verdict")    // what JetStream was told: ack, nak, dead_letter
	KeyOutcome       = attribute.Key("toolq.outcome")    // how a delivery ended (the toolq.jobs metric's label)
	KeyLink          = attribute.Key("toolq.link")       // on a link: why it was added
	KeyDLQReason     = attribute.Key("toolq.dlq.reason") // a dead letter's reason
)

// The messaging attributes of the OpenTelemetry semantic conventions.
const (
	MessagingSystem        = attribute.Key("messaging.system")
	MessagingDestination   = attribute.Key("messaging.destination.name")
	MessagingMessageID     = attribute.Key("messaging.message.id")
	MessagingConsumerGroup = attribute.Key("messaging.consumer.group.name")
	MessagingOperation     = attribute.Key("messaging.operation.type")
)

// Propagator is the W3C trace context and baggage, the propagation toolq
// uses in NATS headers.
func Propagator() propagation.TextMapPropagator {
	return propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{})
}

// Setup installs the global tracer provider and propagator from the OTEL_*
// environment and returns a function that flushes and stops the provider.
// getenv reads the environment (os.Getenv when nil); service is the default
// service name.
func Setup(ctx context.Context, service string, getenv func(string) string) (shutdown func(context.Context) error, err error) {
	if getenv == nil {
		getenv = os.Getenv
	}
	otel.SetTextMapPropagator(Propagator())
	exporter := getenv("OTEL_TRACES_EXPORTER")
	if exporter == "" && getenv("OTEL_EXPORTER_OTLP_ENDPOINT") == "" && getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") == "" {
		exporter = "none"
	}
	var sp sdktrace.SpanExporter
	switch exporter {
	case "none":
		return func(context.Context) error { return nil }, nil
	case "", "otlp":
		if p := getenv("OTEL_EXPORTER_OTLP_PROTOCOL"); p != "" && p != "http/protobuf" {
			return nil, fmt.Errorf("tracing: OTEL_EXPORTER_OTLP_PROTOCOL %q: toolq exports http/protobuf", p)
		}
		sp, err = otlptracehttp.New(ctx)
	case "console":
		sp, err = stdouttrace.New(stdouttrace.WithWriter(io.Writer(os.Stderr)))
	default:
		return nil, fmt.Errorf("tracing: OTEL_TRACES_EXPORTER %q: want otlp, console or none", exporter)
	}
	if err != nil {
		return nil, fmt.Errorf("tracing: %w", err)
	}
	// The service name given here, unless OTEL_SERVICE_NAME or
	// OTEL_RESOURCE_ATTRIBUTES say otherwise.
	named, err := resource.Merge(resource.NewSchemaless(attribute.String("service.name", service)), resource.Environment())
	if err != nil && !errors.Is(err, resource.ErrPartialResource) {
		return nil, fmt.Errorf("tracing: resource: %w", err)
	}
	res, err := resource.Merge(resource.Default(), named)
	if err != nil && !errors.Is(err, resource.ErrPartialResource) {
		return nil, fmt.Errorf("tracing: resource: %w", err)
	}
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(sp), sdktrace.WithResource(res))
	otel.SetTracerProvider(tp)
	return tp.Shutdown, nil
}

// PrometheusMeterProvider returns a meter provider whose metrics are served,
// in the Prometheus text format, by the returned handler (the consumer's
// /metrics), together with the Go runtime and process collectors.
func PrometheusMeterProvider() (*sdkmetric.MeterProvider, http.Handler, error) {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	exp, err := otelprom.New(otelprom.WithRegisterer(reg))
	if err != nil {
		return nil, nil, fmt.Errorf("tracing: prometheus exporter: %w", err)
	}
	return sdkmetric.NewMeterProvider(sdkmetric.WithReader(exp)), promhttp.HandlerFor(reg, promhttp.HandlerOpts{}), nil
}
