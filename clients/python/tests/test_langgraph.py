"""A LangGraph ToolNode sending a write tool through toolq, against a real
consumer: the graph re-run after a simulated crash (the model re-plans the
same call under a new id) makes one payment."""

from __future__ import annotations

import json

from conftest import Consumer
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langchain_core.tools import tool
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode
from test_client import connect

import toolq
import toolq.langgraph


@tool
def send_payment(invoice_id: str, amount_cents: int, currency: str) -> str:
    """Pay an invoice."""
    raise AssertionError("a write tool ran in the graph's process, not through toolq")


@tool
def lookup_weather(city: str) -> str:
    """Read the weather (a read: runs in the node)."""
    return f"sunny in {city}"


def graph(client: toolq.Client):  # type: ignore[no-untyped-def]
    node = ToolNode([send_payment, lookup_weather], awrap_tool_call=toolq.langgraph.through_toolq(client, write_tools={"send_payment"}))
    g = StateGraph(MessagesState)
    g.add_node("tools", node)
    g.add_edge(START, "tools")
    return g.compile()


def turn(call_id: str) -> list:
    args = {"invoice_id": "inv_py_lg", "amount_cents": 900, "currency": "EUR"}
    return [
        HumanMessage("pay inv_py_lg, and how is the weather?"),
        AIMessage(
            "",
            tool_calls=[
                {"name": "send_payment", "args": args, "id": call_id, "type": "tool_call"},
                {"name": "lookup_weather", "args": {"city": "Lyon"}, "id": call_id + "_w", "type": "tool_call"},
            ],
        ),
    ]


async def test_a_graph_rerun_after_a_crash_makes_one_payment(consumer: Consumer) -> None:
    client = await connect(consumer)
    try:
        g = graph(client)
        config = {"configurable": {"thread_id": "py-langgraph-1"}}
        first = await g.ainvoke({"messages": turn("call_lg_1")}, config)
        # The process died before the graph checkpointed; resumed, the model
        # plans the same call again, under a new id.
        second = await g.ainvoke({"messages": turn("call_lg_2")}, config)
        pay1, weather = [m for m in first["messages"] if isinstance(m, ToolMessage)]
        pay2 = next(m for m in second["messages"] if isinstance(m, ToolMessage) and m.name == "send_payment")
        assert weather.content == "sunny in Lyon"
        assert pay1.status == pay2.status == "success"
        assert json.loads(pay1.content) == json.loads(pay2.content)
        assert pay2.artifact["duplicate"] and pay2.artifact["toolq_key"] == pay1.artifact["toolq_key"]
        assert len(consumer.payments("inv_py_lg")) == 1
    finally:
        await client.nc.close()
