// Package tracing sets up OpenTelemetry for toolq's commands and names what
// toolq records: the attribute keys of its spans and metrics, the W3C trace
// context that travels in NATS headers from the publisher's send span to the
// consumer's process span, and the trace_id and span_id of its log lines.
//
// Configuration is the standard OTEL_* environment, read by the
// OpenTelemetry exporters themselves (go.opentelemetry.io/contrib/exporters/autoexport):
// OTEL_TRACES_EXPORTER and OTEL_METRICS_EXPORTER (otlp, console, none; and
// prometheus for metrics), OTEL_EXPORTER_OTLP_PROTOCOL (grpc, http/protobuf)
// and the per-signal OTEL_EXPORTER_OTLP_{TRACES,METRICS}_* variables,
// OTEL_TRACES_SAMPLER and OTEL_TRACES_SAMPLER_ARG, OTEL_SERVICE_NAME,
// OTEL_RESOURCE_ATTRIBUTES and OTEL_SDK_DISABLED; OTEL_LOGS_EXPORTER, when
// set, also sends the consumer's log records. One difference from the
// specification's defaults: with neither an exporter nor an OTLP endpoint
// set for a signal, that signal is not exported (rather than sent to
// localhost), but trace context still propagates, so a caller's trace
// continues through toolq.
package tracing

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.opentelemetry.io/contrib/exporters/autoexport"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	"go.opentelemetry.io/otel/propagation"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"
	// The GenAI attributes left the semconv package after v1.41.0.
	genai "go.opentelemetry.io/otel/semconv/v1.41.0"

	"github.com/toolq/toolq/internal/version"
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
	KeyAttempt       = attribute.Key("toolq.attempt")    // the claim's attempt (tools.Request.Attempt)
	KeyErrorCode     = attribute.Key("toolq.error.code") // the tool's error code
	KeyVerdict       = attribute.Key("toolq.verdict")    // what JetStream was told: ack, nak, dead_letter
	KeyOutcome       = attribute.Key("toolq.outcome")    // how a delivery ended (the toolq.jobs metric's label)
	KeyLink          = attribute.Key("toolq.link")       // on a link: why it was added
	KeyDLQReason     = attribute.Key("toolq.dlq.reason") // a dead letter's reason
	// KeyRoute is how a duplicate came back: new_tool_use_id, redelivery,
	// replay, requeue or republish (the toolq.duplicates.suppressed label).
	KeyRoute = attribute.Key("toolq.duplicate.route")
	// KeyReason is, on a duplicate's event, why nothing ran: completed_before,
	// waited_for_in_flight, indeterminate or collision.
	KeyReason = attribute.Key("toolq.duplicate.reason")
	// KeyOriginalToolUseID is the tool_use_id that first claimed the call.
	KeyOriginalToolUseID = attribute.Key("toolq.original.tool_use_id")
	// KeyDependency is what an outage was of: ledger or broker.
	KeyDependency = attribute.Key("toolq.dependency")
)

// The attributes of the OpenTelemetry semantic conventions toolq sets,
// named by the semconv package: messaging on the process and publish spans,
// GenAI on the tool execution span (so that LLM tracing tools show it
// beside the model calls), database on the ledger spans.
const (
	MessagingSystem        = semconv.MessagingSystemKey
	MessagingDestination   = semconv.MessagingDestinationNameKey
	MessagingMessageID     = semconv.MessagingMessageIDKey
	MessagingConsumerGroup = semconv.MessagingConsumerGroupNameKey
	MessagingOperation     = semconv.MessagingOperationTypeKey

	GenAIOperationName = genai.GenAIOperationNameKey
	GenAIToolName      = genai.GenAIToolNameKey
	GenAIToolCallID    = genai.GenAIToolCallIDKey
	GenAIToolType      = genai.GenAIToolTypeKey

	DBSystem         = semconv.DBSystemNameKey
	DBOperation      = semconv.DBOperationNameKey
	DBCollection     = semconv.DBCollectionNameKey
	DBOperationBatch = semconv.DBOperationBatchSizeKey
)

// ExecuteTool is the GenAI operation of a tool execution span.
var ExecuteTool = genai.GenAIOperationNameExecuteTool

// DBSystemName is the db.system.name of a ledger backend ("postgres",
// "sqlite").
func DBSystemName(backend string) attribute.KeyValue {
	if backend == "postgres" {
		return semconv.DBSystemNamePostgreSQL
	}
	return semconv.DBSystemNameSQLite
}

