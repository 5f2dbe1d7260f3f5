"""The jobs the Python client publishes and the results it reads are the
wire format of docs/schema (the Go side tests the same schemas)."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
from conftest import Consumer
from test_client import PAYMENT, connect

import toolq

SCHEMA = Path(__file__).resolve().parents[3] / "docs" / "schema"


def validator(name: str) -> jsonschema.Draft202012Validator:
    schema = json.loads((SCHEMA / name).read_text(encoding="utf-8"))
    return jsonschema.Draft202012Validator(schema, format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER)


async def test_published_jobs_and_read_results_are_the_wire_format(consumer: Consumer) -> None:
    client = await connect(consumer)
    try:
        job = toolq.Job("py-schema", 1, "send_payment", "toolu_py_schema", PAYMENT % "inv_py_schema", ordinal=2)
        cursor = await client.results_cursor()
        pub = await client.publish(job)
        await client.await_result("py-schema", "toolu_py_schema", from_seq=cursor, timeout=30)
        stored = await client.js.get_msg(toolq.JOBS_STREAM, pub.seq)
        validator("job.v1.json").validate(json.loads(stored.data))
        raw = await client.js.get_msg(toolq.RESULTS_STREAM, subject="toolq.results.py-schema", next=True, seq=cursor)
        validator("result.v1.json").validate(json.loads(raw.data))
        rejected = toolq.Job("py-schema", 2, "no_such_tool", "toolu_py_schema_r", "{}")
        r = await client.publish_and_await(rejected, timeout=30)
        assert r.status == "rejected" and r.error is not None
    finally:
        await client.nc.close()
