"""Python's call_key against Go's `publisher key`, rule for rule: number
spellings, escapes, whitespace, surrogates, invalid bytes, depth, and 4,000
random documents."""

from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

import toolq
from toolq.key import CallKeyError

REPO = Path(__file__).resolve().parents[3]
HEAD = '{"conversation_id":"c-1","turn_index":3,"tool":"pay","ordinal":0,"args":'


_BIN = Path(tempfile.mkdtemp(prefix="toolq-py-publisher-")) / "publisher"


def publisher() -> str:
    if not _BIN.exists():
        if shutil.which("go") is None:
            if os.environ.get("CI"):
                pytest.fail("go is missing (CI is set: a missing tool is a failure)")
            pytest.skip("SKIPPED: go, to build publisher key")
        subprocess.run(["go", "build", "-o", str(_BIN), "./cmd/publisher"], cwd=REPO, check=True)
    return str(_BIN)


def go_keys(args_texts: list[bytes]) -> list[str]:
    binary = publisher()
    data = b"".join(HEAD.encode() + a + b"}\n" for a in args_texts)
    out = subprocess.run([str(binary), "key"], input=data, capture_output=True).stdout
    return out.decode().split("\n")[:-1]


def py_key(a: bytes) -> str:
    try:
        return toolq.call_key(conversation_id="c-1", turn_index=3, tool="pay", args=a)
    except CallKeyError as e:
        return "error: " + e.rule


def norm(go: str) -> str:
    return "error" if go.startswith("error") else go


NUMBERS = [
    "-0",
    "-0.0",
    "0e0",
    "0E-0",
    "1E400",
    "-1e400",
    "1e-400",
    "-1e-400",
    "0.1e1",
    "1e21",
    "1e+21",
    "1e20",
    "9007199254740992",
    "-9007199254740992",
    "9007199254740993",
    "9007199254740992.0",
    "9007199254740993.0",
    "9007199254740995.0",
    "1e16",
    "1e15",
    "123456789012345678901234567890e-20",
    "5e-324",
    "2.4703282292062328e-324",
    "1.7976931348623157e308",
    "1.7976931348623158e308",
    "1.7976931348623159e308",
    "1e-7",
    "1e-6",
    "1.5e-5",
    "0.000001",
    "0.0000001",
    "1e99999999999999999999",
    "0e99999999999999999999",
    "1e-99999999999999999999",
    "0." + "0" * 500 + "1",
    "1" + "0" * 400 + ".0",
    "0.30000000000000004",
    "100000000000000000000.0",
    "4.35",
    "2.5e-7",
    "9.999999999999999e20",
    "9.999999999999999e22",
    "1.0e-1",
    "01",
    "1.",
    ".5",
    "+1",
    "1e",
    "-",
    "--1",
    "1e+",
    "0x10",
    "Infinity",
    "NaN",
    "1_0",
]


def test_numbers_agree() -> None:
    texts = [('{"n":' + n + "}").encode() for n in NUMBERS]
    go = go_keys(texts)
    mism = [(n, g, py_key(t)) for n, t, g in zip(NUMBERS, texts, go, strict=True) if norm(g) != norm(py_key(t))]
    assert not mism, mism


STRINGS = [
    r'"\u0000"',
    r'"\/"',
    '"\x7f"',
    '"\u2028\u2029"',
    r'"\uD834\uDD1E"',
    r'"\uDD1E"',
    r'"\uD834"',
    r'"\uD834\u0041"',
    r'"\uD834\n"',
    r'"\uD834\uZZZZ"',
    r'"\uD834\u',
    r'"\uDBFF\uDFFF"',
    r'"\u00e9"',
    '"é"',
    '"e\u0301"',
    r'"\ud834\udd1e"',
    '"\t"',
    r'"\a"',
    r'"\U0041"',
    r'"\u004"',
    '"\ufeff"',
    '"\U0001f600"',
]


def test_strings_agree() -> None:
    texts = [('{"s":' + s + "}").encode() for s in STRINGS] + [("{" + s + ":1}").encode() for s in STRINGS]
    go = go_keys(texts)
    mism = [(t, g, py_key(t)) for t, g in zip(texts, go, strict=True) if norm(g) != norm(py_key(t))]
    assert not mism, mism


def test_whitespace_and_bom_agree() -> None:
    texts = [
        b' {"a":1} ',
        b'\t{"a":1}\r',
        b'\xef\xbb\xbf{"a":1}',
        b'{"a":1}\x0b',
        b'{"a":1}\x0c',
        b'\xc2\xa0{"a":1}',
        b'{"a" : [ 1 , 2 ] }',
        b'{"a":1}\x00',
        b'{"a":"\xff"}',
        b'{"a":"\xed\xa0\x80"}',
        b'{"a":"\xc0\xaf"}',
        b'{"a":1,"a":1}',
        b'{"a":1,"\\u0061":1}',
        b"[]",
        b'"x"',
        b"{}",
        b'{"a":tru}',
        b'{"a":nul}',
        b'{"a":1,}',
        b"[" * 64 + b"]" * 64,
        b'{"a":' + b"[" * 62 + b"]" * 62 + b"}",
    ]
    go = go_keys(texts)
    mism = [(t, g, py_key(t)) for t, g in zip(texts, go, strict=True) if norm(g) != norm(py_key(t))]
    assert not mism, mism


