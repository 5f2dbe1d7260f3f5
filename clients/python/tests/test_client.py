"""The client against a real consumer."""

from __future__ import annotations

import asyncio
import json

import nats
import pytest
from conftest import Consumer

import toolq
from toolq.client import _ordered

PAYMENT = '{"invoice_id":"%s","amount_cents":500,"currency":"EUR"}'


async def connect(c: Consumer) -> toolq.Client:
    nc = await nats.connect(c.nats_url)
    client = toolq.Client(nc)
    # The consumer creates the streams as it starts.
    for _ in range(100):
        try:
            await client.js.stream_info(toolq.JOBS_STREAM)
            await client.js.stream_info(toolq.RESULTS_STREAM)
            return client
        except Exception:
            await asyncio.sleep(0.1)
    raise AssertionError("the consumer created no streams")


async def test_a_call_published_twice_makes_one_payment_and_two_equal_results(consumer: Consumer) -> None:
    client = await connect(consumer)
    try:
        job = dict(conversation_id="py-e2e", turn_index=1, tool="send_payment", args=PAYMENT % "inv_py_1")
        cursor = await client.results_cursor()
        pub = await client.publish(toolq.Job(**job, tool_use_id="toolu_py_a"))
        first = await client.await_result("py-e2e", "toolu_py_a", from_seq=cursor, timeout=30)
        # The retried turn: the same call, spelled another way, under a new id.
        again = dict(job, args={"currency": "EUR", "amount_cents": 500.0, "invoice_id": "inv_py_1"})
        second = await client.publish_and_await(toolq.Job(**again, tool_use_id="toolu_py_b"), timeout=30)
        assert first.status == second.status == "ok"
        assert second.output == first.output
        assert second.duplicate and second.original_tool_use_id == "toolu_py_a"
        assert first.key == second.key == toolq.call_key(**{k: v for k, v in job.items()})
        assert len(consumer.payments("inv_py_1")) == 1
        # The job carries the headers the Go client sends.
        msg = await client.js.get_msg(toolq.JOBS_STREAM, pub.seq)
        assert msg.headers is not None and msg.headers[toolq.HEADER_KEY] == first.key
        assert msg.headers["Nats-Msg-Id"] == f"job:{first.key}:toolu_py_a"
    finally:
        await client.nc.close()


async def test_run_turn_numbers_identical_calls_and_a_rerun_returns_instead_of_waiting(consumer: Consumer) -> None:
    client = await connect(consumer)
    try:
        calls = [
            {"id": "toolu_py_t1", "name": "send_payment", "input": PAYMENT % "inv_py_t"},
            {"id": "toolu_py_t2", "name": "send_payment", "input": {"invoice_id": "inv_py_t", "amount_cents": 500, "currency": "EUR"}},
        ]
        blocks = await client.run_turn("py-turn", 3, calls, timeout=30)
        assert [b["tool_use_id"] for b in blocks] == ["toolu_py_t1", "toolu_py_t2"]
        assert not any(b.get("is_error") for b in blocks)
        # Identical calls are two calls (ordinals 0 and 1): two payments.
        assert len(consumer.payments("inv_py_t")) == 2
        # The agent restarts and runs the same turn again: the same results, at once.
        again = await client.run_turn("py-turn", 3, calls, timeout=30)
        assert again == blocks
        assert len(consumer.payments("inv_py_t")) == 2
    finally:
        await client.nc.close()


async def test_a_later_answer_supersedes_an_earlier_one(consumer: Consumer) -> None:
    client = await connect(consumer)
    try:
        base = dict(
            version=1,
            key="0" * 32,
            conversation_id="py-later",
            turn_index=0,
            ordinal=0,
            tool="send_payment",
            tool_use_id="toolu_py_later",
            duplicate=False,
            attempts=1,
            completed_at="2026-12-05T00:00:00Z",
        )
        await client.js.publish(
            "toolq.results.py-later", json.dumps({**base, "status": "indeterminate", "error": {"code": "reset", "message": ""}}).encode()
        )
        await client.js.publish(
            "toolq.results.py-later", json.dumps({**base, "status": "ok", "output": {"ticket": "T-1"}, "attempts": 2}).encode()
        )
        r = await client.await_result("py-later", "toolu_py_later", timeout=30)
        assert r.status == "ok" and r.output == {"ticket": "T-1"}
    finally:
        await client.nc.close()


