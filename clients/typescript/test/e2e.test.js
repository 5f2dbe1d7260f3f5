// End to end against a real consumer: `go run ./cmd/consumer` on its embedded
// defaults (NATS with JetStream, a SQLite ledger, the demo registry and its
// sandbox payments API), on free ports and a temporary data directory.
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { spawn, execFileSync } from "node:child_process";
import { mkdtempSync, rmSync } from "node:fs";
import { createServer } from "node:net";
import { tmpdir } from "node:os";
import { fileURLToPath } from "node:url";
import path from "node:path";
import { connect } from "@nats-io/transport-node";
import { jetstreamManager } from "@nats-io/jetstream";
import { Client, JOBS_STREAM, streamTurn, NOT_RUN, LookupError, ToolsError, callKey } from "../dist/index.js";

const repo = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "../../..");
let dir, consumer, nc, client, sandboxURL, exited;

function freePort() {
  return new Promise((resolve, reject) => {
    const s = createServer();
    s.once("error", reject);
    s.listen(0, "127.0.0.1", () => {
      const { port } = s.address();
      s.close(() => resolve(port));
    });
  });
}

async function waitFor(what, fn, ms = 60_000) {
  const deadline = Date.now() + ms;
  for (;;) {
    if (exited) throw new Error(`the consumer exited (${exited}) before ${what}`);
    try {
      const v = await fn();
      if (v) return v;
    } catch (err) {
      if (Date.now() > deadline) throw new Error(`${what}: ${err}`);
    }
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 100));
  }
}

before(async () => {
  dir = mkdtempSync(path.join(tmpdir(), "toolq-ts-"));
  // Built first, so that the process the test stops is the consumer itself.
  const bin = path.join(dir, "consumer");
  execFileSync("go", ["build", "-o", bin, "./cmd/consumer"], { cwd: repo, stdio: "inherit" });
  const [natsPort, sandboxPort] = [await freePort(), await freePort()];
  sandboxURL = `http://127.0.0.1:${sandboxPort}`;
  consumer = spawn(bin, ["--data-dir", path.join(dir, "data"), "--nats-listen", `127.0.0.1:${natsPort}`, "--sandbox-listen", `127.0.0.1:${sandboxPort}`, "--log-level", "warn", "--tenants", "acme"], {
    stdio: ["ignore", "ignore", "inherit"],
  });
  consumer.on("exit", (code, signal) => (exited = signal ?? code));
  nc = await waitFor("NATS", () => connect({ servers: `127.0.0.1:${natsPort}`, reconnect: false }));
  const jsm = await jetstreamManager(nc);
  await waitFor("the streams", async () => (await jsm.streams.info(JOBS_STREAM)) && (await jsm.consumers.info(JOBS_STREAM, "toolq")));
  client = new Client(nc);
}, { timeout: 180_000 });

after(async () => {
  await nc?.close();
  if (consumer && exited === undefined) {
    const done = new Promise((r) => consumer.once("exit", r));
    consumer.kill("SIGTERM");
    await done;
  }
  if (dir) rmSync(dir, { recursive: true, force: true });
});

async function payments(invoiceId) {
  const res = await fetch(`${sandboxURL}/v1/payments`);
  assert.equal(res.status, 200);
  const body = await res.json();
  const list = Array.isArray(body) ? body : (body.payments ?? body.data ?? []);
  return list.filter((p) => p.invoice_id === invoiceId);
}

const withTimeout = (ms) => AbortSignal.timeout(ms);

test("a call published twice with different tool_use_ids pays once and answers both", async () => {
  const job = {
    conversationId: "conv_ts_e2e",
    turnIndex: 3,
    tool: "send_payment",
    args: '{"invoice_id":"inv_ts_1","amount_cents":500,"currency":"EUR"}',
  };
  const first = await client.publish({ ...job, toolUseId: "toolu_ts_a" }, { traceparent: "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01" });
  const r1 = await client.awaitResult(job.conversationId, "toolu_ts_a", { signal: withTimeout(30_000) });
  // The model's retry: the same call, spelled another way, under a new id.
  const second = await client.publish({ ...job, toolUseId: "toolu_ts_b", args: { currency: "EUR", amount_cents: 500, invoice_id: "inv_ts_1" } });
  const r2 = await client.awaitResult(job.conversationId, "toolu_ts_b", { signal: withTimeout(30_000) });

  assert.equal(first.key, second.key);
  assert.equal(r1.status, "ok");
  assert.equal(r2.status, "ok");
  assert.deepEqual(r2.output, r1.output);
  assert.equal(r2.duplicate, true);
  assert.equal(r2.original_tool_use_id, "toolu_ts_a");
  assert.equal((await payments("inv_ts_1")).length, 1);

  // The headers the Go client sends.
  const jsm = await jetstreamManager(nc);
  const stored = await jsm.streams.getMessage(JOBS_STREAM, { seq: first.seq });
  assert.equal(stored.subject, "toolq.jobs.send_payment");
  assert.equal(stored.header.get("Toolq-Key"), first.key);
  assert.equal(stored.header.get("Nats-Msg-Id"), `job:${first.key}:toolu_ts_a`);
  // Without an OpenTelemetry SDK, the caller's context as given: no span is invented.
  assert.equal(stored.header.get("traceparent"), "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01");
  const unparented = await jsm.streams.getMessage(JOBS_STREAM, { seq: second.seq });
  assert.equal(unparented.header.get("traceparent"), "", "a job published outside any trace carries none");
});

