"""The OpenAI Agents SDK's case (a retried turn re-runs a tool with a new
tool_call_id and the same arguments): the toolq FunctionTool makes one
payment, against a real consumer."""

from __future__ import annotations

import json
from dataclasses import dataclass

import pytest
from agents.tool_context import ToolContext
from conftest import Consumer
from test_client import connect

import toolq
import toolq.openai_agents

SCHEMA = {
    "type": "object",
    "properties": {"invoice_id": {"type": "string"}, "amount_cents": {"type": "integer"}, "currency": {"type": "string"}},
    "required": ["invoice_id", "amount_cents", "currency"],
    "additionalProperties": False,
}


@dataclass
class Run:
    conversation_id: str
    turn_index: int


def ctx(run: Run, call_id: str, args: str) -> ToolContext[Run]:
    return ToolContext(context=run, tool_name="send_payment", tool_call_id=call_id, tool_arguments=args)


async def test_a_turn_retried_with_a_new_tool_call_id_makes_one_payment(consumer: Consumer) -> None:
    client = await connect(consumer)
    try:
        pay = toolq.openai_agents.through_toolq(
            client,
            name="send_payment",
            description="Pay an invoice.",
            params_json_schema=SCHEMA,
            conversation=lambda c: (c.context.conversation_id, c.context.turn_index),
        )
        run = Run("py-agents-1", 4)
        args = '{"invoice_id":"inv_py_agents","amount_cents":300,"currency":"EUR"}'
        first = json.loads(await pay.on_invoke_tool(ctx(run, "call_agents_1", args), args))
        # The run failed after the tool ran; the SDK retries the turn, and the model calls it again.
        respelled = '{"currency":"EUR","amount_cents":300.0,"invoice_id":"inv_py_agents"}'
        second = json.loads(await pay.on_invoke_tool(ctx(run, "call_agents_2", respelled), respelled))
        assert first == second and first["id"].startswith("pay_")
        assert len(consumer.payments("inv_py_agents")) == 1
        # A call toolq refuses is an error of the tool, not a result.
        with pytest.raises(toolq.openai_agents.ToolqCallError):
            bad = '{"invoice_id":"inv_py_agents_bad","amount_cents":-1,"currency":"EUR"}'
            await pay.on_invoke_tool(ctx(run, "call_agents_3", bad), bad)
    finally:
        await client.nc.close()
