"""The conversation record, the results reader and play_turn, with a fake
client and a fake results subscription (no network)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from anthropic.types import (
    InputJSONDelta,
    RawContentBlockDeltaEvent,
    RawContentBlockStartEvent,
    RawContentBlockStopEvent,
    RawMessageStopEvent,
    ToolUseBlock,
)

import toolq
import toolq.anthropic
from toolq.client import Published, ResultsReader, ToolCall
from toolq.record import Conversation


class FakeMsg:
    def __init__(self, data: bytes) -> None:
        self.data = data


class FakeSub:
    def __init__(self) -> None:
        self.q: asyncio.Queue[FakeMsg] = asyncio.Queue()

    async def next_msg(self, timeout: Any = None) -> FakeMsg:
        return await self.q.get()

    async def unsubscribe(self) -> None:
        pass


class FakeClient:
    def __init__(self) -> None:
        self.jobs: list[toolq.Job] = []

    async def publish(self, job: toolq.Job) -> Published:
        key = toolq.call_key(
            conversation_id=job.conversation_id, turn_index=job.turn_index, tool=job.tool, ordinal=job.ordinal, args=job.args
        )
        self.jobs.append(job)
        return Published(key=key, stream="TOOLQ_JOBS", seq=len(self.jobs), duplicate=False)


def result(conv: str, tool_use_id: str, output: Any = "paid") -> bytes:
    return json.dumps(
        {
            "version": 1,
            "key": "0" * 32,
            "conversation_id": conv,
            "turn_index": 0,
            "ordinal": 0,
            "tool": "send_payment",
            "tool_use_id": tool_use_id,
            "status": "ok",
            "duplicate": False,
            "attempts": 1,
            "completed_at": "2025-01-01T00:00:00Z",
            "output": output,
        }
    ).encode()


def reader() -> tuple[ResultsReader, FakeSub]:
    r = ResultsReader()
    sub = FakeSub()
    r._sub = sub
    r._task = asyncio.create_task(r._read())
    return r, sub


async def test_commit_can_be_retried_after_a_timeout() -> None:
    """Go's Commit: 'ctx's error when ctx ends first (the turn can then be
    committed again)'. Python's first commit times out while awaiting the
    reader's future; wait_for cancels that future itself, so the result that
    then arrives is dropped and the retried commit raises CancelledError."""
    r, sub = reader()
    conv = Conversation(FakeClient(), r, "c-1")  # type: ignore[arg-type]
    turn = conv.next_turn()
    a = turn.attempt()
    await a.dispatch(ToolCall(tool_use_id="toolu_1", tool="send_payment", args='{"invoice_id":"i1"}'))
    with pytest.raises(asyncio.TimeoutError):
        await turn.commit(a, timeout=0.05)
    sub.q.put_nowait(FakeMsg(result("c-1", "toolu_1")))  # the result comes a moment later
    await asyncio.sleep(0.05)
    ct = await turn.commit(a, timeout=1)  # CancelledError here
    assert ct.results[0] is not None and ct.results[0].output == "paid"
    await r.close()


async def test_reader_does_not_hand_another_conversations_result() -> None:
    """The reader reads toolq.results.> and matches on tool_use_id alone: a
    result of conversation A resolves conversation B's wait for the same id
    (the same cached/replayed model response used in two conversations)."""
    r, sub = reader()
    [fut] = r.expect("toolu_same", conversation_id="conv-B")  # conversation B's call
    sub.q.put_nowait(FakeMsg(result("conv-A", "toolu_same", output="A's payment")))
    await asyncio.sleep(0.05)
    assert not fut.done() or fut.result().conversation_id == "conv-B", fut.result()
    await r.close()


def tool_use_events(calls: list[tuple[str, str]]) -> list[Any]:
    out: list[Any] = []
    for n, (tid, text) in enumerate(calls):
        out += [
            RawContentBlockStartEvent(
                type="content_block_start", index=n, content_block=ToolUseBlock(type="tool_use", id=tid, name="send_payment", input={})
            ),
            RawContentBlockDeltaEvent(
                type="content_block_delta", index=n, delta=InputJSONDelta(type="input_json_delta", partial_json=text)
            ),
            RawContentBlockStopEvent(type="content_block_stop", index=n),
        ]
    return [*out, RawMessageStopEvent(type="message_stop")]


async def test_a_call_without_a_key_is_not_a_stream_failure() -> None:
    """The model streams a legitimate call whose args have no key (an account
    number beyond 2^53). play_turn takes the CallKeyError of dispatch for a
    stream failure: it asks the model for the whole turn again (3 times),
    republishes the good call each time, and ends in StreamFailedError with
    nothing recorded: no tool_result the model could learn from."""
    r, sub = reader()
    client = FakeClient()
    conv = Conversation(client, r, "c-2")  # type: ignore[arg-type]
    streams = 0
    n = 0

    async def stream():  # type: ignore[no-untyped-def]
        nonlocal streams, n
        streams += 1
        n += 1
        for e in tool_use_events([(f"toolu_ok{n}", '{"invoice_id":"i1"}'), (f"toolu_big{n}", '{"account":12345678901234567890}')]):
            yield e

    async def answer() -> None:  # a consumer: answer every published job
        seen = 0
        while True:
            while seen < len(client.jobs):
                sub.q.put_nowait(FakeMsg(result("c-2", client.jobs[seen].tool_use_id)))
                seen += 1
            await asyncio.sleep(0.01)

    t = asyncio.create_task(answer())
    try:
        played = await toolq.anthropic.play_turn(conv, stream, timeout=2)
        assert len(played.tool_results) == 2 and played.tool_results[1].get("is_error")
    finally:
        t.cancel()
        print("model streams:", streams, "jobs published:", len(client.jobs))
        await r.close()
    assert streams == 1


async def test_input_given_whole_in_content_block_start_is_not_dropped() -> None:
    """A tool_use block whose input arrives in content_block_start (no
    input_json_delta: a gateway or replay that sends the block whole) is
    dispatched with args '{}': every such call gets the key of '{}'."""
    r, sub = reader()
    client = FakeClient()
    conv = Conversation(client, r, "c-3")  # type: ignore[arg-type]

    async def stream():  # type: ignore[no-untyped-def]
        for e in [
            RawContentBlockStartEvent(
                type="content_block_start",
                index=0,
                content_block=ToolUseBlock(
                    type="tool_use", id="toolu_w", name="send_payment", input={"invoice_id": "i9", "amount_cents": 5}
                ),
            ),
            RawContentBlockStopEvent(type="content_block_stop", index=0),
            RawMessageStopEvent(type="message_stop"),
        ]:
            yield e

    async def answer() -> None:
        while not client.jobs:
            await asyncio.sleep(0.01)
        sub.q.put_nowait(FakeMsg(result("c-3", "toolu_w")))

    t = asyncio.create_task(answer())
    await toolq.anthropic.play_turn(conv, stream, timeout=2)
    t.cancel()
    await r.close()
    assert toolq.canonicalize(client.jobs[0].args) == '{"amount_cents":5,"invoice_id":"i9"}'


async def test_a_tool_use_truncated_by_max_tokens_is_recorded_not_retried() -> None:
    """stop_reason max_tokens: the API closes the tool_use block (content_block_stop)
    with its input JSON cut short, then message_stop. dispatch raises
    JSONSyntaxError, which play_turn takes for a stream failure: the model is
    asked again (and hits max_tokens again) until StreamFailedError; the good
    call before it is published once per attempt, and nothing is recorded."""
    r, sub = reader()
    client = FakeClient()
    conv = Conversation(client, r, "c-4")  # type: ignore[arg-type]
    streams = 0

    async def stream():  # type: ignore[no-untyped-def]
        nonlocal streams
        streams += 1
        for e in tool_use_events([(f"toolu_a{streams}", '{"invoice_id":"i1"}'), (f"toolu_b{streams}", '{"invoice_id":"i2","memo":"lo')]):
            yield e

    async def answer() -> None:
        seen = 0
        while True:
            while seen < len(client.jobs):
                sub.q.put_nowait(FakeMsg(result("c-4", client.jobs[seen].tool_use_id)))
                seen += 1
            await asyncio.sleep(0.01)

    t = asyncio.create_task(answer())
    try:
        played = await toolq.anthropic.play_turn(conv, stream, timeout=2)
        assert played.tool_results[1].get("is_error")
    finally:
        t.cancel()
        await r.close()
    assert streams == 1