test("with an OpenTelemetry SDK, the job carries the context of a real send span under the active one", async () => {
  const api = await import("@opentelemetry/api");
  const { BasicTracerProvider, InMemorySpanExporter, SimpleSpanProcessor } = await import("@opentelemetry/sdk-trace-base");
  const { W3CTraceContextPropagator } = await import("@opentelemetry/core");
  const { AsyncLocalStorageContextManager } = await import("@opentelemetry/context-async-hooks");
  const exporter = new InMemorySpanExporter();
  const provider = new BasicTracerProvider({ spanProcessors: [new SimpleSpanProcessor(exporter)] });
  api.trace.setGlobalTracerProvider(provider);
  api.propagation.setGlobalPropagator(new W3CTraceContextPropagator());
  api.context.setGlobalContextManager(new AsyncLocalStorageContextManager().enable());
  try {
    const agent = api.trace.getTracer("agent").startSpan("agent turn");
    const pub = await api.context.with(api.trace.setSpan(api.context.active(), agent), () =>
      client.publish({ conversationId: "conv_ts_otel", turnIndex: 1, tool: "send_payment", toolUseId: "toolu_otel",
        args: '{"invoice_id":"inv_otel","amount_cents":1,"currency":"EUR"}' }),
    );
    agent.end();
    const [send] = exporter.getFinishedSpans().filter((s) => s.name === "send toolq.jobs.send_payment");
    assert.ok(send, "no send span was exported");
    assert.equal(send.kind, api.SpanKind.PRODUCER);
    assert.equal(send.parentSpanContext?.spanId ?? send.parentSpanId, agent.spanContext().spanId);
    const jsm = await jetstreamManager(nc);
    const stored = await jsm.streams.getMessage(JOBS_STREAM, { seq: pub.seq });
    assert.equal(stored.header.get("traceparent"), `00-${agent.spanContext().traceId}-${send.spanContext().spanId}-01`);
    await client.awaitResult("conv_ts_otel", "toolu_otel", { signal: withTimeout(30_000) });
  } finally {
    api.trace.disable();
    api.propagation.disable();
    api.context.disable();
  }
});

test("runTurn numbers identical calls and returns their results in order", async () => {
  const pay = '{"invoice_id":"inv_ts_2","amount_cents":100,"currency":"EUR"}';
  const calls = [
    { toolUseId: "toolu_rt_0", tool: "send_payment", args: pay },
    { toolUseId: "toolu_rt_1", tool: "send_payment", args: '{"currency":"EUR","amount_cents":100,"invoice_id":"inv_ts_2"}' },
  ];
  const conv = client.conversation("conv_ts_turn");
  const results = await conv.runTurn(1, calls, { signal: withTimeout(30_000) });
  const again = await conv.awaitResult("toolu_rt_1", { signal: withTimeout(30_000) });
  assert.equal(again.turn_index, 1);
  assert.equal(again.ordinal, 1);
  assert.deepEqual(results.map((r) => r.tool_use_id), ["toolu_rt_0", "toolu_rt_1"]);
  for (const r of results) {
    assert.equal(r.type, "tool_result");
    assert.equal(r.is_error, undefined, r.content);
  }
  // Two identical calls in one turn are two payments (ordinals 0 and 1).
  assert.equal((await payments("inv_ts_2")).length, 2);
});

