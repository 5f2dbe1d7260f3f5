// streamTurn on recorded event sequences, with a client that records what
// it is asked instead of a broker.
import { test } from "node:test";
import assert from "node:assert/strict";
import { streamTurn, NOT_RUN, callKey } from "../dist/index.js";

function fakeClient() {
  const published = [];
  return {
    published,
    async resultsCursor() {
      return 1;
    },
    async publish(job) {
      published.push(job);
      return { key: callKey(job), stream: "TOOLQ_JOBS", seq: published.length, duplicate: false };
    },
    async awaitResults(conversationId, ids) {
      return new Map(ids.map((id) => [id, { tool_use_id: id, status: "ok", output: { for: id } }]));
    },
  };
}

const toolUse = (index, id, json) => [
  { type: "content_block_start", index, content_block: { type: "tool_use", id, name: "send_payment", input: {} } },
  ...(json === undefined ? [] : [{ type: "content_block_delta", index, delta: { type: "input_json_delta", partial_json: json } }]),
  { type: "content_block_stop", index },
];

test("identical calls of one response get ordinals 0 and 1, in block order", async () => {
  const client = fakeClient();
  const events = [{ type: "message_start" }, ...toolUse(0, "toolu_a", '{"amount_cents":1}'), ...toolUse(1, "toolu_b", '{ "amount_cents" : 1.0 }'), ...toolUse(2, "toolu_c"), { type: "message_stop" }];
  const turn = await streamTurn({ client, conversationId: "c1", turnIndex: 4, stream: async function* () { yield* events; } });
  assert.deepEqual(client.published.map((j) => [j.toolUseId, j.ordinal, j.turnIndex]), [["toolu_a", 0, 4], ["toolu_b", 1, 4], ["toolu_c", 0, 4]]);
  assert.deepEqual(turn.toolResults.map((r) => [r.tool_use_id, r.content]), [
    ["toolu_a", '{"for":"toolu_a"}'],
    ["toolu_b", '{"for":"toolu_b"}'],
    ["toolu_c", '{"for":"toolu_c"}'],
  ]);
  assert.deepEqual(turn.content[2], { type: "tool_use", id: "toolu_c", name: "send_payment", input: {} });
});

test("a stream that throws is retried; a cut block is never published", async () => {
  const client = fakeClient();
  async function* stream(attempt) {
    yield* toolUse(0, `toolu_${attempt}_0`, '{"amount_cents":1}');
    yield { type: "content_block_start", index: 1, content_block: { type: "tool_use", id: `toolu_${attempt}_1`, name: "send_payment", input: {} } };
    if (attempt < 2) throw new Error("socket hang up");
    yield { type: "content_block_stop", index: 1 };
    yield { type: "message_stop" };
  }
  const turn = await streamTurn({ client, conversationId: "c1", turnIndex: 0, stream });
  assert.equal(turn.attempts.length, 3);
  for (const [n, a] of turn.attempts.slice(0, 2).entries()) {
    assert.equal(a.error, "socket hang up");
    assert.deepEqual(a.notRun, [{ id: `toolu_${n}_1`, name: "send_payment", note: NOT_RUN }]);
  }
  assert.ok(!client.published.some((j) => j.toolUseId.endsWith("_1") && !j.toolUseId.startsWith("toolu_2")));
  assert.deepEqual(turn.toolResults.map((r) => r.tool_use_id), ["toolu_2_0", "toolu_2_1"]);
});

test("after maxAttempts failed streams the turn is given up with the last error", async () => {
  const client = fakeClient();
  async function* stream() {
    yield { type: "error", error: { type: "overloaded_error", message: "Overloaded" } };
  }
  await assert.rejects(streamTurn({ client, conversationId: "c1", turnIndex: 0, stream, maxAttempts: 2 }), /2 attempts failed; last: overloaded_error: Overloaded/);
  assert.equal(client.published.length, 0);
});
