package tracing

import (
	"context"
	"log/slog"

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
