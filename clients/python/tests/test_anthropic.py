"""The chapter's scenario with the Anthropic SDK's own stream event types
(no network): a turn whose stream is cut after one call was dispatched and
while another was still streaming, then retried; against a real consumer."""

from __future__ import annotations

import json

import nats
from anthropic.types import (
    InputJSONDelta,
    RawContentBlockDeltaEvent,
    RawContentBlockStartEvent,
    RawContentBlockStopEvent,
    RawMessageStopEvent,
    TextBlock,
    TextDelta,
    ToolUseBlock,
)
from conftest import Consumer
from test_client import connect

import toolq
import toolq.anthropic


def events(calls: list[tuple[str, dict]], *, cut_in_call: int | None = None) -> list:
    """A response: a text block, then one tool_use block per call, its input
    streamed in two pieces; cut_in_call stops the stream inside that call."""
    out: list = [
        RawContentBlockStartEvent(type="content_block_start", index=0, content_block=TextBlock(type="text", text="")),
        RawContentBlockDeltaEvent(type="content_block_delta", index=0, delta=TextDelta(type="text_delta", text="Paying.")),
        RawContentBlockStopEvent(type="content_block_stop", index=0),
    ]
    for n, (tool_use_id, args) in enumerate(calls, start=1):
        text = json.dumps(args)
        out.append(
            RawContentBlockStartEvent(
                type="content_block_start",
                index=n,
                content_block=ToolUseBlock(type="tool_use", id=tool_use_id, name="send_payment", input={}),
            )
        )
        out.append(
            RawContentBlockDeltaEvent(
                type="content_block_delta", index=n, delta=InputJSONDelta(type="input_json_delta", partial_json=text[:10])
            )
        )
        if cut_in_call == n - 1:
            out.append(ConnectionResetError("stream cut"))
            return out
        out.append(
            RawContentBlockDeltaEvent(
                type="content_block_delta", index=n, delta=InputJSONDelta(type="input_json_delta", partial_json=text[10:])
            )
        )
        out.append(RawContentBlockStopEvent(type="content_block_stop", index=n))
    out.append(RawMessageStopEvent(type="message_stop"))
    return out


async def test_a_turn_cut_after_dispatch_and_retried_makes_each_payment_once(consumer: Consumer) -> None:
    client = await connect(consumer)
    reader = await client.results()
    try:
        conversation = toolq.Conversation(client, reader, "py-anthropic")
        a = {"invoice_id": "inv_py_anth_a", "amount_cents": 500, "currency": "EUR"}
        b = {"invoice_id": "inv_py_anth_b", "amount_cents": 700, "currency": "EUR"}
        responses = [
            events([("toolu_anth_a1", a), ("toolu_anth_b1", b)], cut_in_call=1),  # a dispatched, b cut mid-stream
            events([("toolu_anth_a2", a), ("toolu_anth_b2", b)]),  # the model's retry: new ids
        ]

        def stream():
            async def gen():
                for e in responses.pop(0):
                    if isinstance(e, Exception):
                        raise e
                    yield e

            return gen()

        played = await toolq.anthropic.play_turn(conversation, stream, timeout=30)
        assert [r.dispatched for r in played.attempts] == [["toolu_anth_a1"], ["toolu_anth_a2", "toolu_anth_b2"]]
        assert played.attempts[0].not_run == ["toolu_anth_b1"] and played.attempts[0].error
        assert [c["type"] for c in played.content] == ["text", "tool_use", "tool_use"]
        assert [r["tool_use_id"] for r in played.tool_results] == ["toolu_anth_a2", "toolu_anth_b2"]
        assert not any(r.get("is_error") for r in played.tool_results)
        # The retried call and the first attempt's are one call (whichever
        # the consumer claimed first ran it): one key, one payment.
        assert played.committed.results[0] is not None
        assert played.committed.results[0].key == toolq.call_key(conversation_id="py-anthropic", turn_index=0, tool="send_payment", args=a)
        assert len(consumer.payments("inv_py_anth_a")) == 1
        assert len(consumer.payments("inv_py_anth_b")) == 1
        assert conversation.not_run == 1
        conversation.check()
    finally:
        await reader.close()
        await client.nc.close()


async def test_a_call_cut_in_the_committed_attempt_is_recorded_not_run(consumer: Consumer) -> None:
    nc = await nats.connect(consumer.nats_url)
    client = toolq.Client(nc)
    reader = await client.results()
    try:
        conversation = toolq.Conversation(client, reader, "py-anthropic-cut")
        turn = conversation.next_turn()
        attempt = turn.attempt()
        await attempt.dispatch(
            toolq.ToolCall("toolu_cut_a", "send_payment", '{"invoice_id":"inv_py_cut","amount_cents":1,"currency":"EUR"}')
        )
        attempt.cut(toolq.ToolCall("toolu_cut_b", "send_payment", "{}"))
        committed = await turn.commit(attempt, timeout=30)
        assert committed.tool_results[1] == {
            "type": "tool_result",
            "tool_use_id": "toolu_cut_b",
            "content": json.dumps(toolq.NOT_RUN),
            "is_error": True,
        }
        conversation.check()
    finally:
        await reader.close()
        await nc.close()
