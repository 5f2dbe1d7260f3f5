// Package otlp tests what toolq's processes export through the real OTLP
// wire protocol, configured only through OTEL_* variables: a receiver in
// the test implements the collector's gRPC TraceService, MetricsService and
// LogsService and the HTTP /v1/traces, /v1/metrics and /v1/logs endpoints, decoding the official
// go.opentelemetry.io/proto/otlp messages, and the built consumer and
// publisher binaries export to it.
package otlp

import (
	"compress/gzip"
	"context"
	"encoding/hex"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	collectorlogs "go.opentelemetry.io/proto/otlp/collector/logs/v1"
	collectormetrics "go.opentelemetry.io/proto/otlp/collector/metrics/v1"
	collectortrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	resourcepb "go.opentelemetry.io/proto/otlp/resource/v1"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"

	"github.com/toolq/toolq/internal/testenv"
)

// bin is where TestMain built the consumer and publisher.
var bin string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "toolq-otlp-bin")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	build := exec.Command("go", "build", "-o", dir+string(os.PathSeparator), "github.com/toolq/toolq/cmd/consumer", "github.com/toolq/toolq/cmd/publisher")
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "building the consumer and the publisher:", err)
		os.Exit(1)
	}
	bin = dir
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// span is what the receiver keeps of a span.
type span struct {
	service, serviceVersion, traceID, spanID, parentID, name string
	attrs                                                    map[string]string
	events                                                   map[string]map[string]string // name → attributes
	links                                                    []string                     // linked span ids
}

// receiver is an OTLP endpoint over gRPC and HTTP.
type receiver struct {
	collectortrace.UnimplementedTraceServiceServer
	collectormetrics.UnimplementedMetricsServiceServer
	mu      sync.Mutex
	spans   []span
	metrics map[string]string // metric name → service.name
	logs    []logRecord
}

// logRecord is what the receiver keeps of a log record.
type logRecord struct{ service, body, traceID string }

// logsService is the receiver as a LogsServiceServer.
type logsService struct {
	collectorlogs.UnimplementedLogsServiceServer
	*receiver
}

func (l logsService) Export(_ context.Context, req *collectorlogs.ExportLogsServiceRequest) (*collectorlogs.ExportLogsServiceResponse, error) {
	l.addLogs(req)
	return &collectorlogs.ExportLogsServiceResponse{}, nil
}

func (r *receiver) addLogs(req *collectorlogs.ExportLogsServiceRequest) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, rl := range req.ResourceLogs {
		service := serviceName(rl.Resource)
		for _, sl := range rl.ScopeLogs {
			for _, lr := range sl.LogRecords {
				r.logs = append(r.logs, logRecord{service: service, body: lr.Body.GetStringValue(), traceID: hex.EncodeToString(lr.TraceId)})
			}
		}
	}
}

func (r *receiver) Export(_ context.Context, req *collectortrace.ExportTraceServiceRequest) (*collectortrace.ExportTraceServiceResponse, error) {
	r.addSpans(req)
	return &collectortrace.ExportTraceServiceResponse{}, nil
}

// metricsService is the receiver as a MetricsServiceServer (its Export
// method's name is TraceService's too).
type metricsService struct{ *receiver }

func (m metricsService) Export(_ context.Context, req *collectormetrics.ExportMetricsServiceRequest) (*collectormetrics.ExportMetricsServiceResponse, error) {
	m.addMetrics(req)
	return &collectormetrics.ExportMetricsServiceResponse{}, nil
}

func (r *receiver) addSpans(req *collectortrace.ExportTraceServiceRequest) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, rs := range req.ResourceSpans {
		service, serviceVersion := serviceName(rs.Resource), strAttrs(rs.Resource.GetAttributes())["service.version"]
		for _, ss := range rs.ScopeSpans {
			for _, s := range ss.Spans {
				sp := span{service: service, serviceVersion: serviceVersion, traceID: hex.EncodeToString(s.TraceId), spanID: hex.EncodeToString(s.SpanId),
					parentID: hex.EncodeToString(s.ParentSpanId), name: s.Name, attrs: strAttrs(s.Attributes), events: map[string]map[string]string{}}
				for _, e := range s.Events {
					sp.events[e.Name] = strAttrs(e.Attributes)
				}
				for _, l := range s.Links {
					sp.links = append(sp.links, hex.EncodeToString(l.SpanId))
				}
				r.spans = append(r.spans, sp)
			}
		}
	}
}