async def test_one_results_reader_serves_many_calls_and_drops_what_nobody_expects(consumer: Consumer) -> None:
    client = await connect(consumer)
    reader = await client.results()
    try:
        abandoned = reader.expect("toolu_py_r_abandoned")
        await client.publish(toolq.Job("py-reader", 0, "send_payment", "toolu_py_r_abandoned", PAYMENT % "inv_py_r0"))
        reader.cancel("toolu_py_r_abandoned")
        assert abandoned[0].cancelled()
        for i in range(20):
            [fut] = reader.expect(f"toolu_py_r{i}")
            await client.publish(toolq.Job("py-reader", i + 1, "send_payment", f"toolu_py_r{i}", PAYMENT % f"inv_py_r{i + 1}"))
            r = await asyncio.wait_for(fut, 30)
            assert r.tool_use_id == f"toolu_py_r{i}" and r.status == "ok"
    finally:
        await reader.close()
        await client.nc.close()


async def test_the_job_carries_the_active_opentelemetry_span(consumer: Consumer) -> None:
    trace = pytest.importorskip("opentelemetry.trace")
    from opentelemetry.sdk.trace import TracerProvider

    provider = TracerProvider()
    client = await connect(consumer)
    try:
        with provider.get_tracer("agent").start_as_current_span("agent turn") as span:
            pub = await client.publish(toolq.Job("py-otel", 1, "send_payment", "toolu_py_otel", PAYMENT % "inv_py_otel"))
        ctx = span.get_span_context()
        msg = await client.js.get_msg(toolq.JOBS_STREAM, pub.seq)
        assert msg.headers is not None
        assert (
            msg.headers["traceparent"]
            == f"00-{trace.format_trace_id(ctx.trace_id)}-{trace.format_span_id(ctx.span_id)}-{ctx.trace_flags:02x}"
        )
        # Without an active span, the traceparent given is sent as is; with neither, none.
        given = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
        pub2 = await client.publish(toolq.Job("py-otel", 2, "send_payment", "toolu_py_otel2", PAYMENT % "inv_py_otel"), traceparent=given)
        pub3 = await client.publish(toolq.Job("py-otel", 3, "send_payment", "toolu_py_otel3", PAYMENT % "inv_py_otel"))
        assert (await client.js.get_msg(toolq.JOBS_STREAM, pub2.seq)).headers["traceparent"] == given  # type: ignore[index]
        assert "traceparent" not in ((await client.js.get_msg(toolq.JOBS_STREAM, pub3.seq)).headers or {})
    finally:
        await client.nc.close()


async def test_lookup_says_whether_a_call_already_happened(consumer: Consumer) -> None:
    client = await connect(consumer)
    try:
        job = toolq.Job("py-lookup", 1, "send_payment", "toolu_py_lookup", PAYMENT % "inv_py_lookup")
        await client.publish_and_await(job, timeout=30)
        key = toolq.call_key(conversation_id="py-lookup", turn_index=1, tool="send_payment", args=PAYMENT % "inv_py_lookup")
        done = await client.lookup(key)
        assert done.state == "completed" and done.first_tool_use_id == "toolu_py_lookup" and done.output["id"].startswith("pay_")
        assert (await client.lookup("0123456789abcdef0123456789abcdef")).state == "unknown"
        with pytest.raises(toolq.LookupError) as err:
            await client.lookup("not a key")
        assert err.value.code == "400"
    finally:
        await client.nc.close()


def set_faults(c: Consumer, faults: dict) -> None:
    import urllib.request

    req = urllib.request.Request(c.sandbox_url + "/v1/_faults", data=json.dumps(faults).encode(), method="POST")
    urllib.request.urlopen(req).close()


async def test_lookup_answers_in_flight_and_indeterminate_calls(consumer: Consumer) -> None:
    client = await connect(consumer)
    try:
        # In flight: a write the sandbox takes 3 s to make.
        set_faults(consumer, {"latency_ms": 3000})
        slow = toolq.Job("py-lookup2", 1, "send_payment", "toolu_py_slow", PAYMENT % "inv_py_slow")
        pub = await client.publish(slow)
        for _ in range(50):
            state = (await client.lookup(pub.key)).state
            if state != "unknown":
                break
            await asyncio.sleep(0.05)
        flight = await client.lookup(pub.key)
        assert flight.state == "in_flight" and flight.lease_remaining_ms > 0, flight
        await client.await_result("py-lookup2", "toolu_py_slow", timeout=30)
        # Indeterminate: an unkeyed write whose connection is reset after the effect.
        set_faults(consumer, {"latency_ms": 0, "drop_after_effect_rate": 1})
        ticket = toolq.Job("py-lookup2", 2, "create_ticket", "toolu_py_ticket", '{"title":"lookup","body":"b"}')
        r = await client.publish_and_await(ticket, timeout=30)
        assert r.status == "indeterminate"
        lost = await client.lookup(r.key)
        assert lost.state == "indeterminate" and lost.error is not None, lost
    finally:
        set_faults(consumer, {"latency_ms": 0, "drop_after_effect_rate": 0})
        await client.nc.close()


