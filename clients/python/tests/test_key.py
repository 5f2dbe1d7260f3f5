"""The key, against every shared vector (jobs/testdata) and every rejection."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import toolq

TESTDATA = Path(__file__).resolve().parents[3] / "jobs" / "testdata"


def lines(name: str) -> list[dict]:
    return [json.loads(line) for line in (TESTDATA / name).read_text(encoding="utf-8").splitlines() if line.strip()]


@pytest.mark.parametrize("vector", lines("rfc8785.jsonl"), ids=lambda v: v["name"])
def test_canonical_form_of_the_rfc8785_vectors(vector: dict) -> None:
    assert toolq.canonicalize(vector["input"], must_be_object=False) == vector["canonical"]


@pytest.mark.parametrize("name", ["python_keys.jsonl", "utf16_keys.jsonl"])
def test_key_and_material_of_every_shared_vector(name: str) -> None:
    for v in lines(name):
        call = dict(conversation_id=v["conversation_id"], turn_index=v["turn_index"], tool=v["tool"], ordinal=v["ordinal"])
        args = v.get("args_wire", v.get("args"))
        if not isinstance(args, str):
            args = json.dumps(args)
        assert toolq.canonicalize(args) == v["canonical"], v
        assert toolq.call_material(**call, args=args) == v["material"]
        assert toolq.call_key(**call, args=args) == v["key"]


@pytest.mark.parametrize("vector", lines("reject.jsonl"), ids=lambda v: v["name"])
def test_every_rejection_vector_is_refused_for_its_rule(vector: dict) -> None:
    call = dict(vector["call"])
    args = bytes.fromhex(call.pop("args_hex")) if "args_hex" in call else call.pop("args")
    call.setdefault("ordinal", 0)
    with pytest.raises(toolq.CallKeyError) as err:
        toolq.call_key(**call, args=args)
    assert err.value.vector_rule == vector["error"]


def test_a_mapping_gives_the_key_of_its_json_text() -> None:
    text = '{"invoice_id":"inv_9","amount_cents":1500,"currency":"EUR"}'
    mapping = {"currency": "EUR", "amount_cents": 1500.0, "invoice_id": "inv_9"}
    kw = dict(conversation_id="conv-42", turn_index=7, tool="send_payment")
    assert toolq.call_key(**kw, args=mapping) == toolq.call_key(**kw, args=text) == "f59a97883fdd6f13531d0209b36a3446"
    with pytest.raises(toolq.UnsafeIntegerError):
        toolq.call_key(**kw, args={"id": 2**53 + 1})
    with pytest.raises(toolq.LoneSurrogateError):
        toolq.call_key(**kw, args={"note": "\ud800"})
    with pytest.raises(toolq.JSONSyntaxError):
        toolq.call_key(**kw, args={"x": float("nan")})


def test_what_json_dumps_gets_wrong_the_key_gets_right() -> None:
    # The README's old snippet: café, 1.0 and 1e3 gave keys publisher key does not.
    kw = dict(conversation_id="c", turn_index=1, tool="t")
    assert toolq.canonicalize('{"name":"caf\\u00e9","n":1.0,"m":1e3}') == '{"m":1000,"n":1,"name":"café"}'
    assert toolq.call_key(**kw, args='{"a":1.0}') == toolq.call_key(**kw, args='{"a":1}')


@pytest.mark.parametrize(
    "field,value",
    [("turn_index", True), ("turn_index", -1), ("ordinal", 1.0), ("turn_index", 10**16), ("conversation_id", ""), ("tool", "a.b")],
)
def test_fields_are_checked_as_the_consumer_checks_them(field: str, value: object) -> None:
    call: dict = dict(conversation_id="c", turn_index=1, tool="t", ordinal=0, args="{}")
    call[field] = value
    with pytest.raises(toolq.FieldError) as err:
        toolq.call_key(**call)
    assert err.value.vector_rule == f"field:{field}"


def test_tenant_keys_default_unchanged_and_prefixed() -> None:
    """The keys jobs/tenant_test.go pins: the default tenant's unchanged, a tenant's material after ``tenant|``."""
    from toolq.key import FieldError as _FieldError
    from toolq.key import call_key as _call_key
    from toolq.key import call_material as _call_material

    call = dict(conversation_id="conv-1", turn_index=3, tool="send_payment", args='{"currency":"EUR","amount":1}')
    assert _call_key(**call) == "ab2f01b88ac510ba073855c5f886b155"
    assert _call_key(**call, tenant="") == "ab2f01b88ac510ba073855c5f886b155"
    assert _call_material(**call, tenant="acme") == 'acme|conv-1|3|send_payment|0|{"amount":1,"currency":"EUR"}'
    assert _call_key(**call, tenant="acme") == "b838ba7140c66d071dd2e52a36af10b4"
    for bad in ["jobs", "results", "dlq", "approvals", "decide", "ledger", "tools", "a.b", "*", ">", "x" * 65]:
        try:
            _call_key(**call, tenant=bad)
        except _FieldError as e:
            assert e.field == "tenant", bad
        else:
            raise AssertionError(f"tenant {bad!r} accepted")