func (r *receiver) addMetrics(req *collectormetrics.ExportMetricsServiceRequest) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, rm := range req.ResourceMetrics {
		service := serviceName(rm.Resource)
		for _, sm := range rm.ScopeMetrics {
			for _, m := range sm.Metrics {
				r.metrics[m.Name] = service
			}
		}
	}
}

func serviceName(res *resourcepb.Resource) string {
	if res == nil {
		return ""
	}
	return strAttrs(res.Attributes)["service.name"]
}

func strAttrs(kvs []*commonpb.KeyValue) map[string]string {
	out := map[string]string{}
	for _, kv := range kvs {
		switch v := kv.Value.GetValue().(type) {
		case *commonpb.AnyValue_StringValue:
			out[kv.Key] = v.StringValue
		case *commonpb.AnyValue_IntValue:
			out[kv.Key] = fmt.Sprint(v.IntValue)
		}
	}
	return out
}

// ServeHTTP is the OTLP/HTTP binary protobuf endpoint.
func (r *receiver) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	var body io.Reader = req.Body
	if req.Header.Get("Content-Encoding") == "gzip" {
		gz, err := gzip.NewReader(req.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		body = gz
	}
	data, err := io.ReadAll(body)
	if err != nil || req.Header.Get("Content-Type") != "application/x-protobuf" {
		http.Error(w, fmt.Sprintf("want a protobuf body: %v", err), http.StatusBadRequest)
		return
	}
	var resp proto.Message
	switch req.URL.Path {
	case "/v1/traces":
		var m collectortrace.ExportTraceServiceRequest
		if err = proto.Unmarshal(data, &m); err == nil {
			r.addSpans(&m)
		}
		resp = &collectortrace.ExportTraceServiceResponse{}
	case "/v1/metrics":
		var m collectormetrics.ExportMetricsServiceRequest
		if err = proto.Unmarshal(data, &m); err == nil {
			r.addMetrics(&m)
		}
		resp = &collectormetrics.ExportMetricsServiceResponse{}
	case "/v1/logs":
		var m collectorlogs.ExportLogsServiceRequest
		if err = proto.Unmarshal(data, &m); err == nil {
			r.addLogs(&m)
		}
		resp = &collectorlogs.ExportLogsServiceResponse{}
	default:
		http.NotFound(w, req)
		return
	}
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	out, _ := proto.Marshal(resp)
	w.Header().Set("Content-Type", "application/x-protobuf")
	w.Write(out)
}

// startReceiver listens for OTLP over protocol (grpc or http/protobuf) and
// returns the endpoint to give OTEL_EXPORTER_OTLP_ENDPOINT.
func startReceiver(t *testing.T, protocol string) (*receiver, string) {
	t.Helper()
	r := &receiver{metrics: map[string]string{}}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	switch protocol {
	case "grpc":
		gs := grpc.NewServer()
		collectortrace.RegisterTraceServiceServer(gs, r)
		collectormetrics.RegisterMetricsServiceServer(gs, metricsService{r})
		collectorlogs.RegisterLogsServiceServer(gs, logsService{receiver: r})
		go gs.Serve(l)
		t.Cleanup(gs.Stop)
	default:
		srv := &http.Server{Handler: r, ReadHeaderTimeout: 5 * time.Second}
		go srv.Serve(l)
		t.Cleanup(func() { srv.Close() })
	}
	return r, "http://" + l.Addr().String()
}

