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
