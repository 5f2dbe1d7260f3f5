"""toolq wired to a streaming response of the Anthropic Messages API (the
``anthropic`` package's stream events): each tool_use block is dispatched
the moment its content block stops, and a stream that fails is retried as a
whole turn. The model then emits the same calls with new tool_use_ids; toolq
runs each call once and answers every id. A block the failure cut before it
completed is recorded as not run, and never sent.

    async def stream():
        async with anthropic_client.messages.stream(model=..., messages=..., tools=...) as s:
            async for event in s:
                yield event

    played = await toolq.anthropic.play_turn(conversation, stream)
    messages += [{"role": "assistant", "content": played.content},
                 {"role": "user", "content": played.tool_results}]

The events are read by their fields (``type``, ``index``, ``content_block``,
``delta``), so the SDK's objects and plain dicts of the same shape both work.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from toolq.client import ToolCall
from toolq.key import CallKeyError
from toolq.record import NOT_RUN, CommittedTurn, Conversation

__all__ = ["NOT_RUN", "AttemptReport", "PlayedTurn", "StreamFailedError", "play_turn"]


class StreamFailedError(RuntimeError):
    """Every attempt of the turn failed."""


@dataclass
class AttemptReport:
    """What became of one attempt of the turn."""

    dispatched: list[str] = field(default_factory=list)
    #: tool_use ids of calls toolq cannot run (their args have no key): never sent, recorded as rejected.
    refused: list[str] = field(default_factory=list)
    #: tool_use ids whose blocks the failure cut: never sent to toolq.
    not_run: list[str] = field(default_factory=list)
    #: Why it was abandoned; None for the attempt that completed.
    error: str | None = None


@dataclass
class PlayedTurn:
    """A turn whose stream completed, committed to the conversation."""

    #: The assistant message content of the completed attempt (text and tool_use blocks).
    content: list[dict[str, Any]]
    #: One tool_result per tool_use block of content, in order.
    tool_results: list[dict[str, Any]]
    committed: CommittedTurn
    #: Every attempt, the abandoned ones first.
    attempts: list[AttemptReport]


def _get(obj: Any, name: str, default: Any = None) -> Any:
    if isinstance(obj, dict):
        return obj.get(name, default)
    return getattr(obj, name, default)


async def play_turn(
    conversation: Conversation,
    stream: Callable[[], AsyncIterable[Any]],
    *,
    attempts: int = 3,
    timeout: float | None = None,
    final: bool = False,
) -> PlayedTurn:
    """Plays the conversation's next turn from stream() (called again for
    each retry), dispatching tool_use blocks as they complete, and commits
    the attempt whose stream completes. A call awaiting a person's approval
    gets its pending tool_result unless final (Turn.commit). Raises
    StreamFailedError when every one of attempts fails."""
    turn = conversation.next_turn()
    reports: list[AttemptReport] = []
    for _ in range(attempts):
        attempt = turn.attempt()
        report = AttemptReport()
        reports.append(report)
        blocks: dict[int, dict[str, Any]] = {}  # by index, as the stream builds them
        order: list[int] = []
        done: set[int] = set()
        try:
            async for event in stream():
                kind = _get(event, "type")
                if kind == "content_block_start":
                    i, cb = _get(event, "index"), _get(event, "content_block")
                    if _get(cb, "type") == "tool_use":
                        # The input as streamed (input_json_delta); a block
                        # given whole carries it here instead.
                        given = _get(cb, "input")
                        blocks[i] = {"type": "tool_use", "id": _get(cb, "id"), "name": _get(cb, "name"), "json": "", "given": given}
                    elif _get(cb, "type") == "text":
                        blocks[i] = {"type": "text", "text": _get(cb, "text", "")}
                    else:
                        continue
                    order.append(i)
                elif kind == "content_block_delta":
                    b, delta = blocks.get(_get(event, "index")), _get(event, "delta")
                    if b is None:
                        continue
                    if _get(delta, "type") == "input_json_delta":
                        b["json"] += _get(delta, "partial_json", "")
                    elif _get(delta, "type") == "text_delta":
                        b["text"] += _get(delta, "text", "")
                elif kind == "content_block_stop":
                    i = _get(event, "index")
                    b = blocks.get(i)
                    if b is None:
                        continue
                    done.add(i)
                    if b["type"] == "tool_use":
                        # The input exactly as streamed: its key is that text's.
                        args = b["json"] if b["json"] else (b["given"] if isinstance(b["given"], Mapping) else "{}")
                        b["input"] = args
                        try:
                            await attempt.dispatch(ToolCall(tool_use_id=b["id"], tool=b["name"], args=args))
                        except CallKeyError as e:
                            # A call toolq cannot run (no key: an integer beyond
                            # 2^53, input cut short by max_tokens): recorded as
                            # refused, not a reason to ask the model again.
                            report.refused.append(b["id"])
                            b["refused"] = str(e)
                            continue
                        report.dispatched.append(b["id"])
                elif kind == "error":
                    raise RuntimeError(f"stream error: {_get(_get(event, 'error'), 'message', event)}")
                elif kind == "message_stop":
                    break
            else:
                raise RuntimeError("the stream ended without message_stop")
        except Exception as e:
            for i in order:
                b = blocks[i]
                if b["type"] == "tool_use" and i not in done:
                    attempt.cut(ToolCall(tool_use_id=b["id"], tool=b["name"], args="{}"))
                    report.not_run.append(b["id"])
            report.error = str(e)
            attempt.abandon()
            continue
        committed = await turn.commit(attempt, timeout=timeout, final=final)
        content: list[dict[str, Any]] = []
        for i in order:
            b = blocks[i]
            if b["type"] == "text":
                content.append({"type": "text", "text": b["text"]})
            else:
                given = b.get("input", "{}")
                try:
                    value = json.loads(given) if isinstance(given, str) else dict(given)
                except ValueError:
                    value = {}  # input cut short: the record says it was refused
                content.append({"type": "tool_use", "id": b["id"], "name": b["name"], "input": value})
        return PlayedTurn(content=content, tool_results=committed.tool_results, committed=committed, attempts=reports)
    raise StreamFailedError(f"every one of {attempts} attempts failed: {reports[-1].error}")
