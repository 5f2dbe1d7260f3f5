// The trace context a job carries, with each way an application may have
// OpenTelemetry set up; the publish itself is faked (no server needed).
import { test } from "node:test";
import assert from "node:assert/strict";
import { Client } from "../dist/index.js";

function fakeClient() {
  const client = new Client({ options: { inboxPrefix: "_INBOX" }, getServerVersion: () => undefined, info: undefined });
  const sent = [];
  client.js = {
    publish: async (subject, body, opts) => {
      sent.push({ subject, body, headers: opts.headers, msgID: opts.msgID });
      return { stream: "TOOLQ_JOBS", seq: sent.length, duplicate: false };
    },
  };
  return { client, sent };
}

const job = { conversationId: "c", turnIndex: 1, tool: "send_payment", toolUseId: "toolu_h1", args: '{"a":1}' };

test("with an SDK but no propagator registered, the job still carries the send span's context", async () => {
  const api = await import("@opentelemetry/api");
  const { BasicTracerProvider, InMemorySpanExporter, SimpleSpanProcessor } = await import("@opentelemetry/sdk-trace-base");
  const { AsyncLocalStorageContextManager } = await import("@opentelemetry/context-async-hooks");
  const exporter = new InMemorySpanExporter();
  api.trace.setGlobalTracerProvider(new BasicTracerProvider({ spanProcessors: [new SimpleSpanProcessor(exporter)] }));
  api.context.setGlobalContextManager(new AsyncLocalStorageContextManager().enable());
  try {
    const { client, sent } = fakeClient();
    const agent = api.trace.getTracer("agent").startSpan("agent turn");
    await api.context.with(api.trace.setSpan(api.context.active(), agent), () => client.publish(job));
    agent.end();
    const [send] = exporter.getFinishedSpans().filter((s) => s.name === "send toolq.jobs.send_payment");
    assert.ok(send, "no send span exported");
    assert.equal(sent[0].headers.get("Toolq-Key").length, 32);
    assert.equal(sent[0].msgID, `job:${sent[0].headers.get("Toolq-Key")}:toolu_h1`);
    assert.equal(sent[0].headers.get("traceparent"), `00-${agent.spanContext().traceId}-${send.spanContext().spanId}-01`);

    // With a traceparent given, the send span is its child: in the trace the job carries.
    const given = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
    await client.publish({ ...job, toolUseId: "toolu_h2" }, { traceparent: given });
    const send2 = exporter.getFinishedSpans().filter((s) => s.name === "send toolq.jobs.send_payment")[1];
    assert.equal(send2.spanContext().traceId, "0af7651916cd43dd8448eb211c80319c");
    assert.equal(send2.parentSpanContext?.spanId ?? send2.parentSpanId, "b7ad6b7169203331");
    assert.equal(sent[1].headers.get("traceparent"), `00-0af7651916cd43dd8448eb211c80319c-${send2.spanContext().spanId}-01`);
  } finally {
    api.trace.disable();
    api.context.disable();
  }
});

test("without an SDK, the caller's traceparent goes as given, and none is invented", async () => {
  const { client, sent } = fakeClient();
  const given = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
  await client.publish(job, { traceparent: given });
  await client.publish({ ...job, toolUseId: "toolu_h3" });
  await client.publish({ ...job, toolUseId: "toolu_h4" }, { traceparent: "not a traceparent" });
  assert.equal(sent[0].headers.get("traceparent"), given);
  assert.equal(sent[1].headers.get("traceparent"), "");
  assert.equal(sent[2].headers.get("traceparent"), "");
});

test("a propagator that throws does not stop the publish, which still carries the span's context", async () => {
  const api = await import("@opentelemetry/api");
  const { BasicTracerProvider, InMemorySpanExporter, SimpleSpanProcessor } = await import("@opentelemetry/sdk-trace-base");
  const exporter = new InMemorySpanExporter();
  api.trace.setGlobalTracerProvider(new BasicTracerProvider({ spanProcessors: [new SimpleSpanProcessor(exporter)] }));
  api.propagation.setGlobalPropagator({ inject() { throw new Error("broken propagator"); }, extract: (c) => c, fields: () => [] });
  try {
    const { client, sent } = fakeClient();
    await client.publish(job);
    const [send] = exporter.getFinishedSpans();
    assert.ok(send, "the send span was not ended");
    assert.equal(sent.length, 1);
    assert.equal(sent[0].headers.get("traceparent"), `00-${send.spanContext().traceId}-${send.spanContext().spanId}-01`);
  } finally {
    api.trace.disable();
    api.propagation.disable();
  }
});