for (const viaReader of [false, true]) {
test(`a streamed turn retried after its stream broke pays once${viaReader ? " (through a ResultsReader)" : ""}`, async () => {
  const inv = viaReader ? "inv_ts_3r" : "inv_ts_3";
  const args = `{"invoice_id":"${inv}","amount_cents":700,"currency":"EUR"}`;
  const recorded = [
    // Attempt 0: the payment block completes and is dispatched, a second block is cut, then the stream fails.
    [
      { type: "message_start", message: { id: "msg_0" } },
      { type: "content_block_start", index: 0, content_block: { type: "tool_use", id: "toolu_st_0", name: "send_payment", input: {} } },
      { type: "content_block_delta", index: 0, delta: { type: "input_json_delta", partial_json: args.slice(0, 20) } },
      { type: "content_block_delta", index: 0, delta: { type: "input_json_delta", partial_json: args.slice(20) } },
      { type: "content_block_stop", index: 0 },
      { type: "content_block_start", index: 1, content_block: { type: "tool_use", id: "toolu_st_1", name: "send_payment", input: {} } },
      { type: "content_block_delta", index: 1, delta: { type: "input_json_delta", partial_json: '{"invoice_id":"inv_ts_4"' } },
      { type: "error", error: { type: "overloaded_error", message: "Overloaded" } },
    ],
    // Attempt 1: the same call under a new id, and the stream completes.
    [
      { type: "message_start", message: { id: "msg_1" } },
      { type: "content_block_start", index: 0, content_block: { type: "text", text: "" } },
      { type: "content_block_delta", index: 0, delta: { type: "text_delta", text: "Paying." } },
      { type: "content_block_stop", index: 0 },
      { type: "content_block_start", index: 1, content_block: { type: "tool_use", id: "toolu_st_2", name: "send_payment", input: {} } },
      { type: "content_block_delta", index: 1, delta: { type: "input_json_delta", partial_json: args } },
      { type: "content_block_stop", index: 1 },
      { type: "message_delta", delta: { stop_reason: "tool_use" } },
      { type: "message_stop" },
    ],
  ];
  async function* stream(attempt) {
    for (const ev of recorded[attempt]) yield ev;
  }
  const reader = viaReader ? await client.results() : undefined;
  let turn;
  try {
    turn = await streamTurn({ client, conversationId: viaReader ? "conv_ts_stream_r" : "conv_ts_stream", turnIndex: 0, stream, results: reader, signal: withTimeout(30_000) });
  } finally {
    reader?.close();
  }
  assert.equal(turn.attempts.length, 2);
  assert.deepEqual(turn.attempts[0].dispatched, ["toolu_st_0"]);
  assert.deepEqual(turn.attempts[0].notRun, [{ id: "toolu_st_1", name: "send_payment", note: NOT_RUN }]);
  assert.deepEqual(turn.content.map((b) => b.type), ["text", "tool_use"]);
  assert.deepEqual(turn.toolResults.map((r) => r.tool_use_id), ["toolu_st_2"]);
  assert.equal(turn.toolResults[0].is_error, undefined, turn.toolResults[0].content);
  assert.equal((await payments(inv)).length, 1);
  assert.equal((await payments("inv_ts_4")).length, 0);
});
}

test("one results reader serves many calls and drops what nobody expects", async () => {
  const jsm = await jetstreamManager(nc);
  const before = (await jsm.consumers.info(JOBS_STREAM, "toolq")) && (await jsm.streams.info("TOOLQ_RESULTS")).state.consumer_count;
  const reader = await client.results();
  try {
    const conv = client.conversation("conv_ts_reader");
    // An abandoned attempt: published, then given up; its result must not be delivered to anyone.
    const abandoned = reader.expect(["toolu_rd_abandoned"]);
    await conv.publish({ turnIndex: 0, tool: "send_payment", toolUseId: "toolu_rd_abandoned", args: '{"invoice_id":"inv_rd_0","amount_cents":1,"currency":"EUR"}' });
    abandoned.cancel();
    for (let i = 0; i < 60; i++) {
      const id = `toolu_rd_${i}`;
      const expected = reader.expect([id]);
      await conv.publish({ turnIndex: i % 30, tool: "send_payment", toolUseId: id, args: `{"invoice_id":"inv_rd_${i % 30}","amount_cents":1,"currency":"EUR"}` });
      const [r] = await expected.wait(withTimeout(30_000));
      assert.equal(r.tool_use_id, id);
      // Turn 0 repeats the abandoned attempt's call: either of the two may run first.
      if (i > 0) assert.equal(r.duplicate, i >= 30, id);
    }
    const during = (await jsm.streams.info("TOOLQ_RESULTS")).state.consumer_count;
    assert.ok(during <= before + 1, `${during} consumers on TOOLQ_RESULTS, ${before} before`);
  } finally {
    reader.close();
  }
  assert.equal((await payments("inv_rd_0")).length, 1);
});

