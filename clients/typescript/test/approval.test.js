// Calls that wait for a person's approval: what the model reads of each
// result (the vectors the Go and Python clients check too), and end to end
// against a consumer whose registry's one tool, pay, needs approval: the
// pending result at once, the final one when asked for, the reader that
// gives both, and the lookup by key.
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { spawn, execFileSync } from "node:child_process";
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { createServer as createHTTPServer } from "node:http";
import { createServer } from "node:net";
import { tmpdir } from "node:os";
import { fileURLToPath } from "node:url";
import path from "node:path";
import { connect } from "@nats-io/transport-node";
import { jetstreamManager } from "@nats-io/jetstream";
import { Client, JOBS_STREAM, toToolResult, approvalText, supersedes, isFinal } from "../dist/index.js";

const repo = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "../../..");

test("each result's tool_result is the one the Go client gives (jobs/testdata/tool_results.jsonl)", () => {
  const rows = readFileSync(path.join(repo, "jobs/testdata/tool_results.jsonl"), "utf8")
    .split("\n")
    .filter((l) => l !== "")
    .map((l) => JSON.parse(l));
  assert.ok(rows.length >= 10);
  for (const v of rows) {
    const tr = toToolResult(v.result);
    assert.equal(tr.tool_use_id, v.result.tool_use_id, v.name);
    assert.equal(tr.is_error ?? false, v.is_error, v.name);
    // A pending call's content is its text; the others' are JSON.
    if (v.result.status === "awaiting_approval") assert.equal(tr.content, v.content, v.name);
    else assert.deepEqual(JSON.parse(tr.content), v.content, v.name);
  }
});

test("a pending result never supersedes a final one", () => {
  const pending = { status: "awaiting_approval" };
  const ok = { status: "ok" };
  assert.equal(supersedes(undefined, pending), true);
  assert.equal(supersedes(pending, ok), true);
  assert.equal(supersedes(pending, pending), true);
  assert.equal(supersedes(ok, pending), false);
  assert.equal(supersedes({ status: "denied" }, pending), false);
  assert.equal(isFinal("awaiting_approval"), false);
  assert.equal(approvalText(ok), "");
});

let dir, consumer, nc, client, exited, http;
let runs = 0;

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
    if (exited !== undefined) throw new Error(`the consumer exited (${exited}) before ${what}`);
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
  dir = mkdtempSync(path.join(tmpdir(), "toolq-ts-approval-"));
  const bin = path.join(dir, "consumer");
  execFileSync("go", ["build", "-o", bin, "./cmd/consumer"], { cwd: repo, stdio: "inherit" });
  // The tool's downstream: counts the calls that ran.
  http = createHTTPServer((req, res) => {
    runs++;
    req.resume();
    res.writeHead(200, { "content-type": "application/json" }).end('{"paid":true}');
  });
  await new Promise((r) => http.listen(0, "127.0.0.1", r));
  const tools = path.join(dir, "tools.yaml");
  writeFileSync(
    tools,
    `tools:
  - name: pay
    class: keyed_write
    schema: {type: object, properties: {amount_cents: {type: integer}}}
    approval: {group: finance, ttl: 1h}
    http: {method: POST, url: "http://127.0.0.1:${http.address().port}/pay"}
`,
  );
  const natsPort = await freePort();
  consumer = spawn(bin, ["--data-dir", path.join(dir, "data"), "--nats-listen", `127.0.0.1:${natsPort}`, "--tools", tools, "--log-level", "warn"], {
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
  http?.close();
  if (dir) rmSync(dir, { recursive: true, force: true });
});

/** A finance approver's decision, over NATS as an approval UI sends it. */
async function decide(key, decision) {
  const msg = await nc.request("toolq.decide.finance", JSON.stringify({ key, decision, by: "alice", reason: "invoice 42" }), { timeout: 10_000 });
  assert.equal(msg.headers?.get("Nats-Service-Error-Code") ?? "", "", msg.string());
}

const pay = (toolUseId, cents) => ({ toolUseId, tool: "pay", args: { amount_cents: cents } });

test("a call awaiting approval is answered at once; final: true waits for the decision; lookup shows it pending", async () => {
  const [tr] = await client.runTurn("conv_ts_appr", 1, [pay("toolu_ts_appr", 1)], { signal: AbortSignal.timeout(30_000) });
  assert.equal(tr.is_error, undefined, "a pending call is not an error");
  const pending = await client.awaitResult("conv_ts_appr", "toolu_ts_appr", { signal: AbortSignal.timeout(30_000) });
  assert.equal(pending.status, "awaiting_approval");
  assert.equal(pending.approval.group, "finance");
  assert.deepEqual(pending.approval.args, { amount_cents: 1 });
  const expires = new Date(pending.approval.expires_at).toISOString().replace(/\.\d{3}Z$/, "Z");
  assert.equal(tr.content, `awaiting approval by a person (key ${pending.key}, expires ${expires}); the call has not run`);

  const l = await client.lookup(pending.key);
  assert.equal(l.state, "awaiting_approval");
  assert.equal(l.approval.args_digest, pending.approval.args_digest);

  let settled = false;
  const final = client.awaitResult("conv_ts_appr", "toolu_ts_appr", { final: true, signal: AbortSignal.timeout(30_000) }).finally(() => (settled = true));
  await new Promise((r) => setTimeout(r, 300));
  assert.equal(settled, false, "final: true returned before the decision");
  assert.equal(runs, 0, "the call ran before it was approved");
  await decide(pending.key, "approve");
  const r = await final;
  assert.equal(r.status, "ok");
  assert.deepEqual(r.output, { paid: true });
  assert.equal(r.approval.decision, "approved");
  assert.equal(r.approval.decided_by, "alice");
  assert.equal(runs, 1);
  assert.equal((await client.lookup(pending.key)).state, "completed");
});

test("a reader that gave the pending result gives the final one too", async () => {
  const reader = await client.results();
  try {
    const expected = reader.expect(["toolu_ts_deny"]);
    await client.publish({ conversationId: "conv_ts_deny", turnIndex: 1, ...pay("toolu_ts_deny", 2) });
    const [pending] = await expected.wait(AbortSignal.timeout(30_000));
    assert.equal(pending.status, "awaiting_approval");
    await assert.rejects(expected.wait({ final: true, signal: AbortSignal.timeout(300) }), (err) => err.name === "TimeoutError");
    await decide(pending.key, "deny");
    const [denied] = await expected.wait({ final: true, signal: AbortSignal.timeout(30_000) });
    assert.equal(denied.status, "denied");
    const tr = toToolResult(denied);
    assert.equal(tr.is_error, true);
    assert.deepEqual(JSON.parse(tr.content), {
      status: "denied",
      error: { code: "approval_denied", message: "denied by alice: invoice 42; the call did not run" },
    });
    const [latest] = await expected.wait(AbortSignal.timeout(1000));
    assert.equal(latest.status, "denied", "a wait without final after the final result gives the final result");
    assert.equal(runs, 1, "the denied call never ran");
  } finally {
    reader.close();
  }
});
