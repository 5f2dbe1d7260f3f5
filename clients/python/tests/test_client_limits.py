"""Against a real consumer: jobs the client publishes that the
consumer never answers, a turn half-published, subscriptions left behind."""

from __future__ import annotations

import asyncio

import pytest
from conftest import Consumer
from test_client import connect

import toolq


async def test_args_the_key_accepts_are_answered(consumer: Consumer) -> None:
    """Args nested 64 deep have a key (call_key, Go's Call.Key and `publisher
    key --args` agree), but the job body that carries them nests 65 deep: the
    consumer's strict body parse refuses it, the job is dead-lettered, and no
    result ever comes: publish_and_await waits for ever (here: 10 s)."""
    client = await connect(consumer)
    try:
        args = '{"invoice_id":"inv_deep","amount_cents":500,"currency":"EUR","memo":' + "[" * 63 + "]" * 63 + "}"
        toolq.call_key(conversation_id="py-deep", turn_index=1, tool="send_payment", args=args)  # accepted
        res = await client.publish_and_await(
            toolq.Job(conversation_id="py-deep", turn_index=1, tool="send_payment", tool_use_id="toolu_deep", args=args), timeout=10
        )
        assert res.status in ("ok", "rejected", "error")
    finally:
        await client.nc.close()


async def test_a_turn_with_one_call_without_a_key_runs_none_of_it(consumer: Consumer) -> None:
    """run_turn publishes call by call: a later call whose args have no key
    raises after the earlier calls were published and run, so the turn has
    effects and no tool_result at all; a re-run does the same."""
    client = await connect(consumer)
    try:
        calls = [
            {"id": "toolu_half_1", "name": "send_payment", "input": {"invoice_id": "inv_half", "amount_cents": 500, "currency": "EUR"}},
            {
                "id": "toolu_half_2",
                "name": "send_payment",
                "input": {"invoice_id": "inv_half2", "amount_cents": 12345678901234567890, "currency": "EUR"},
            },
        ]
        with pytest.raises(toolq.CallKeyError):
            await client.run_turn("py-half", 1, calls, timeout=10)
        await asyncio.sleep(2)
        assert consumer.payments("inv_half") == [], "a payment was made for a turn that raised"
    finally:
        await client.nc.close()