test("a reader of every conversation gives an id expected in one conversation only that conversation's result", async () => {
  // Frameworks that number their calls reuse tool_use_ids across
  // conversations: conversation A's result for toolu_shared must not answer
  // the call conversation B expects under the same id.
  const reader = await client.results();
  try {
    const inB = reader.expect(["toolu_shared"], { conversationId: "conv_ts_shared_b" });
    const inA = reader.expect(["toolu_shared"], { conversationId: "conv_ts_shared_a" });
    await client.publish({ conversationId: "conv_ts_shared_a", turnIndex: 0, tool: "send_payment", toolUseId: "toolu_shared", args: '{"invoice_id":"inv_shared_a","amount_cents":1,"currency":"EUR"}' });
    const [a] = await inA.wait(withTimeout(30_000));
    assert.equal(a.conversation_id, "conv_ts_shared_a");
    await client.publish({ conversationId: "conv_ts_shared_b", turnIndex: 0, tool: "send_payment", toolUseId: "toolu_shared", args: '{"invoice_id":"inv_shared_b","amount_cents":1,"currency":"EUR"}' });
    const [b] = await inB.wait(withTimeout(30_000));
    assert.equal(b.conversation_id, "conv_ts_shared_b");
    assert.equal(b.key, callKey({ conversationId: "conv_ts_shared_b", turnIndex: 0, ordinal: 0, tool: "send_payment", args: '{"invoice_id":"inv_shared_b","amount_cents":1,"currency":"EUR"}' }));
  } finally {
    reader.close();
  }
});

test("a later answer to a call supersedes an earlier one for a reader from the start", async () => {
  // As after an indeterminate call resolved as not run and replayed: two
  // answers to one tool_use_id are in the results stream, the later one ok.
  const { jetstream } = await import("@nats-io/jetstream");
  const js = jetstream(nc);
  const base = { version: 1, key: "0".repeat(32), conversation_id: "conv_ts_later", turn_index: 0, ordinal: 0, tool: "send_payment", tool_use_id: "toolu_later", attempts: 1 };
  await js.publish("toolq.results.conv_ts_later", JSON.stringify({ ...base, status: "indeterminate", error: { code: "reset", message: "reset" } }), { msgID: "later-1" });
  await js.publish("toolq.results.conv_ts_later", JSON.stringify({ ...base, status: "ok", output: { ticket: "T-1" }, attempts: 2 }), { msgID: "later-2" });
  const r = await client.awaitResult("conv_ts_later", "toolu_later", { signal: withTimeout(30_000) });
  assert.equal(r.status, "ok");
  assert.deepEqual(r.output, { ticket: "T-1" });
});

test("lookup says whether a call already happened", async () => {
  const job = { conversationId: "conv_ts_lookup", turnIndex: 1, tool: "send_payment", toolUseId: "toolu_ts_lookup",
    args: '{"invoice_id":"inv_ts_lookup","amount_cents":100,"currency":"EUR"}' };
  const pub = await client.publish(job);
  await client.awaitResult(job.conversationId, job.toolUseId, { signal: withTimeout(30_000) });
  const done = await client.lookup(pub.key);
  assert.equal(done.state, "completed");
  assert.equal(done.first_tool_use_id, "toolu_ts_lookup");
  assert.ok(done.output && done.output.id, JSON.stringify(done));
  assert.equal((await client.lookup("0123456789abcdef0123456789abcdef")).state, "unknown");
  await assert.rejects(client.lookup("not a key"), (err) => err instanceof LookupError && err.code === "400");
});

test("lookup answers an in-flight call and an indeterminate one", async () => {
  const faults = (f) => fetch(`${sandboxURL}/v1/_faults`, { method: "POST", body: JSON.stringify(f) });
  try {
    await faults({ latency_ms: 3000 });
    const slow = { conversationId: "conv_ts_lookup2", turnIndex: 1, tool: "send_payment", toolUseId: "toolu_ts_slow",
      args: '{"invoice_id":"inv_ts_slow","amount_cents":100,"currency":"EUR"}' };
    const pub = await client.publish(slow);
    const flight = await waitFor("the call in flight", async () => {
      const l = await client.lookup(pub.key);
      return l.state === "in_flight" ? l : undefined;
    }, 10_000);
    assert.ok(flight.lease_remaining_ms > 0);
    await client.awaitResult(slow.conversationId, slow.toolUseId, { signal: withTimeout(30_000) });
    await faults({ latency_ms: 0, drop_after_effect_rate: 1 });
    const ticket = { conversationId: "conv_ts_lookup2", turnIndex: 2, tool: "create_ticket", toolUseId: "toolu_ts_ticket", args: '{"title":"t","body":"b"}' };
    const tpub = await client.publish(ticket);
    const r = await client.awaitResult(ticket.conversationId, ticket.toolUseId, { signal: withTimeout(30_000) });
    assert.equal(r.status, "indeterminate");
    const lost = await client.lookup(tpub.key);
    assert.equal(lost.state, "indeterminate");
    assert.ok(lost.error);
  } finally {
    await faults({ latency_ms: 0, drop_after_effect_rate: 0 });
  }
});

