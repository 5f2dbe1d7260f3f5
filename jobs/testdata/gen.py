#!/usr/bin/env python3
"""Generates the Python-formula key vectors and the rejection corpus.

Run from this folder: python3 gen.py. The outputs are committed; the Go tests
read them, so an agent written in Python is held to the same keys as toolq.
"""
import hashlib
import json
import random

rng = random.Random(8785)
# Python escapes DEL (0x7f) as \u007f where RFC 8785 keeps it literal: leave it out.
ASCII = "".join(chr(c) for c in range(0x00, 0x7f))


def rand_str(n):
    return "".join(rng.choice(ASCII) for _ in range(rng.randint(0, n)))


def rand_value(depth):
    kind = rng.randint(0, 6 if depth < 4 else 3)
    if kind == 0:
        return rng.randint(-(2**53), 2**53)
    if kind == 1:
        return rand_str(12)
    if kind == 2:
        return rng.choice([True, False, None])
    if kind == 3:
        return rng.randint(-1000, 1000)
    if kind == 4:
        return [rand_value(depth + 1) for _ in range(rng.randint(0, 4))]
    return rand_obj(depth + 1)


def rand_obj(depth):
    return {rand_str(8): rand_value(depth) for _ in range(rng.randint(0, 5))}


def key_of(conv, turn, tool, ordinal, args):
    canonical = json.dumps(args, sort_keys=True, separators=(",", ":"))
    material = f"{conv}|{turn}|{tool}|{ordinal}|{canonical}"
    return canonical, material, hashlib.sha256(material.encode()).hexdigest()[:32]


with open("python_keys.jsonl", "w") as out:
    for i in range(200):
        conv = "conv_" + "".join(rng.choice("abcdefXYZ0189_:-") for _ in range(rng.randint(1, 20)))
        turn, ordinal = rng.randint(0, 500), rng.randint(0, 9)
        tool = rng.choice(["send_payment", "create_ticket", "search_orders", "t-1"])
        args = rand_obj(0)
        # The wire form is shuffled and spaced: the key must not depend on it.
        items = list(args.items())
        rng.shuffle(items)
        wire = "{" + ", ".join(json.dumps(k) + " : " + json.dumps(v, indent=rng.choice([None, 1])) for k, v in items) + "}"
        canonical, material, key = key_of(conv, turn, tool, ordinal, args)
        out.write(json.dumps({
            "conversation_id": conv, "turn_index": turn, "tool": tool, "ordinal": ordinal,
            "args_wire": wire, "canonical": canonical, "material": material, "key": key,
        }) + "\n")


# utf16_keys.jsonl: keys of args whose member names make orders disagree.
# RFC 8785 sorts names by their UTF-16 code units, all of them: 👍 (U+1F44D)
# before 👎 (U+1F44E), though both begin with the high surrogate U+D83D, and
# U+E000..U+FFFF after every astral character. Before the fix toolq compared
# only the first code unit of the first character that differs, and so kept
# names sharing a high surrogate in the order they were written: each row
# whose legacy form differs gives it (legacy_canonical, legacy_key), which a
# worker still looks up so that a call settled before the upgrade is not run
# again. Values are integers, spelled on the wire as 1, 1.0, 1e0, 10E-1, -0;
# names with and without escapes.
ORDER_CHARS = ["a", "b", "\u00e9", "\ue000", "\uffff", "\ufb33", "\U0001F600", "\U0001F44D", "\U0001F44E",
               "\U0001D11E", "\U0001D122", "\U00100000", "\U0010FFFE", "\U0010FFFF"]


def utf16_key(s):
    return s.encode("utf-16-be")


def legacy_cmp(a, b):
    # The legacy comparison, as Go's compareLegacy: the first UTF-16 unit of
    # the first character that differs; a prefix first.
    for ca, cb in zip(a, b):
        if ca != cb:
            return utf16_key(ca)[:2] > utf16_key(cb)[:2] and 1 or (utf16_key(ca)[:2] < utf16_key(cb)[:2] and -1 or 0)
    return (len(a) > len(b)) - (len(a) < len(b))


