"""The LangGraph wrapper and the key's mapping input, with a fake
client (no network)."""

from __future__ import annotations

import types
from typing import Any

import pytest
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langchain_core.tools import tool
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode

import toolq
import toolq.langgraph
from toolq.key import CallKeyError


class FakeClient:
    def __init__(self, status: toolq.Status = "ok") -> None:
        self.jobs: list[toolq.Job] = []
        self.status = status  # what every call is answered

    async def publish_and_await(self, job: toolq.Job, *, timeout: float | None = None, final: bool = False) -> toolq.Result:
        self.jobs.append(job)
        key = toolq.call_key(
            conversation_id=job.conversation_id, turn_index=job.turn_index, tool=job.tool, ordinal=job.ordinal, args=job.args
        )
        return toolq.Result(
            version=1,
            key=key,
            conversation_id=job.conversation_id,
            turn_index=job.turn_index,
            ordinal=job.ordinal,
            tool=job.tool,
            tool_use_id=job.tool_use_id,
            status=self.status,
            duplicate=False,
            attempts=1,
            completed_at="",
            output="paid" if self.status == "ok" else None,
        )


@tool
def send_payment(invoice_id: str, amount_cents: int) -> str:
    """Pay an invoice."""
    raise AssertionError("ran in the node")


@tool
def lookup_account(account: int) -> str:
    """Read an account (a read tool: runs in the node)."""
    return "ok"


def graph(client: Any):  # type: ignore[no-untyped-def]
    node = ToolNode(
        [send_payment, lookup_account],
        handle_tool_errors=False,
        awrap_tool_call=toolq.langgraph.through_toolq(client, write_tools={"send_payment"}),
    )
    g = StateGraph(MessagesState)
    g.add_node("tools", node)
    g.add_edge(START, "tools")
    return g.compile()


async def test_a_read_tools_args_do_not_break_a_write_tool() -> None:
    """The ordinal loop canonicalizes the args of every earlier call of the
    message, whatever its tool: a read tool's account number beyond 2^53
    (never sent to toolq) makes the payment of the same message fail."""
    client = FakeClient()
    msgs = [
        HumanMessage("check my account and pay inv_1"),
        AIMessage(
            "",
            tool_calls=[
                {"name": "lookup_account", "args": {"account": 12345678901234567890}, "id": "call_r", "type": "tool_call"},
                {"name": "send_payment", "args": {"invoice_id": "inv_1", "amount_cents": 500}, "id": "call_w", "type": "tool_call"},
            ],
        ),
    ]
    out = await graph(client).ainvoke({"messages": msgs}, {"configurable": {"thread_id": "t-1"}})
    assert len(client.jobs) == 1, out


async def test_a_reused_tool_call_id_does_not_take_an_earlier_turns_key() -> None:
    """Providers that number tool calls per message (call_0, call_1, …) reuse
    ids across turns. _place takes the FIRST assistant message holding the id:
    turn 2's payment gets turn 0's turn index, hence turn 0's key (same
    invoice and amount, e.g. a second instalment): answered from the ledger as
    a duplicate, never paid."""
    client = FakeClient()
    pay = {"name": "send_payment", "args": {"invoice_id": "inv_1", "amount_cents": 500}, "id": "call_0", "type": "tool_call"}
    msgs = [
        HumanMessage("pay the first instalment"),
        AIMessage("", tool_calls=[pay]),
        ToolMessage("paid", tool_call_id="call_0"),
        AIMessage("Done."),
        HumanMessage("now the second instalment"),
        AIMessage("", tool_calls=[pay]),
    ]
    await graph(client).ainvoke({"messages": msgs}, {"configurable": {"thread_id": "t-2"}})
    assert client.jobs[-1].turn_index == 2


async def test_thread_ids_langgraph_accepts_have_a_conversation() -> None:
    """thread_id is used verbatim as conversation_id: an e-mail or a dotted id
    (common thread ids) makes every write tool fail with a FieldError."""
    client = FakeClient()
    msgs = [
        HumanMessage("pay"),
        AIMessage(
            "",
            tool_calls=[
                {"name": "send_payment", "args": {"invoice_id": "inv_1", "amount_cents": 500}, "id": "call_w", "type": "tool_call"}
            ],
        ),
    ]
    await graph(client).ainvoke({"messages": msgs}, {"configurable": {"thread_id": "user@example.com/session.1"}})
    assert len(client.jobs) == 1


async def test_a_langgraph_call_awaiting_approval_is_a_message_that_says_so_not_an_error() -> None:
    """A write that waits for a person's approval is answered at once: its
    ToolMessage says so and is no error, and its artifact's status is
    awaiting_approval; a denied call's is an error."""
    call = {"name": "send_payment", "args": {"invoice_id": "inv_1", "amount_cents": 500}, "id": "call_a", "type": "tool_call"}
    msgs = [HumanMessage("pay"), AIMessage("", tool_calls=[call])]
    for status, want in [("awaiting_approval", "success"), ("denied", "error")]:
        out = await graph(FakeClient(status)).ainvoke({"messages": msgs}, {"configurable": {"thread_id": "t-appr"}})
        answer = out["messages"][-1]
        assert answer.status == want and answer.artifact["status"] == status, answer
        if status == "awaiting_approval":
            assert answer.content.startswith("awaiting approval by a person (key ") and answer.content.endswith("the call has not run")
        else:
            assert "the call did not run" in answer.content


def test_mapping_keys_must_be_strings() -> None:
    """json.dumps turns {1: ...} into {"1": ...} and {True: ...} into
    {"true": ...}: args no JSON document has get another document's key."""
    base = dict(conversation_id="c", turn_index=0, tool="t")
    with pytest.raises(CallKeyError):
        toolq.call_key(**base, args={1: "x"})  # type: ignore[dict-item]


def test_any_mapping_is_accepted() -> None:
    """Args is typed Mapping[str, Any], but json.dumps refuses a Mapping that
    is not a dict (MappingProxyType, a frozen/immutable mapping)."""
    base = dict(conversation_id="c", turn_index=0, tool="t")
    assert toolq.call_key(**base, args=types.MappingProxyType({"a": 1})) == toolq.call_key(**base, args={"a": 1})


def test_a_deep_mapping_is_too_deep_not_a_recursion_error() -> None:
    base = dict(conversation_id="c", turn_index=0, tool="t")
    d: dict[str, Any] = {}
    for _ in range(5000):
        d = {"a": d}
    with pytest.raises(toolq.TooDeepError):
        toolq.call_key(**base, args=d)
