"""A real consumer, built from this repository, on its embedded defaults
(NATS with JetStream, a SQLite ledger, the demo tools and their sandbox), on
free ports and a temporary data directory, for the end-to-end tests."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
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

    def payments(self, invoice_id: str) -> list[dict]:
        with urllib.request.urlopen(self.sandbox_url + "/v1/payments") as resp:
            body = json.load(resp)
        items = body if isinstance(body, list) else body.get("data") or body.get("payments") or []  # none yet: "data": null
        return [p for p in items if p.get("invoice_id") == invoice_id]


@pytest.fixture(scope="session")
def consumer(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Consumer]:
    if shutil.which("go") is None:
        missing("go, to build the consumer the end-to-end tests run")
    tmp = tmp_path_factory.mktemp("toolq")
    subprocess.run(["go", "build", "-o", str(tmp / "consumer"), "./cmd/consumer"], cwd=REPO, check=True)
    nats_port, sandbox_port, mcp_port = free_port(), free_port(), free_port()
    proc = subprocess.Popen(
        [
            str(tmp / "consumer"),
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
        ],
        stdout=subprocess.DEVNULL,
        env={**os.environ, "OTEL_SDK_DISABLED": "true"},
    )
    c = Consumer(
        nats_url=f"nats://127.0.0.1:{nats_port}",
        sandbox_url=f"http://127.0.0.1:{sandbox_port}",
        data_dir=tmp / "data",
        mcp_url=f"http://127.0.0.1:{mcp_port}/mcp",
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