async def test_a_tenants_call_runs_apart_from_the_default_tenants_same_call(consumer: Consumer) -> None:
    """The consumer serves tenant acme (--tenants acme) beside the default tenant: acme's call is published on
    toolq.acme.jobs.<tool> under a key with the tenant, answered in TOOLQ_acme_RESULTS, and the default tenant's
    identical call is another call."""
    default = await connect(consumer)
    nc = await nats.connect(consumer.nats_url, inbox_prefix=b"_INBOX_acme")
    acme = toolq.Client(nc, tenant="acme")
    try:
        job = dict(conversation_id="py-tenant", turn_index=1, tool="send_payment", args=PAYMENT % "inv_py_tenant")
        a = await acme.publish(toolq.Job(**job, tool_use_id="toolu_py_t"))
        ra = await acme.await_result("py-tenant", "toolu_py_t", timeout=30)
        d = await default.publish_and_await(toolq.Job(**job, tool_use_id="toolu_py_t"), timeout=30)
        assert a.key == toolq.call_key(**job, tenant="acme") != d.key == toolq.call_key(**job)
        assert ra.status == d.status == "ok" and ra.tenant == "acme" and d.tenant == "" and not d.duplicate
        assert len(consumer.payments("inv_py_tenant")) == 2
        msg = await default.js.get_msg(toolq.JOBS_STREAM, a.seq)
        assert msg.subject == "toolq.acme.jobs.send_payment" and json.loads(msg.data)["tenant"] == "acme"
        assert (await acme.lookup(a.key)).state == "completed"
        assert (await default.js.stream_info("TOOLQ_acme_RESULTS")).state.messages == 1
        with pytest.raises(toolq.FieldError):
            toolq.Client(nc, tenant="results")
    finally:
        await nc.close()
        await default.nc.close()


async def test_a_results_reader_recreated_before_its_first_result_reads_nothing_older(consumer: Consumer) -> None:
    """nats-py recreates an ordered consumer that missed its heartbeats
    (reset_ordered_consumer, as it calls it), from the sequence after the
    last it delivered: before any delivery that was the stream's first, and
    the reader re-read every result of every conversation."""
    client = await connect(consumer)
    for i in range(50):
        await client.js.publish(f"toolq.results.py-old-{i}", b"{}")
    reader = await client.results()
    try:
        jsi = reader._sub._sub._jsi
        await jsi.reset_ordered_consumer(jsi._sseq + 1)
        [fut] = reader.expect("toolu_py_after_reset")
        await client.publish(toolq.Job("py-reset", 0, "send_payment", "toolu_py_after_reset", PAYMENT % "inv_py_reset"))
        r = await asyncio.wait_for(fut, 30)
        assert r.status == "ok"
        read = reader._sub._sub.delivered  # the result, and any heartbeat
        assert read < 50, f"the recreated reader read {read} messages: the 50 older ones again"
    finally:
        await reader.close()
        await client.nc.close()


async def test_an_ordered_consumer_recreated_before_its_first_delivery_starts_at_its_sequence(consumer: Consumer) -> None:
    """Reset before any delivery, by missed heartbeats (activity_check) or
    by a sequence mismatch on the first message: the consumer starts again
    at from_seq, reads the message published there, and resets once."""
    client = await connect(consumer)
    subject = "toolq.results.py-ordered-reset"
    try:
        for _ in range(20):
            await client.js.publish(subject, b"{}")
        from_seq = await client.results_cursor()
        sub = await _ordered(client.js, subject, toolq.RESULTS_STREAM, from_seq)
        jsi = sub._sub._jsi
        await jsi.reset_ordered_consumer(jsi._sseq + 1)  # what activity_check does
        await asyncio.sleep(0.2)
        jsi._dseq = 7  # the next delivery mismatches: process_msg resets at _sseq + 1
        resets = 0
        reset = jsi.reset_ordered_consumer

        async def counted(sseq: int | None) -> bool:
            nonlocal resets
            resets += 1
            assert sseq == from_seq
            return await reset(sseq)

        jsi.reset_ordered_consumer = counted
        ack = await client.js.publish(subject, b'{"after":1}')
        msg = await sub.next_msg(timeout=10)
        assert msg.metadata.sequence.stream == ack.seq == from_seq
        assert resets == 1 and jsi._sseq == from_seq
        await sub.unsubscribe()
    finally:
        await client.nc.close()
