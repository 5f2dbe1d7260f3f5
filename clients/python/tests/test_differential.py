"""Go, TypeScript and Python derive the same key for thousands of random
documents, each in two spellings (other member order, whitespace, escapes and
number forms), with names drawn from characters that make member orders
disagree (names sharing a high surrogate: 👍 👎 😀, 𝄞 𝄢). The documents come
from the TypeScript client's generator (clients/typescript/test/respell.js),
the Go keys from `publisher key`."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

import toolq

REPO = Path(__file__).resolve().parents[3]
TS = REPO / "clients" / "typescript"
DOCUMENTS = 2500

GENERATE = """
import { respelled, rng } from %(respell)s;
import { callKey } from %(key)s;
const r = rng(Number(process.argv[1]));
const out = [];
for (let i = 0; i < Number(process.argv[2]); i++) {
  const [a, b] = respelled(r);
  const call = { conversationId: "conv-diff-" + (i %% 7), turnIndex: i, tool: "cast_vote", ordinal: i %% 3 };
  out.push(JSON.stringify({ ...call, a, b, ts: callKey({ ...call, args: a }) }));
}
console.log(out.join("\\n"));
"""


def missing(what: str) -> None:
    if os.environ.get("CI"):
        pytest.fail(f"{what} (CI is set: a missing tool is a failure)")
    pytest.skip(f"SKIPPED: {what}")


def test_go_typescript_and_python_agree_on_random_documents() -> None:
    if shutil.which("node") is None or not (TS / "dist" / "key.js").exists():
        missing("node, or the built TypeScript client (npm run build in clients/typescript)")
    if shutil.which("go") is None:
        missing("go, for publisher key")
    script = GENERATE % {"respell": json.dumps((TS / "test" / "respell.js").as_uri()), "key": json.dumps((TS / "dist" / "key.js").as_uri())}
    docs = [
        json.loads(line)
        for line in subprocess.run(
            ["node", "--input-type=module", "-e", script, "8785", str(DOCUMENTS)], check=True, capture_output=True, text=True
        ).stdout.split("\n")  # not splitlines: names hold U+2028
        if line
    ]
    assert len(docs) == DOCUMENTS
    astral = sum(1 for d in docs if any(ord(c) > 0xFFFF for c in d["a"]))
    assert astral > DOCUMENTS // 2, "the generator no longer draws names beyond the BMP"

    # Go: one job per line, the args as written (two spellings of each document).
    lines = []
    for d in docs:
        fields = {"conversation_id": d["conversationId"], "turn_index": d["turnIndex"], "tool": d["tool"], "ordinal": d["ordinal"]}
        head = json.dumps(fields)[:-1]
        lines += [head + ',"args":' + d["a"] + "}", head + ',"args":' + d["b"] + "}"]
    go = subprocess.run(
        ["go", "run", "./cmd/publisher", "key"], cwd=REPO, input="\n".join(lines) + "\n", check=True, capture_output=True, text=True
    ).stdout.split("\n")[:-1]
    assert len(go) == 2 * DOCUMENTS

    for i, d in enumerate(docs):
        call = dict(conversation_id=d["conversationId"], turn_index=d["turnIndex"], tool=d["tool"], ordinal=d["ordinal"])
        py_a, py_b = toolq.call_key(**call, args=d["a"]), toolq.call_key(**call, args=d["b"])
        assert py_a == py_b == d["ts"] == go[2 * i] == go[2 * i + 1], f"document {i}:\n {d['a']}\n {d['b']}"
