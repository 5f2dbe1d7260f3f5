package tracing

import (
	"context"
	"fmt"
	"log/slog"
	"os"

	"go.opentelemetry.io/contrib/bridges/otelslog"
	"go.opentelemetry.io/contrib/exporters/autoexport"
	sdklog "go.opentelemetry.io/otel/sdk/log"
	"go.opentelemetry.io/otel/trace"
)

// LogHandler adds to each record logged with a context that carries a span
// (slog's InfoContext and the like) that span's trace_id and span_id, so
// that a log line leads to its trace and back. Records without a span pass
// through unchanged.
type LogHandler struct {
	slog.Handler
}

// NewLogHandler wraps next.
func NewLogHandler(next slog.Handler) *LogHandler { return &LogHandler{Handler: next} }

// Handle adds the span's ids and hands the record on.
func (h *LogHandler) Handle(ctx context.Context, r slog.Record) error {
	if sc := trace.SpanContextFromContext(ctx); sc.IsValid() {
		r = r.Clone()
		r.AddAttrs(slog.String("trace_id", sc.TraceID().String()), slog.String("span_id", sc.SpanID().String()))
	}
	return h.Handler.Handle(ctx, r)
}

// WithAttrs returns a LogHandler over next's handler with attrs.
func (h *LogHandler) WithAttrs(attrs []slog.Attr) slog.Handler {
	return &LogHandler{Handler: h.Handler.WithAttrs(attrs)}
}

// WithGroup returns a LogHandler over next's handler with the group opened.
func (h *LogHandler) WithGroup(name string) slog.Handler {
	return &LogHandler{Handler: h.Handler.WithGroup(name)}
}

// LoggerProvider returns the OpenTelemetry logger provider that
// OTEL_LOGS_EXPORTER asks for (otlp or console), or nil when it is unset
// or none, or the SDK is disabled: logs are exported only on request. Shut
// it down, with a deadline, to flush the last records.
func LoggerProvider(ctx context.Context, service string) (*sdklog.LoggerProvider, error) {
	if disabled() {
		return nil, nil
	}
	if v := os.Getenv("OTEL_LOGS_EXPORTER"); v == "" || v == "none" {
		return nil, nil
	}
	exp, err := autoexport.NewLogExporter(ctx)
	if err != nil {
		return nil, fmt.Errorf("tracing: logs exporter: %s", oneLine(err))
	}
	res, err := Resource(service)
	if err != nil {
		return nil, err
	}
	return sdklog.NewLoggerProvider(sdklog.WithProcessor(sdklog.NewBatchProcessor(exp)), sdklog.WithResource(res)), nil
}

// NewLogger returns a logger writing to h, each line with the trace_id and
// span_id of its context's span (LogHandler), and, when lp is not nil,
// also to lp through the otelslog bridge, as name (an import path), at
// h's level or above.
func NewLogger(h slog.Handler, lp *sdklog.LoggerProvider, name string) *slog.Logger {
	var out slog.Handler = NewLogHandler(h)
	if lp != nil {
		out = slog.NewMultiHandler(out, leveled{Handler: otelslog.NewHandler(name, otelslog.WithLoggerProvider(lp)), like: h})
	}
	return slog.New(out)
}

// leveled is a handler enabled where another one is.
type leveled struct {
	slog.Handler
	like slog.Handler
}

func (l leveled) Enabled(ctx context.Context, level slog.Level) bool {
	return l.like.Enabled(ctx, level) && l.Handler.Enabled(ctx, level)
}

func (l leveled) WithAttrs(attrs []slog.Attr) slog.Handler {
	return leveled{Handler: l.Handler.WithAttrs(attrs), like: l.like}
}

func (l leveled) WithGroup(name string) slog.Handler {
	return leveled{Handler: l.Handler.WithGroup(name), like: l.like}
}