def _rand_number(r: random.Random) -> str:
    k = r.random()
    if k < 0.3:
        return repr(r.choice([-1.0, 1.0]) * r.random() * 10.0 ** r.randint(-300, 300))
    if k < 0.5:
        return str(r.randint(-(2**54), 2**54))
    if k < 0.7:
        mant = str(r.randint(0, 10 ** r.randint(1, 25)))
        frac = "." + str(r.randint(0, 10 ** r.randint(1, 25))) if r.random() < 0.5 else ""
        exp = r.choice(["e", "E"]) + r.choice(["", "+", "-"]) + str(r.randint(0, 400)) if r.random() < 0.6 else ""
        return r.choice(["", "-"]) + mant + frac + exp
    import struct

    f = struct.unpack("<d", r.getrandbits(64).to_bytes(8, "little"))[0]
    return repr(f) if f == f and abs(f) != float("inf") else "0"


def _rand_value(r: random.Random, d: int) -> str:
    k = r.random()
    if d > 3 or k < 0.4:
        return _rand_number(r)
    if k < 0.6:
        chars = [
            chr(r.choice([r.randint(0x20, 0x7E), r.randint(0x80, 0xD7FF), r.randint(0xE000, 0xFFFF), r.randint(0x10000, 0x10FFFF)]))
            for _ in range(r.randint(0, 6))
        ]
        return json.dumps("".join(c for c in chars if not 0xD800 <= ord(c) <= 0xDFFF), ensure_ascii=r.random() < 0.5)
    if k < 0.8:
        return "[" + ",".join(_rand_value(r, d + 1) for _ in range(r.randint(0, 4))) + "]"
    names = set()
    for _ in range(r.randint(0, 5)):
        names.add(
            "".join(
                chr(r.choice([r.randint(0x61, 0x63), 0xE000 + r.randint(0, 3), 0x1F600 + r.randint(0, 3), 0xFF61]))
                for _ in range(r.randint(0, 3))
            )
        )
    return "{" + ",".join(json.dumps(n, ensure_ascii=r.random() < 0.5) + ":" + _rand_value(r, d + 1) for n in names) + "}"


def test_random_documents_agree() -> None:
    r = random.Random(25)
    texts = []
    for _ in range(4000):
        texts.append(("{" + '"v":' + _rand_value(r, 0) + "}").encode())
    go = go_keys(texts)
    assert len(go) == len(texts)
    mism = [(t, g, py_key(t)) for t, g in zip(texts, go, strict=True) if norm(g) != norm(py_key(t))]
    assert not mism, mism[:5]


def test_args_with_a_key_fit_in_a_job_body() -> None:
    """Args nested 64 deep: call_key and `publisher key --args` give a key,
    but the same args inside a job body (one level more) are refused by the
    strict body parse every consumer applies: a key for a job no consumer
    will take."""
    args = '{"a":' + "[" * 63 + "]" * 63 + "}"
    py = toolq.call_key(conversation_id="c-1", turn_index=3, tool="pay", args=args)
    flag = subprocess.run(
        [publisher(), "key", "--conversation", "c-1", "--turn", "3", "--tool", "pay", "--args", args], capture_output=True, text=True
    ).stdout.strip()
    [body] = go_keys([args.encode()])
    assert py == flag
    assert body == py, body


GO_RULES = {
    "invalid JSON": "syntax",
    "duplicate member name": "duplicate_name",
    "number outside the double range": "number_range",
    "invalid UTF-8": "invalid_utf8",
    "not a JSON object": "not_object",
}


def test_bytes_are_refused_for_the_rule_go_names() -> None:
    """Python decodes the whole byte string first, so any invalid UTF-8
    anywhere is reported as invalid_utf8, before (or instead of) the rule
    Go reports at the first offset it breaks; Go only checks UTF-8 inside
    strings."""
    cases = [b'{"a":1}\xff', b'{"a":1,"a":"\xff"}', b'{"a":1e400,"b":"\xff"}', b"\xff{}"]
    for c in cases:
        go = subprocess.run(
            [publisher(), "key", "--conversation", "c", "--turn", "0", "--tool", "t", "--args", c], capture_output=True
        ).stderr.decode(errors="replace")
        go_rule = next(v for k, v in GO_RULES.items() if k in go)
        try:
            toolq.call_key(conversation_id="c", turn_index=0, tool="t", args=c)
        except CallKeyError as e:
            assert e.rule == go_rule, (c, go_rule, e.rule)
