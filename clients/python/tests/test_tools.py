"""The tool list: the consumer's registry as each API's tool definitions."""

from __future__ import annotations

import asyncio
import json
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import nats
import nats.errors
import pytest
from anthropic.types import ToolParam
from conftest import REPO, Consumer, free_port, missing
from openai.types.chat import ChatCompletionToolParam
from openai.types.responses import FunctionToolParam
from pydantic import TypeAdapter

import toolq

FORMATS: list[toolq.ToolFormat] = ["anthropic", "openai", "openai-responses", "mcp"]


async def tools_when_served(client: toolq.Client, format: toolq.ToolFormat) -> list[dict]:
    # The consumer starts its services once its streams are up.
    for _ in range(100):
        try:
            return await client.tools(format)
        except nats.errors.NoRespondersError:
            await asyncio.sleep(0.1)
    raise AssertionError("no consumer served the tool list")


async def test_tools_answers_the_registry_as_each_apis_tool_definitions(consumer: Consumer) -> None:
    client = toolq.Client(await nats.connect(consumer.nats_url))
    try:
        binary = consumer.binary
        for format in FORMATS:
            got = await tools_when_served(client, format)
            printed = subprocess.run(
                [str(binary), "tools", "export", "--format", format], check=True, capture_output=True, text=True
            ).stdout
            assert got == json.loads(printed), format
        anthropic = await client.tools("anthropic")
        assert [t["name"] for t in anthropic] == ["create_ticket", "search_orders", "send_payment"]
        assert anthropic[2]["input_schema"]["type"] == "object"
        assert anthropic[2]["input_schema"]["required"] == ["invoice_id", "amount_cents", "currency"]
        openai = await client.tools("openai")
        assert openai[2] == {
            "type": "function",
            "function": {k if k != "input_schema" else "parameters": v for k, v in anthropic[2].items()},
        }
        mcp = await client.tools("mcp")
        assert [t["annotations"]["readOnlyHint"] for t in mcp] == [False, True, False]
        with pytest.raises(toolq.ToolsError) as err:
            await client.tools("gemini")  # type: ignore[arg-type]
        assert err.value.code == "400"
    finally:
        await client.nc.close()


async def test_tools_are_what_each_sdk_takes(consumer: Consumer) -> None:
    # The SDKs' own types of a tool definition, strictly: a member they do
    # not define, or of another type, fails.
    client = toolq.Client(await nats.connect(consumer.nats_url))
    try:
        for format, sdk_type in [
            ("anthropic", ToolParam),
            ("openai", ChatCompletionToolParam),
            ("openai-responses", FunctionToolParam),
        ]:
            definitions = await tools_when_served(client, format)
            TypeAdapter(list[sdk_type], config={"extra": "forbid"}).validate_python(definitions, strict=True)
    finally:
        await client.nc.close()


@pytest.fixture
def bare_nats(tmp_path: Path) -> Iterator[str]:
    """A NATS server of its own, with nothing serving the tool list."""
    if shutil.which("go") is None:
        missing("go, to build the NATS server")
    binary = tmp_path / "nats-server"
    subprocess.run(["go", "build", "-o", str(binary), "github.com/nats-io/nats-server/v2"], cwd=REPO, check=True)
    port = free_port()
    proc = subprocess.Popen([str(binary), "-a", "127.0.0.1", "-p", str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 30
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                pytest.fail("the NATS server did not come up")
            time.sleep(0.05)
    yield f"nats://127.0.0.1:{port}"
    proc.terminate()
    proc.wait(timeout=30)


async def test_tools_with_no_consumer_answering_raises_no_responders(bare_nats: str) -> None:
    client = toolq.Client(await nats.connect(bare_nats))
    try:
        with pytest.raises(nats.errors.NoRespondersError):
            await client.tools("anthropic")
    finally:
        await client.nc.close()