func (r *receiver) snapshot() ([]span, map[string]string, []logRecord) {
	r.mu.Lock()
	defer r.mu.Unlock()
	metrics := make(map[string]string, len(r.metrics))
	for k, v := range r.metrics {
		metrics[k] = v
	}
	return append([]span(nil), r.spans...), metrics, append([]logRecord(nil), r.logs...)
}

// otelEnv is the environment of a process that exports to endpoint over
// protocol, and nothing else from OTEL_*.
func otelEnv(protocol, endpoint string) []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "OTEL_") {
			env = append(env, kv)
		}
	}
	return append(env,
		"OTEL_EXPORTER_OTLP_PROTOCOL="+protocol,
		"OTEL_EXPORTER_OTLP_ENDPOINT="+endpoint,
		"OTEL_TRACES_EXPORTER=otlp",
		"OTEL_METRICS_EXPORTER=otlp",
		"OTEL_LOGS_EXPORTER=otlp",
		"OTEL_BLRP_SCHEDULE_DELAY=100",
		"OTEL_METRIC_EXPORT_INTERVAL=300",
		"OTEL_BSP_SCHEDULE_DELAY=100",
	)
}

// TestSpansAndMetricsArriveOverOTLP: over each OTLP protocol, a consumer on
// its embedded defaults and a publisher, configured only through OTEL_*,
// export spans that make one trace (the publisher's send span, the
// consumer's process span under it, and the HTTP client span of the tool
// call with the key on it), and the consumer's metrics; /metrics still
// serves them in the Prometheus format. The duplicate's span carries its
// toolq.duplicate event and its link to the original. Log lines carry the trace id, and
// with OTEL_LOGS_EXPORTER=otlp are exported as log records in their trace.
func TestSpansAndMetricsArriveOverOTLP(t *testing.T) {
	t.Parallel()
	for _, protocol := range []string{"grpc", "http/protobuf"} {
		t.Run(strings.ReplaceAll(protocol, "/", "_"), func(t *testing.T) {
			t.Parallel()
			rcv, endpoint := startReceiver(t, protocol)
			env := otelEnv(protocol, endpoint)

			consumer := exec.Command(filepath.Join(bin, "consumer"), "--data-dir", t.TempDir(), "--nats-listen", "127.0.0.1:0",
				"--sandbox-listen", "127.0.0.1:0", "--health-addr", "127.0.0.1:0", "--log-format", "json")
			consumer.Env = env
			var out, logs testenv.Buffer
			consumer.Stdout, consumer.Stderr = &out, &logs
			if err := consumer.Start(); err != nil {
				t.Fatal(err)
			}
			exited := make(chan error, 1)
			go func() { exited <- consumer.Wait() }()
			t.Cleanup(func() { consumer.Process.Kill() })
			var natsURL, healthURL string
			// With --log-format json, what runs where is a log record.
			testenv.Eventually(t, 60*time.Second, "the consumer's start-up record", func() bool {
				record := logs.String()
				natsURL, healthURL = find(record, `"nats":"embedded, (nats://[^ "]+)`), find(record, `"health":"(http://[^"]+)"`)
				return natsURL != "" && healthURL != ""
			})
			if out.String() != "" {
				t.Errorf("with --log-format json the consumer printed %q on standard output", out.String())
			}

			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			// The call, then the retried turn's duplicate of it (which logs).
			for _, id := range []string{"toolu_otlp", "toolu_otlp_retry"} {
				publish := exec.CommandContext(ctx, filepath.Join(bin, "publisher"), "publish", "--nats-url", natsURL,
					"--conversation", "otlp", "--turn", "1", "--tool", "send_payment", "--tool-use-id", id,
					"--args", `{"invoice_id":"inv_otlp","amount_cents":700,"currency":"EUR"}`, "--wait")
				publish.Env = env
				if result, err := publish.CombinedOutput(); err != nil || !strings.Contains(string(result), "ok") {
					t.Fatalf("publisher: %v\n%s\nconsumer logs:\n%s", err, result, logs.String())
				}
			}

			var send, process, client, execute, claim, dupSend, dupProcess span
			testenv.Eventually(t, 30*time.Second, "the publisher's and the consumer's spans in one trace, and the consumer's metrics", func() bool {
				spans, metrics, _ := rcv.snapshot()
				send, process, client, execute, claim, dupSend, dupProcess = span{}, span{}, span{}, span{}, span{}, span{}, span{}
				for _, s := range spans {
					switch {
					case s.service == "toolq-publisher" && s.name == "send toolq.jobs.send_payment" && s.attrs["toolq.tool_use_id"] == "toolu_otlp":
						send = s
					case s.service == "toolq-publisher" && s.name == "send toolq.jobs.send_payment":
						dupSend = s
					case s.service == "toolq-consumer" && s.name == "process toolq.jobs.send_payment" && s.attrs["toolq.tool_use_id"] == "toolu_otlp":
						process = s
					case s.service == "toolq-consumer" && s.name == "process toolq.jobs.send_payment" && s.attrs["toolq.tool_use_id"] == "toolu_otlp_retry":
						dupProcess = s
					case s.service == "toolq-consumer" && s.name == "HTTP POST":
						client = s
					case s.service == "toolq-consumer" && s.name == "execute_tool send_payment":
						execute = s
					case s.service == "toolq-consumer" && s.name == "toolq.claim" && claim.traceID == "":
						claim = s
					}
				}
				return send.traceID != "" && process.traceID != "" && client.traceID != "" && execute.traceID != "" && claim.traceID != "" &&
					dupSend.traceID != "" && dupProcess.traceID != "" &&
					metrics["toolq.jobs"] == "toolq-consumer" && metrics["toolq.tool.duration"] == "toolq-consumer"
			})
			if process.traceID != send.traceID || process.parentID != send.spanID {
				t.Errorf("process span %+v is not under the send span %+v", process, send)
			}
			if client.traceID != send.traceID || client.attrs["toolq.key"] == "" || client.attrs["http.request.method"] != "POST" {
				t.Errorf("HTTP client span %+v", client)
			}
			// The tool execution follows the GenAI conventions, so that LLM
			// tracing tools show it beside the model call that asked for it;
			// the ledger's spans carry the database conventions, and every
			// span the build's version.
			if execute.parentID != process.spanID || execute.attrs["gen_ai.operation.name"] != "execute_tool" ||
				execute.attrs["gen_ai.tool.name"] != "send_payment" || execute.attrs["gen_ai.tool.call.id"] != "toolu_otlp" ||
				client.parentID != execute.spanID {
				t.Errorf("execute_tool span %+v (HTTP client span's parent %s)", execute, client.parentID)
			}
			if claim.attrs["db.system.name"] != "sqlite" || claim.attrs["db.collection.name"] != "toolq_ledger" || claim.attrs["db.operation.name"] != "claim" {
				t.Errorf("claim span %+v", claim)
			}
			if execute.serviceVersion == "" || send.serviceVersion == "" {
				t.Errorf("no service.version on the consumer's (%q) or the publisher's (%q) spans", execute.serviceVersion, send.serviceVersion)
			}
			// The duplicate's span says why nothing ran and links to the original.
			if ev := dupProcess.events["toolq.duplicate"]; ev["toolq.original.tool_use_id"] != "toolu_otlp" || ev["toolq.duplicate.reason"] != "completed_before" ||
				ev["toolq.duplicate.route"] != "new_tool_use_id" || len(dupProcess.links) != 1 || dupProcess.links[0] != process.spanID {
				t.Errorf("duplicate's span: event %v, links %v (the original's span is %s)", ev, dupProcess.links, process.spanID)
			}
			// The duplicate's log line names its trace: the retried turn's.
			if !regexp.MustCompile(`"msg":"duplicate answered from the ledger".*"trace_id":"` + dupSend.traceID + `","span_id":"[0-9a-f]{16}"`).MatchString(logs.String()) {
				t.Errorf("no duplicate log line carries trace_id %s:\n%s", dupSend.traceID, logs.String())
			}

			// With OTEL_LOGS_EXPORTER=otlp, the same line is an OTel log record in
			// the duplicate's trace.
			testenv.Eventually(t, 30*time.Second, "the duplicate's log record over OTLP", func() bool {
				_, _, records := rcv.snapshot()
				for _, lr := range records {
					if lr.service == "toolq-consumer" && lr.body == "duplicate answered from the ledger" && lr.traceID == dupSend.traceID {
						return true
					}
				}
				return false
			})

			resp, err := http.Get(healthURL + "/metrics")
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if !strings.Contains(string(body), `toolq_jobs_total{`) {
				t.Errorf("/metrics beside OTLP:\n%s", body)
			}

			// SIGTERM: the consumer drains, flushes and exits 0 in bounded time.
			consumer.Process.Signal(syscall.SIGTERM)
			select {
			case err := <-exited:
				if err != nil {
					t.Fatalf("consumer exit: %v\n%s", err, logs.String())
				}
			case <-time.After(30 * time.Second):
				t.Fatal("the consumer did not exit within 30s of SIGTERM")
			}
		})
	}
}

