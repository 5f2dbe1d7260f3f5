"""A real consumer, built from this repository, on its embedded defaults
(NATS with JetStream, a SQLite ledger, the demo tools and their sandbox), on
free ports and a temporary data directory, for the end-to-end tests; and
another whose one tool needs a person's approval."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import threading
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]


def missing(what: str) -> None:
    if os.environ.get("CI"):
        pytest.fail(f"{what} (CI is set: a missing tool is a failure)")
    pytest.skip(f"SKIPPED: {what}")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Consumer:
    nats_url: str
    sandbox_url: str
    data_dir: Path
    mcp_url: str  # the front door: the demo tools as an MCP server (--mcp-listen)
    binary: Path  # the consumer's executable

    def payments(self, invoice_id: str) -> list[dict]:
        with urllib.request.urlopen(self.sandbox_url + "/v1/payments") as resp:
            body = json.load(resp)
        items = body if isinstance(body, list) else body.get("data") or body.get("payments") or []  # none yet: "data": null
        return [p for p in items if p.get("invoice_id") == invoice_id]


@pytest.fixture(scope="session")
def consumer_binary(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """cmd/consumer, built once for the session."""
    if shutil.which("go") is None:
        missing("go, to build the consumer the end-to-end tests run")
    binary = tmp_path_factory.mktemp("bin") / "consumer"
    subprocess.run(["go", "build", "-o", str(binary), "./cmd/consumer"], cwd=REPO, check=True)
    return binary


@pytest.fixture(scope="session")
def consumer(tmp_path_factory: pytest.TempPathFactory, consumer_binary: Path) -> Iterator[Consumer]:
    tmp = tmp_path_factory.mktemp("toolq")
    nats_port, sandbox_port, mcp_port = free_port(), free_port(), free_port()
    proc = subprocess.Popen(
        [
            str(consumer_binary),
            "--data-dir",
            str(tmp / "data"),
            "--nats-listen",
            f"127.0.0.1:{nats_port}",
            "--sandbox-listen",
            f"127.0.0.1:{sandbox_port}",
            "--mcp-listen",
            f"127.0.0.1:{mcp_port}",
            "--log-level",
            "warn",
            "--tenants",
            "acme",
        ],
        stdout=subprocess.DEVNULL,
        env={**os.environ, "OTEL_SDK_DISABLED": "true"},
    )
    c = Consumer(
        nats_url=f"nats://127.0.0.1:{nats_port}",
        sandbox_url=f"http://127.0.0.1:{sandbox_port}",
        data_dir=tmp / "data",
        mcp_url=f"http://127.0.0.1:{mcp_port}/mcp",
        binary=consumer_binary,
    )
    deadline = time.monotonic() + 60
    while True:
        if proc.poll() is not None:
            pytest.fail(f"the consumer exited ({proc.returncode}) before it was ready")
        try:
            urllib.request.urlopen(c.sandbox_url + "/v1/payments", timeout=1).close()
            for port in (nats_port, mcp_port):
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            if time.monotonic() > deadline:
                proc.kill()
                pytest.fail("the consumer did not come up within 60 s")
            time.sleep(0.1)
    yield c
    proc.terminate()
    proc.wait(timeout=30)


@dataclass
class ApprovalConsumer:
    """A consumer whose registry is one keyed write, pay (args
    {"amount_cents": int}), that needs the approval of the group finance for
    every call; decide over NATS on toolq.decide.finance."""

    nats_url: str
    #: The calls of pay that ran (its downstream counts them).
    ran: list[bytes] = field(default_factory=list)


@pytest.fixture(scope="session")
def approval_consumer(tmp_path_factory: pytest.TempPathFactory, consumer_binary: Path) -> Iterator[ApprovalConsumer]:
    tmp = tmp_path_factory.mktemp("toolq-approval")
    ran: list[bytes] = []

    class Downstream(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            ran.append(self.rfile.read(int(self.headers.get("Content-Length", "0"))))
            body = b'{"paid":true}'
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    http = ThreadingHTTPServer(("127.0.0.1", 0), Downstream)
    threading.Thread(target=http.serve_forever, daemon=True).start()
    tools = tmp / "tools.yaml"
    tools.write_text(
        "tools:\n"
        "  - name: pay\n"
        "    class: keyed_write\n"
        "    schema: {type: object, properties: {amount_cents: {type: integer}}}\n"
        "    approval: {group: finance, ttl: 1h}\n"
        f'    http: {{method: POST, url: "http://127.0.0.1:{http.server_address[1]}/pay"}}\n',
        encoding="utf-8",
    )
    nats_port = free_port()
    args = ["--data-dir", str(tmp / "data"), "--nats-listen", f"127.0.0.1:{nats_port}", "--tools", str(tools), "--log-level", "warn"]
    proc = subprocess.Popen(
        [str(consumer_binary), *args],
        stdout=subprocess.DEVNULL,
        env={**os.environ, "OTEL_SDK_DISABLED": "true"},
    )
    deadline = time.monotonic() + 60
    while True:
        if proc.poll() is not None:
            pytest.fail(f"the consumer exited ({proc.returncode}) before it was ready")
        try:
            socket.create_connection(("127.0.0.1", nats_port), timeout=1).close()
            break
        except OSError:
            if time.monotonic() > deadline:
                proc.kill()
                pytest.fail("the consumer did not come up within 60 s")
            time.sleep(0.1)
    yield ApprovalConsumer(nats_url=f"nats://127.0.0.1:{nats_port}", ran=ran)
    proc.terminate()
    proc.wait(timeout=30)
    http.shutdown()