def legacy_sort(pairs):
    # Go's slices.SortFunc sorts up to 12 elements by insertion sort: stable,
    # so names that compare equal keep their written order.
    assert len(pairs) <= 12
    out = list(pairs)
    for i in range(1, len(out)):
        j = i
        while j > 0 and legacy_cmp(out[j][0], out[j - 1][0]) < 0:
            out[j], out[j - 1] = out[j - 1], out[j]
            j -= 1
    return out


def canon(v, legacy=False):
    # v: ("obj", [(name, v)...] in written order) | ("arr", [...]) | int | str | bool | None
    if isinstance(v, tuple) and v[0] == "obj":
        pairs = legacy_sort(v[1]) if legacy else sorted(v[1], key=lambda p: utf16_key(p[0]))
        return "{" + ",".join(json.dumps(k, ensure_ascii=False) + ":" + canon(x, legacy) for k, x in pairs) + "}"
    if isinstance(v, tuple):
        return "[" + ",".join(canon(x, legacy) for x in v[1]) + "]"
    if isinstance(v, bool) or v is None:
        return json.dumps(v)
    if isinstance(v, int):
        return str(v)
    return json.dumps(v, ensure_ascii=False)


def spell(v):
    if isinstance(v, tuple) and v[0] == "obj":
        return "{" + ",".join(json.dumps(k, ensure_ascii=rng.random() < 0.5) + ":" + spell(x) for k, x in v[1]) + "}"
    if isinstance(v, tuple):
        return "[" + ",".join(spell(x) for x in v[1]) + "]"
    if isinstance(v, bool) or v is None:
        return json.dumps(v)
    if isinstance(v, int):
        if v == 0:
            return rng.choice(["0", "-0", "0.0", "-0.0", "0e5"])
        return rng.choice([str(v), f"{v}.0", f"{v}e0", f"{v * 10}E-1", f"{v}0e-1"])
    return json.dumps(v, ensure_ascii=rng.random() < 0.5)


def order_name():
    return "".join(rng.choice(ORDER_CHARS) for _ in range(rng.randint(1, 3)))


def order_value(depth):
    kind = rng.randint(0, 5 if depth < 3 else 2)
    if kind == 0:
        return rng.randint(-1000, 1000)
    if kind == 1:
        return order_name()
    if kind == 2:
        return rng.choice([True, False, None, 0])
    if kind == 3:
        return ("arr", [order_value(depth + 1) for _ in range(rng.randint(0, 3))])
    return order_obj(depth + 1)


def order_obj(depth):
    names = list(dict.fromkeys(order_name() for _ in range(rng.randint(0, 6))))
    return ("obj", [(n, order_value(depth)) for n in names])


FIXED = [
    ("obj", [("votes", ("obj", [("\U0001F44E", 3), ("\U0001F44D", 12)]))]),
    ("obj", [("\U0001F44D", 12), ("\U0001F44E", 3)]),
    ("obj", [("\uffff", 1), ("\ue000", 2), ("\U0001F44D", 3), ("\ufb33", 4), ("\u00e9", 5)]),
    ("obj", [("a\U0001F44E", 1), ("a\U0001F44D", 2), ("a", 3)]),
    ("obj", [("\U0010FFFF", 1), ("\U0010FFFE", 2), ("\U00100000", 3)]),
    ("obj", [("\U0001D122", 0), ("\U0001D11E", 1)]),
]

with open("utf16_keys.jsonl", "w") as out:
    for i in range(200):
        args = FIXED[i] if i < len(FIXED) else order_obj(0)
        conv = f"conv_utf16_{i}"
        turn, ordinal = rng.randint(0, 500), rng.randint(0, 3)
        tool = rng.choice(["cast_vote", "send_payment"])
        canonical = canon(args)
        material = f"{conv}|{turn}|{tool}|{ordinal}|{canonical}"
        row = {"conversation_id": conv, "turn_index": turn, "tool": tool, "ordinal": ordinal, "args_wire": spell(args),
               "canonical": canonical, "material": material, "key": hashlib.sha256(material.encode()).hexdigest()[:32]}
        legacy = canon(args, legacy=True)
        if legacy != canonical:
            lm = f"{conv}|{turn}|{tool}|{ordinal}|{legacy}"
            row["legacy_canonical"] = legacy
            row["legacy_key"] = hashlib.sha256(lm.encode()).hexdigest()[:32]
        out.write(json.dumps(row) + "\n")
