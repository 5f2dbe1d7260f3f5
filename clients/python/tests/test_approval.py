"""Calls that wait for a person's approval: what the model reads of each
result (the vectors the Go and TypeScript clients check too), and end to end
against a consumer whose one tool, pay, needs approval: the pending result at
once, the final one when asked for, the reader that gives both, the record,
the lookup by key, and the integrations."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import nats
import pytest
from agents.tool_context import ToolContext
from conftest import ApprovalConsumer

import toolq
import toolq.openai_agents

VECTORS = Path(__file__).resolve().parents[3] / "jobs" / "testdata" / "tool_results.jsonl"


def test_each_results_tool_result_is_the_one_the_go_client_gives() -> None:
    rows = [json.loads(line) for line in VECTORS.read_text(encoding="utf-8").splitlines() if line]
    assert len(rows) >= 10
    for v in rows:
        r = toolq.Result.from_json(json.dumps(v["result"]))
        tr = r.tool_result()
        assert tr["tool_use_id"] == r.tool_use_id, v["name"]
        assert tr.get("is_error", False) == v["is_error"], v["name"]
        # A pending call's content is its text; the others' are JSON.
        if r.status == "awaiting_approval":
            assert tr["content"] == v["content"], v["name"]
        else:
            assert json.loads(tr["content"]) == v["content"], v["name"]


def test_a_pending_result_never_supersedes_a_final_one() -> None:
    row = json.loads(VECTORS.read_text(encoding="utf-8").splitlines()[0])["result"]

    def of(status: str) -> toolq.Result:
        return toolq.Result.from_json(json.dumps({**row, "status": status}))

    pending, ok, denied = of("awaiting_approval"), of("ok"), of("denied")
    assert toolq.supersedes(None, pending)
    assert toolq.supersedes(pending, ok)
    assert toolq.supersedes(pending, pending)
    assert not toolq.supersedes(ok, pending)
    assert not toolq.supersedes(denied, pending)
    assert not toolq.is_final("awaiting_approval") and toolq.is_final("expired")


async def connect(c: ApprovalConsumer) -> toolq.Client:
    nc = await nats.connect(c.nats_url)
    client = toolq.Client(nc)
    # The consumer creates the streams and its pull consumer as it starts.
    for _ in range(100):
        try:
            await client.js.consumer_info(toolq.JOBS_STREAM, "toolq")
            await client.js.stream_info(toolq.RESULTS_STREAM)
            return client
        except Exception:
            await asyncio.sleep(0.1)
    raise AssertionError("the consumer created no streams")


async def decide(client: toolq.Client, key: str, decision: str) -> None:
    """A finance approver's decision, over NATS as an approval UI sends it."""
    body = {"key": key, "decision": decision, "by": "alice", "reason": "invoice 42"}
    msg = await client.nc.request("toolq.decide.finance", json.dumps(body).encode(), timeout=10)
    assert not (msg.headers or {}).get("Nats-Service-Error-Code"), msg.data


def pay(tool_use_id: str, cents: int) -> toolq.ToolCall:
    return toolq.ToolCall(tool_use_id=tool_use_id, tool="pay", args={"amount_cents": cents})


async def test_a_call_awaiting_approval_is_answered_at_once_and_final_waits_for_the_decision(approval_consumer: ApprovalConsumer) -> None:
    client = await connect(approval_consumer)
    try:
        [tr] = await client.run_turn("py-appr", 1, [pay("toolu_py_appr", 1)], timeout=30)
        assert "is_error" not in tr, "a pending call is not an error"
        pending = await client.await_result("py-appr", "toolu_py_appr", timeout=30)
        assert pending.status == "awaiting_approval" and pending.approval is not None
        assert pending.approval.group == "finance" and pending.approval.args == {"amount_cents": 1}
        assert tr["content"] == pending.approval_text()
        assert tr["content"].startswith(f"awaiting approval by a person (key {pending.key}, expires 20")
        assert tr["content"].endswith("Z); the call has not run")

        looked = await client.lookup(pending.key)
        assert looked.state == "awaiting_approval" and looked.approval is not None
        assert looked.approval.args_digest == pending.approval.args_digest

        final = asyncio.create_task(client.await_result("py-appr", "toolu_py_appr", timeout=30, final=True))
        await asyncio.sleep(0.3)
        assert not final.done(), "final=True returned before the decision"
        assert approval_consumer.ran == [], "the call ran before it was approved"
        await decide(client, pending.key, "approve")
        r = await final
        assert r.status == "ok" and r.output == {"paid": True}
        assert r.approval is not None and r.approval.decision == "approved" and r.approval.decided_by == "alice"
        assert len(approval_consumer.ran) == 1
        assert (await client.lookup(pending.key)).state == "completed"
    finally:
        await client.nc.close()