test("tools answers the registry as each API's tool definitions, as tools export prints them", async () => {
  for (const format of ["anthropic", "openai", "openai-responses", "mcp"]) {
    const got = await waitFor("the tool list service", () => client.tools(format), 10_000);
    const printed = JSON.parse(execFileSync(path.join(dir, "consumer"), ["tools", "export", "--format", format], { encoding: "utf8" }));
    assert.deepEqual(got, printed, format);
  }
  const anthropic = await client.tools("anthropic");
  assert.deepEqual(anthropic.map((t) => t.name), ["create_ticket", "search_orders", "send_payment"]);
  assert.equal(anthropic[2].input_schema.type, "object");
  assert.deepEqual(anthropic[2].input_schema.required, ["invoice_id", "amount_cents", "currency"]);
  const mcp = await client.tools("mcp");
  assert.deepEqual(mcp.map((t) => t.annotations.readOnlyHint), [false, true, false]);
  await assert.rejects(client.tools("gemini"), (err) => err instanceof ToolsError && err.code === "400");
});

test("tools with no consumer answering fails with NATS's no responders", async () => {
  // A NATS server of its own, with nothing serving the tool list.
  const bin = path.join(dir, "nats-server");
  execFileSync("go", ["build", "-o", bin, "github.com/nats-io/nats-server/v2"], { cwd: repo, stdio: "inherit" });
  const port = await freePort();
  const server = spawn(bin, ["-a", "127.0.0.1", "-p", String(port)], { stdio: "ignore" });
  try {
    const bare = await waitFor("the bare NATS server", () => connect({ servers: `127.0.0.1:${port}`, reconnect: false }));
    try {
      await assert.rejects(new Client(bare).tools("anthropic"), (err) => typeof err.isNoResponders === "function" && err.isNoResponders());
    } finally {
      await bare.close();
    }
  } finally {
    const done = new Promise((r) => server.once("exit", r));
    server.kill("SIGTERM");
    await done;
  }
});

test("a tenant's call: its own subject, key, results stream and lookup; the default tenant's same call runs apart", async () => {
  // The consumer serves tenant acme (--tenants acme) beside the default tenant.
  const acme = new Client(nc, { tenant: "acme" });
  const job = { conversationId: "conv_ts_tenant", turnIndex: 1, tool: "send_payment", args: '{"invoice_id":"inv_ts_tenant","amount_cents":700,"currency":"EUR"}' };
  const a = await acme.publish({ ...job, toolUseId: "toolu_ts_t1" });
  const ra = await acme.awaitResult(job.conversationId, "toolu_ts_t1", { signal: withTimeout(30_000) });
  const d = await client.publish({ ...job, toolUseId: "toolu_ts_t1" });
  const rd = await client.awaitResult(job.conversationId, "toolu_ts_t1", { signal: withTimeout(30_000) });
  assert.equal(a.key, callKey({ ...job, tenant: "acme" }));
  assert.equal(d.key, callKey(job));
  assert.notEqual(a.key, d.key);
  assert.equal(ra.status, "ok");
  assert.equal(ra.tenant, "acme");
  assert.equal(ra.key, a.key);
  assert.equal(rd.status, "ok");
  assert.equal(rd.tenant, undefined);
  assert.equal(rd.duplicate, false);
  assert.equal((await payments("inv_ts_tenant")).length, 2, "two tenants' identical calls are two calls");
  const jsm = await jetstreamManager(nc);
  const stored = await jsm.streams.getMessage(JOBS_STREAM, { seq: a.seq });
  assert.equal(stored.subject, "toolq.acme.jobs.send_payment");
  assert.equal(stored.json().tenant, "acme");
  assert.equal((await jsm.streams.info("TOOLQ_acme_RESULTS")).state.messages, 1);
  assert.equal((await acme.lookup(a.key)).state, "completed");
  assert.throws(() => new Client(nc, { tenant: "results" }), /tenant/);
});
