"""toolq in a LangGraph ``ToolNode``: write tools go through toolq, keyed on
what the call is (the thread, the assistant turn, the tool, its ordinal among
identical calls of the turn, its canonical args), not on where it sits, so
that a resumed, replayed or re-planned graph does not repeat an effect.

    node = ToolNode(tools, awrap_tool_call=toolq.langgraph.through_toolq(client, write_tools={"send_payment"}))

A call to a tool in ``write_tools`` is published as a job on
``toolq.jobs.<tool>`` (a consumer runs it, from its registry) and answered
with its result as the ToolMessage; every other call runs as the node would
run it. The conversation is the thread (``configurable.thread_id``; one that is
not a valid conversation id, such as an e-mail, is ``lg-`` and a digest of it),
the turn the index of the assistant message among the thread's assistant
messages.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Awaitable, Callable, Collection
from typing import Any

from langchain_core.messages import AIMessage, ToolMessage

from toolq.client import Client, Job, Result
from toolq.key import canonicalize

__all__ = ["through_toolq"]

_CONVERSATION = re.compile(r"[A-Za-z0-9_:-]{1,128}")

Execute = Callable[[Any], Awaitable[Any]]


def _messages(state: Any) -> list[Any]:
    if isinstance(state, dict):
        return list(state.get("messages", []))
    if isinstance(state, list):
        return state
    return list(getattr(state, "messages", []))


def _place(state: Any, tool_call_id: str) -> tuple[int, list[Any]]:
    """The turn index of the assistant message holding the tool call, and
    that message's tool calls."""
    # From the last message back: providers that number tool calls per
    # message (call_0, …) reuse ids across turns, and the call being run is
    # the latest message's.
    assistant = [m for m in _messages(state) if isinstance(m, AIMessage)]
    for turn in range(len(assistant) - 1, -1, -1):
        if any(tc.get("id") == tool_call_id for tc in assistant[turn].tool_calls):
            return turn, list(assistant[turn].tool_calls)
    raise LookupError(f"toolq: no assistant message of the state holds tool call {tool_call_id}")


def _thread(request: Any) -> str:
    """The conversation of the graph's thread: its thread_id, or, when the
    id is not one a conversation may have (an e-mail, a path), "lg-" and a
    digest of it: one thread, one conversation, either way."""
    config = getattr(getattr(request, "runtime", None), "config", None) or {}
    thread = (config.get("configurable") or {}).get("thread_id")
    if not thread:
        raise ValueError("toolq: the graph runs without a thread_id (configurable.thread_id): the conversation has no id")
    thread = str(thread)
    if _CONVERSATION.fullmatch(thread) and not thread.startswith("lg-"):
        return thread
    return "lg-" + hashlib.sha256(thread.encode("utf-8")).hexdigest()[:40]


def _content(r: Result) -> str:
    return str(r.tool_result()["content"])


def through_toolq(
    client: Client,
    *,
    write_tools: Collection[str],
    conversation_id: Callable[[Any], str] = _thread,
    timeout: float | None = 60.0,
    final: bool = False,
) -> Callable[[Any, Execute], Awaitable[Any]]:
    """An async ``ToolNode`` wrapper (``awrap_tool_call``) that sends the calls
    of write_tools through toolq. conversation_id maps the ToolCallRequest to
    the conversation (default: the thread id). A call awaiting a person's
    approval is answered with a ToolMessage that says so (status "success":
    not an error; artifact status "awaiting_approval") unless final, which
    waits for the decision."""

    async def wrap(request: Any, execute: Execute) -> Any:
        call = request.tool_call
        if call["name"] not in write_tools:
            return await execute(request)
        turn, calls = _place(request.state, call["id"])
        # Identical calls of the turn (same tool, same canonical args) are
        # numbered in the order the model wrote them.
        canonical = canonicalize(call["args"])
        ordinal = 0
        for other in calls:
            if other.get("id") == call["id"]:
                break
            # Only the same tool's calls: another tool's args (a read's,
            # never sent to toolq) need have no key.
            if other["name"] == call["name"] and canonicalize(other["args"]) == canonical:
                ordinal += 1
        job = Job(
            conversation_id=conversation_id(request),
            turn_index=turn,
            tool=call["name"],
            tool_use_id=call["id"],
            args=call["args"],
            ordinal=ordinal,
        )
        result = await client.publish_and_await(job, timeout=timeout, final=final)
        return ToolMessage(
            content=_content(result),
            tool_call_id=call["id"],
            name=call["name"],
            status="error" if result.tool_result().get("is_error") else "success",
            artifact={"toolq_key": result.key, "duplicate": result.duplicate, "status": result.status},
        )

    return wrap