async def test_a_reader_that_gave_the_pending_result_gives_the_final_one_too(approval_consumer: ApprovalConsumer) -> None:
    client = await connect(approval_consumer)
    reader = await client.results()
    try:
        ran = len(approval_consumer.ran)
        [future] = reader.expect("toolu_py_deny", conversation_id="py-deny")
        await client.publish(toolq.Job("py-deny", 1, "pay", "toolu_py_deny", {"amount_cents": 2}))
        pending = await asyncio.wait_for(future, 30)
        assert pending.status == "awaiting_approval"
        with pytest.raises(asyncio.TimeoutError):
            await reader.wait("toolu_py_deny", conversation_id="py-deny", final=True, timeout=0.3)
        await decide(client, pending.key, "deny")
        [denied] = await reader.wait("toolu_py_deny", conversation_id="py-deny", final=True, timeout=30)
        assert denied.status == "denied"
        tr = denied.tool_result()
        assert tr["is_error"] is True
        assert json.loads(tr["content"]) == {
            "status": "denied",
            "error": {"code": "approval_denied", "message": "denied by alice: invoice 42; the call did not run"},
        }
        with pytest.raises(ValueError):  # its final result taken, the id is no longer expected
            await reader.wait("toolu_py_deny", conversation_id="py-deny")
        assert len(approval_consumer.ran) == ran, "the denied call never ran"
    finally:
        await reader.close()
        await client.nc.close()


async def test_the_record_shows_a_pending_approval_and_then_the_denial(approval_consumer: ApprovalConsumer) -> None:
    client = await connect(approval_consumer)
    reader = await client.results()
    try:
        conv = toolq.Conversation(client, reader, "py-record-appr")
        turn = conv.next_turn()
        a = turn.attempt()
        await a.dispatch(pay("toolu_py_rec0", 3))
        ct = await turn.commit(a, timeout=30)
        assert "is_error" not in ct.tool_results[0]
        assert ct.tool_results[0]["content"].startswith("awaiting approval by a person")

        nxt = conv.next_turn()
        b = nxt.attempt()
        await b.dispatch(pay("toolu_py_rec1", 4))
        committing = asyncio.create_task(nxt.commit(b, timeout=30, final=True))
        r = await client.await_result("py-record-appr", "toolu_py_rec1", timeout=30)
        assert r.status == "awaiting_approval"
        await decide(client, r.key, "deny")
        ct = await committing
        assert ct.tool_results[0]["is_error"] is True
        assert "denied by alice: invoice 42; the call did not run" in ct.tool_results[0]["content"]
        conv.check()
    finally:
        await reader.close()
        await client.nc.close()


@dataclass
class Run:
    conversation_id: str
    turn_index: int


async def test_the_openai_agents_tool_answers_a_pending_call_with_its_text(approval_consumer: ApprovalConsumer) -> None:
    client = await connect(approval_consumer)
    try:
        schema: dict[str, Any] = {"type": "object", "properties": {"amount_cents": {"type": "integer"}}, "additionalProperties": False}
        tool = toolq.openai_agents.through_toolq(
            client,
            name="pay",
            description="Pay.",
            params_json_schema=schema,
            conversation=lambda c: (c.context.conversation_id, c.context.turn_index),
            strict_json_schema=False,
        )
        args = '{"amount_cents":5}'
        run = Run("py-agents-appr", 1)
        out = await tool.on_invoke_tool(ToolContext(context=run, tool_name="pay", tool_call_id="call_appr", tool_arguments=args), args)
        assert out.startswith("awaiting approval by a person (key ") and out.endswith("; the call has not run")
    finally:
        await client.nc.close()
