"""toolq as a tool of the OpenAI Agents SDK: a ``FunctionTool`` whose calls
go through toolq, keyed on what the call is, so that a retried turn (whose
``tool_call_id`` is new every time, while the arguments are not) does not
repeat an effect.

    pay = toolq.openai_agents.through_toolq(
        client, name="send_payment", description="Pay an invoice.", params_json_schema=schema,
        conversation=lambda ctx: (ctx.context.conversation_id, ctx.context.turn_index),
    )
    agent = Agent(name="billing", tools=[pay])

The consumer runs ``send_payment`` from its registry; the tool returns the
call's output (JSON text), for a call awaiting a person's approval the text
that says so ("awaiting approval by a person …; the call has not run",
unless final=True, which waits for the decision), and raises ToolqCallError
for a call that failed, was rejected or denied, expired unapproved, or whose
outcome is unknown. ``conversation`` maps the tool's
context to the conversation and the turn: the SDK does not know either, the
application does (the run context is the place for them). The SDK does not
say which calls one model response holds, so two identical calls of one turn
(same args) are one call here, answered twice.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from agents import FunctionTool
from agents.tool_context import ToolContext

from toolq.client import Client, Job, Result

__all__ = ["ToolqCallError", "through_toolq"]


class ToolqCallError(RuntimeError):
    """The call ended in error, was rejected or denied, expired unapproved, or its outcome is indeterminate."""

    def __init__(self, result: Result) -> None:
        err = result.error
        message = result.approval_text() or (err.message if err else "")
        super().__init__(f"{result.status}: {err.code + ': ' + message if err else message}")
        self.result = result


def through_toolq(
    client: Client,
    *,
    name: str,
    description: str,
    params_json_schema: dict[str, Any],
    conversation: Callable[[ToolContext[Any]], tuple[str, int]],
    timeout: float | None = 60.0,
    strict_json_schema: bool = True,
    final: bool = False,
) -> FunctionTool:
    """A FunctionTool named name whose calls are published to toolq as jobs
    of the tool name and answered with their results."""

    async def invoke(ctx: ToolContext[Any], input_json: str) -> str:
        conversation_id, turn_index = conversation(ctx)
        # The SDK does not say which calls one response holds, so a call
        # cannot be told from its retry by position: every call is ordinal
        # 0, and two identical calls of one turn (usually a model error) are
        # one call, answered twice.
        job = Job(
            conversation_id=conversation_id,
            turn_index=turn_index,
            tool=name,
            tool_use_id=ctx.tool_call_id,
            args=input_json or "{}",
        )
        result = await client.publish_and_await(job, timeout=timeout, final=final)
        if result.status == "awaiting_approval":
            return result.approval_text()
        if result.status != "ok":
            raise ToolqCallError(result)
        return json.dumps(result.output, ensure_ascii=False)

    return FunctionTool(
        name=name,
        description=description,
        params_json_schema=params_json_schema,
        on_invoke_tool=invoke,
        strict_json_schema=strict_json_schema,
    )
