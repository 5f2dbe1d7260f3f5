"""toolq's MCP front door (`consumer --mcp-listen`) from the official Python MCP
client: a payment whose response stream is cut after the call was sent, then
re-issued as the specification says (a new request, with a new ID), is paid
once and answers the same twice; a write without the _meta that names it is
refused with a message that names the fields."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import urlsplit

import pytest
from conftest import Consumer
from mcp import Client
from mcp.shared.exceptions import MCPError

CONVERSATION, TURN = "io.toolq/conversation_id", "io.toolq/turn_index"


def payment(invoice: str) -> dict[str, Any]:
    return {"invoice_id": invoice, "amount_cents": 500, "currency": "EUR"}


class CutProxy:
    """Forwards TCP connections to the front door; armed, it lets the next
    request that contains the marker through whole and closes the client's
    connection when the answer begins (the answer is read and dropped: the
    server never learns that its client is gone)."""

    def __init__(self, target: str) -> None:
        parts = urlsplit(target)
        self.host, self.port = parts.hostname or "127.0.0.1", parts.port or 80
        self.path = parts.path
        self.marker: bytes | None = None
        self.cuts = 0
        self.server: asyncio.Server | None = None
        self.tasks: set[asyncio.Task[None]] = set()

    @property
    def url(self) -> str:
        assert self.server is not None
        port = self.server.sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{port}{self.path}"

    def cut_response(self, marker: str) -> None:
        self.marker = marker.encode()

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection(self.host, self.port)
        cut = asyncio.Event()

        async def answers() -> None:  # front door → client
            while data := await up_reader.read(32 << 10):
                if cut.is_set():
                    writer.close()
                    while await up_reader.read(32 << 10):  # the answer goes nowhere
                        pass
                    break
                writer.write(data)
                await writer.drain()
            writer.close()

        task = asyncio.create_task(answers())
        self.tasks.add(task)
        tail = b""
        with contextlib.suppress(ConnectionError):
            while data := await reader.read(32 << 10):
                seen = tail + data
                armed = self.marker is not None and self.marker in seen
                if armed:
                    self.marker, self.cuts = None, self.cuts + 1
                up_writer.write(data)
                await up_writer.drain()
                if armed:
                    cut.set()
                tail = seen[-256:]
        if not cut.is_set():
            up_writer.close()

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[CutProxy]:
        self.server = await asyncio.start_server(self.serve, "127.0.0.1", 0)
        try:
            yield self
        finally:
            self.server.close()
            for task in self.tasks:
                task.cancel()


async def call(url: str, name: str, arguments: dict[str, Any], meta: dict[str, Any] | None) -> Any:
    """One tools/call on a new connection (a re-issuing client may come back on one)."""
    async with Client(url) as client:
        return await client.call_tool(name, arguments, meta=meta)


async def refusal(url: str, name: str, arguments: dict[str, Any], meta: dict[str, Any] | None) -> MCPError:
    """The error of a tools/call the server refuses (raised inside the client's
    task group, which would wrap it)."""
    async with Client(url) as client:
        with pytest.raises(MCPError) as refused:
            await client.call_tool(name, arguments, meta=meta)
    return refused.value


async def test_a_write_without_meta_is_refused_naming_the_fields(consumer: Consumer) -> None:
    refused = await refusal(consumer.mcp_url, "send_payment", payment("inv_py_mcp_unnamed"), None)
    assert refused.error.code == -32602
    assert CONVERSATION in refused.error.message and TURN in refused.error.message
    assert consumer.payments("inv_py_mcp_unnamed") == []


async def test_a_read_without_meta_runs(consumer: Consumer) -> None:
    result = await call(consumer.mcp_url, "search_orders", {"query": "inv_py"}, None)
    assert not result.is_error
    assert result.meta is not None and result.meta["io.toolq/status"] == "ok"


async def test_a_cut_stream_reissued_pays_once_and_answers_the_same_twice(consumer: Consumer) -> None:
    meta = {CONVERSATION: "py-mcp-cut", TURN: 3}
    async with CutProxy(consumer.mcp_url).running() as proxy:
        proxy.cut_response('"tools/call"')
        cut: BaseException | None = None
        try:
            await asyncio.wait_for(call(proxy.url, "send_payment", payment("inv_py_mcp_cut"), meta), timeout=60)
        except Exception as err:  # whatever the transport makes of the cut
            cut = err
        assert cut is not None and proxy.cuts == 1
        # The stream broke: the request is lost; the client sends it again.
        first = await call(proxy.url, "send_payment", payment("inv_py_mcp_cut"), meta)
        second = await call(consumer.mcp_url, "send_payment", payment("inv_py_mcp_cut"), meta)
    assert not first.is_error and first.meta["io.toolq/status"] == "ok"
    assert first.model_dump() == second.model_dump()
    assert first.structured_content["invoice_id"] == "inv_py_mcp_cut"
    assert len(consumer.payments("inv_py_mcp_cut")) == 1


async def test_the_same_call_in_a_later_turn_is_a_second_payment(consumer: Consumer) -> None:
    for turn in (1, 2):
        result = await call(consumer.mcp_url, "send_payment", payment("inv_py_mcp_twice"), {CONVERSATION: "py-mcp-twice", TURN: turn})
        assert not result.is_error
    assert len(consumer.payments("inv_py_mcp_twice")) == 2