// Propagator is the W3C trace context and baggage, the propagation toolq
// uses in NATS headers and HTTP tool calls.
func Propagator() propagation.TextMapPropagator {
	return propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{})
}

// Setup installs the global propagator and tracer provider from the OTEL_*
// environment of the process and returns a function that flushes and stops
// the provider (give it a context with a deadline: it waits for the
// exporter). service is the service name unless OTEL_SERVICE_NAME or
// OTEL_RESOURCE_ATTRIBUTES name another. An exporter name or protocol the
// exporters do not know is an error.
func Setup(ctx context.Context, service string) (shutdown func(context.Context) error, err error) {
	otel.SetTextMapPropagator(Propagator())
	if !exported("TRACES") {
		return func(context.Context) error { return nil }, nil
	}
	sp, err := autoexport.NewSpanExporter(ctx)
	if err != nil {
		return nil, fmt.Errorf("tracing: traces exporter: %s", oneLine(err))
	}
	res, err := Resource(service)
	if err != nil {
		return nil, err
	}
	// The sampler is OTEL_TRACES_SAMPLER's (parent-based always-on by default).
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(sp), sdktrace.WithResource(res))
	otel.SetTracerProvider(tp)
	return tp.Shutdown, nil
}

// Provider is the tracer provider Setup installed, or, when the process
// exports no traces, OpenTelemetry's no-op provider, by which a caller
// such as the worker knows that no span will record and builds nothing
// for one.
func Provider() trace.TracerProvider {
	if !exported("TRACES") {
		return noop.NewTracerProvider()
	}
	return otel.GetTracerProvider()
}

// MeterProvider returns a meter provider that feeds two readers: the
// returned handler, which serves its metrics in the Prometheus text format
// (the consumer's /metrics) together with the Go runtime and process
// collectors, and the exporter OTEL_METRICS_EXPORTER chooses, if any.
// Shut the provider down, with a deadline, to flush the last export.
func MeterProvider(ctx context.Context, service string) (*sdkmetric.MeterProvider, http.Handler, error) {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	prom, err := otelprom.New(otelprom.WithRegisterer(reg))
	if err != nil {
		return nil, nil, fmt.Errorf("tracing: prometheus exporter: %w", err)
	}
	res, err := Resource(service)
	if err != nil {
		return nil, nil, err
	}
	opts := []sdkmetric.Option{sdkmetric.WithReader(prom), sdkmetric.WithResource(res)}
	if exported("METRICS") {
		r, err := autoexport.NewMetricReader(ctx)
		if err != nil {
			return nil, nil, fmt.Errorf("tracing: metrics exporter: %s", oneLine(err))
		}
		if !autoexport.IsNoneMetricReader(r) {
			opts = append(opts, sdkmetric.WithReader(r))
		}
	}
	return sdkmetric.NewMeterProvider(opts...), promhttp.HandlerFor(reg, promhttp.HandlerOpts{}), nil
}

// Resource is the SDK's default resource named service, at the running
// build's version (service.version), unless OTEL_SERVICE_NAME or
// OTEL_RESOURCE_ATTRIBUTES say otherwise.
func Resource(service string) (*resource.Resource, error) {
	own := resource.NewSchemaless(semconv.ServiceName(service), semconv.ServiceVersion(version.Get().Version))
	named, err := resource.Merge(own, resource.Environment())
	if err != nil && !errors.Is(err, resource.ErrPartialResource) {
		return nil, fmt.Errorf("tracing: resource: %w", err)
	}
	res, err := resource.Merge(resource.Default(), named)
	if err != nil && !errors.Is(err, resource.ErrPartialResource) {
		return nil, fmt.Errorf("tracing: resource: %w", err)
	}
	return res, nil
}

// exported reports whether signal (TRACES, METRICS) is to be exported: the
// SDK is not disabled, its exporter is not "none", and an exporter or an
// OTLP endpoint is named.
func exported(signal string) bool {
	if disabled() || strings.TrimSpace(os.Getenv("OTEL_"+signal+"_EXPORTER")) == "none" {
		return false
	}
	for _, name := range []string{"OTEL_" + signal + "_EXPORTER", "OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_" + signal + "_ENDPOINT"} {
		if os.Getenv(name) != "" {
			return true
		}
	}
	return false
}

// disabled reports OTEL_SDK_DISABLED=true.
func disabled() bool {
	return strings.EqualFold(strings.TrimSpace(os.Getenv("OTEL_SDK_DISABLED")), "true")
}

func oneLine(err error) string {
	return strings.Join(strings.Fields(err.Error()), " ")
}