func find(s, pattern string) string {
	m := regexp.MustCompile(pattern).FindStringSubmatch(s)
	if m == nil {
		return ""
	}
	return m[1]
}

// TestExitIsBoundedWithAStuckCollector: with a collector that accepts
// connections and never answers, a consumer that has spans and metrics to
// export still exits soon after SIGTERM, and the publisher soon after its
// result: each provider's last flush waits a bounded time.
func TestExitIsBoundedWithAStuckCollector(t *testing.T) {
	t.Parallel()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	go func() {
		var held []net.Conn // read nothing, answer nothing
		defer func() {
			for _, c := range held {
				c.Close()
			}
		}()
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			held = append(held, c)
		}
	}()
	endpoint := "http://" + l.Addr().String()
	consumer := exec.Command(filepath.Join(bin, "consumer"), "--data-dir", t.TempDir(), "--nats-listen", "127.0.0.1:0",
		"--sandbox-listen", "127.0.0.1:0")
	consumer.Env = otelEnv("http/protobuf", endpoint)
	var out, logs testenv.Buffer
	consumer.Stdout, consumer.Stderr = &out, &logs
	if err := consumer.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- consumer.Wait() }()
	t.Cleanup(func() { consumer.Process.Kill() })
	var natsURL string
	testenv.Eventually(t, 60*time.Second, "the consumer's banner", func() bool {
		natsURL = find(out.String(), `embedded, (nats://\S+)`)
		return natsURL != ""
	})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	publish := exec.CommandContext(ctx, filepath.Join(bin, "publisher"), "publish", "--nats-url", natsURL,
		"--conversation", "otlp", "--turn", "1", "--tool", "send_payment",
		"--args", `{"invoice_id":"inv_bounded","amount_cents":700,"currency":"EUR"}`, "--wait")
	publish.Env = consumer.Env
	start := time.Now()
	if result, err := publish.CombinedOutput(); err != nil {
		t.Fatalf("publisher: %v\n%s", err, result)
	}
	// Its spans' last flush: at most cli.FlushTimeout (5s).
	if took := time.Since(start); took > 12*time.Second {
		t.Errorf("the publisher took %s to publish, wait and flush", took)
	} else {
		t.Logf("publisher: %s", took)
	}
	consumer.Process.Signal(syscall.SIGTERM)
	start = time.Now()
	select {
	case err := <-exited:
		if err != nil {
			t.Fatalf("consumer exit: %v\n%s", err, logs.String())
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the consumer did not exit within 30s of SIGTERM with its collector gone")
	}
	// Logs and metrics flushed together for at most 5s, then the spans for
	// at most 5s.
	if took := time.Since(start); took > 16*time.Second {
		t.Errorf("exit took %s", took)
	} else {
		t.Logf("consumer exit: %s", took)
	}
}
