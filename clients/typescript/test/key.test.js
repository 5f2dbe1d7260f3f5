// The key against the Go side: the shared vectors in jobs/testdata, and
// random documents run through `go run ./cmd/publisher key`.
import { test } from "node:test";
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { readFileSync } from "node:fs";
import { fileURLToPath } from "node:url";
import path from "node:path";
import { callKey, callMaterial, canonicalize, KeyError, MAX_DEPTH } from "../dist/index.js";
import { respelled, rng } from "./respell.js";

const repo = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "../../..");
const vectors = (name) =>
  readFileSync(path.join(repo, "jobs/testdata", name), "utf8")
    .split("\n")
    .filter((l) => l !== "")
    .map((l) => JSON.parse(l));

test("RFC 8785 vectors canonicalize as the RFC says", () => {
  const rows = vectors("rfc8785.jsonl");
  assert.ok(rows.length > 0);
  for (const v of rows) assert.equal(canonicalize(v.input), v.canonical, v.name);
});

test("python_keys vectors: canonical form, material and key", () => {
  const rows = vectors("python_keys.jsonl");
  assert.ok(rows.length >= 200);
  for (const [i, v] of rows.entries()) {
    const call = { conversationId: v.conversation_id, turnIndex: v.turn_index, tool: v.tool, ordinal: v.ordinal, args: v.args_wire };
    const m = callMaterial(call);
    assert.equal(m.canonical, v.canonical, `row ${i}`);
    assert.equal(m.text, v.material, `row ${i}`);
    assert.equal(callKey(call), v.key, `row ${i}`);
  }
});

test("utf16_keys vectors: names sharing a high surrogate, U+E000..U+FFFF after astral", () => {
  const rows = vectors("utf16_keys.jsonl");
  assert.ok(rows.length >= 200);
  for (const [i, v] of rows.entries()) {
    const call = { conversationId: v.conversation_id, turnIndex: v.turn_index, tool: v.tool, ordinal: v.ordinal, args: v.args_wire };
    const m = callMaterial(call);
    assert.equal(m.canonical, v.canonical, `row ${i}: ${v.args_wire}`);
    assert.equal(m.text, v.material, `row ${i}`);
    assert.equal(callKey(call), v.key, `row ${i}`);
  }
});

test("member order and spelling never change a key", () => {
  const r = rng(8785);
  const base = { conversationId: "conv-order", turnIndex: 2, tool: "cast_vote" };
  for (let i = 0; i < 5000; i++) {
    const [a, b] = respelled(r);
    const ka = callKey({ ...base, args: a });
    assert.equal(callKey({ ...base, args: b }), ka, `one object, two keys:\n ${a}\n ${b}`);
    assert.equal(callKey({ ...base, args: JSON.parse(b) }), ka, `the JS value of ${b}`);
  }
});

test("every rejection vector is refused for its rule", () => {
  const rows = vectors("reject.jsonl");
  assert.ok(rows.length >= 40);
  for (const v of rows) {
    const c = v.call;
    const args = c.args_hex !== undefined ? new Uint8Array(Buffer.from(c.args_hex, "hex")) : c.args;
    assert.throws(
      () => callKey({ conversationId: c.conversation_id, turnIndex: c.turn_index, tool: c.tool, ordinal: c.ordinal, args }),
      (err) => err instanceof KeyError && err.code === v.error && err.message.startsWith("toolq: "),
      v.name,
    );
  }
});

test("a JS value is checked for what JSON.stringify would coerce", () => {
  const base = { conversationId: "c1", turnIndex: 1, tool: "send_payment" };
  assert.equal(callKey({ ...base, args: { b: 1, a: "x" } }), callKey({ ...base, args: '{"a":"x","b":1}' }));
  const refused = [
    [{ x: NaN }, "number_range"],
    [{ x: Infinity }, "number_range"],
    [{ x: 1e16 }, "unsafe_integer"],
    [{ x: "\ud800" }, "lone_surrogate"],
    [{ ["\udc00"]: 1 }, "lone_surrogate"],
    [{ x: undefined }, "syntax"],
    [{ x: 1n }, "syntax"],
    [{ x: new Date(0) }, "syntax"],
    [[1], "not_object"],
    [null, "not_object"],
  ];
  for (const [args, code] of refused) {
    assert.throws(() => callKey({ ...base, args }), (err) => err instanceof KeyError && err.code === code, JSON.stringify(String(args)));
  }
  let deep = {};
  for (let i = 1; i < MAX_DEPTH; i++) deep = { a: deep };
  callKey({ ...base, args: deep }); // 64 levels
  assert.throws(() => callKey({ ...base, args: { a: deep } }), (err) => err.code === "too_deep");
  assert.throws(() => callKey({ ...base, args: '{"x":"\ud800"}' }), (err) => err.code === "lone_surrogate", "a raw lone surrogate in the text");
  assert.throws(() => callKey({ ...base, turnIndex: 1.5, args: "{}" }), (err) => err.code === "field:turn_index");
  assert.throws(() => callKey({ ...base, ordinal: 2 ** 53, args: "{}" }), (err) => err.code === "field:ordinal");
});

const CHARS = ["a", "Z", "0", " ", "_", '"', "\\", "/", "\n", "\t", "\u0001", "\u001f", "\u007f", "é", "ß", "€", "\u2028", "中", "한", "\ue000", "\uff61", "\ufb33", "\ufffd", "😀", "👍", "👎", "𝄞", "𝄢", "\u{100000}", "\u{10fffe}", "\u{10ffff}", "\u{1f600}", "\u{20000}"];

function genDoc(r) {
  const pick = (a) => a[Math.floor(r() * a.length)];
  // No raw line break: each document is one line of JSON Lines for Go.
  const ws = () => (r() < 0.7 ? "" : pick([" ", "\t", " \t ", "  "]));
  const rawString = () => {
    let s = "";
    const n = Math.floor(r() * 8);
    for (let i = 0; i < n; i++) s += pick(CHARS);
    return s;
  };
  const spell = (s) => {
    // Write s as a JSON string, escaping some characters that need no escape.
    let out = '"';
    for (const ch of s) {
      const cp = ch.codePointAt(0);
      const mustEscape = ch === '"' || ch === "\\" || cp < 0x20;
      if (mustEscape || r() < 0.3) {
        for (let i = 0; i < ch.length; i++) {
          const hex = ch.charCodeAt(i).toString(16).padStart(4, "0");
          out += "\\u" + (r() < 0.5 ? hex : hex.toUpperCase());
        }
      } else {
        out += ch;
      }
    }
    return out + '"';
  };
  const number = () => {
    switch (Math.floor(r() * 7)) {
      case 0:
        return String(Math.floor((r() - 0.5) * 2 * 2 ** 53));
      case 1:
        return String(Math.floor((r() - 0.5) * 2000));
      case 2:
        return ((r() - 0.5) * 10 ** Math.floor(r() * 30 - 15)).toPrecision(1 + Math.floor(r() * 17));
      case 3:
        return `${Math.floor(r() * 1000)}.${"0".repeat(Math.floor(r() * 3))}${Math.floor(r() * 100)}`;
      case 4:
        return `${r() < 0.5 ? "-" : ""}${1 + Math.floor(r() * 9)}.${Math.floor(r() * 1e6)}${pick(["e", "E"])}${pick(["", "+", "-"])}${Math.floor(r() * 300)}`;
      case 5:
        return pick(["0", "-0", "0.0", "1E21", "1e-7", "4.50", "2e-3", "333333333.33333329", "1E30", "9007199254740992", "-9007199254740992", "5e-324", "1.7976931348623157e308", "1e-400", "2.4703282292062328e-324", "999999999999999999999.0", "1e21", "-1E+20", "0.000001", "1e-7"]);
      default:
        return String(r() * 10 ** Math.floor(r() * 40 - 20));
    }
  };
  const value = (depth) => {
    const k = r();
    if (depth < 5 && k < 0.18) return object(depth + 1);
    if (depth < 5 && k < 0.3) return "[" + ws() + Array.from({ length: Math.floor(r() * 4) }, () => value(depth + 1)).join(ws() + "," + ws()) + ws() + "]";
    if (k < 0.6) return spell(rawString());
    if (k < 0.9) return number();
    return pick(["true", "false", "null"]);
  };
  const object = (depth) => {
    const names = new Set();
    const members = [];
    const n = Math.floor(r() * 6);
    for (let i = 0; i < n; i++) {
      const name = rawString();
      if (names.has(name)) continue;
      names.add(name);
      members.push(ws() + spell(name) + ws() + ":" + ws() + value(depth));
    }
    return "{" + members.join(",") + ws() + "}";
  };
  return ws() + object(0) + ws();
}

// Mutations that every implementation must refuse, each for its rule.
const MUTATIONS = [
  [(d) => d.replace(/^(\s*)\{/, '$1{"dup":1,"d\\u0075p":2,'), "duplicate_name"],
  [(d) => d.replace(/^(\s*)\{/, '$1{"x":"\\ud83d",'), "lone_surrogate"],
  [(d) => d.replace(/^(\s*)\{/, '$1{"x":"\\ude00y",'), "lone_surrogate"],
  [(d) => d.replace(/^(\s*)\{/, '$1{"x":1e16,'), "unsafe_integer"],
  [(d) => d.replace(/^(\s*)\{/, '$1{"x":-90071992547409930,'), "unsafe_integer"],
  [(d) => d.replace(/^(\s*)\{/, '$1{"x":2e400,'), "number_range"],
  [(d) => d.replace(/^(\s*)\{/, `$1{"x":${"[".repeat(MAX_DEPTH)}${"]".repeat(MAX_DEPTH)},`), "too_deep"],
  [(d) => `[${d}]`, "not_object"],
  [(d) => d + ",", "syntax"],
];

const GO_RULES = [
  ["jcs: duplicate member name", "duplicate_name"],
  ["jcs: lone surrogate escape", "lone_surrogate"],
  ["jcs: integer beyond", "unsafe_integer"],
  ["jcs: number outside the double range", "number_range"],
  ["jcs: nesting deeper", "too_deep"],
  ["jcs: not a JSON object", "not_object"],
  ["jcs: invalid JSON", "syntax"],
];

function acceptedByTS(doc) {
  try {
    canonicalize(doc, true);
    return true;
  } catch {
    return false;
  }
}

test("agrees with `publisher key` on random documents", { timeout: 300_000 }, (t) => {
  const r = rng(20261203);
  const cases = [];
  for (let i = 0; i < 1500; i++) {
    let doc = genDoc(r);
    let want = null;
    if (i % 5 === 4 && acceptedByTS(doc)) {
      const [mutate, rule] = MUTATIONS[Math.floor(r() * MUTATIONS.length)];
      doc = mutate(doc);
      want = rule;
    }
    cases.push({ call: { conversationId: `conv_${i}`, turnIndex: i % 97, tool: i % 2 ? "send_payment" : "search_orders", ordinal: i % 3, args: doc }, want });
  }
  // One object in two spellings (members in another order, other escapes
  // and number spellings): Go and TypeScript give both one key.
  const pairs = [];
  for (let i = 0; i < 2500; i++) {
    const [a, b] = respelled(r);
    pairs.push(cases.length);
    for (const args of [a, b]) cases.push({ call: { conversationId: `conv_pair_${i}`, turnIndex: i % 89, tool: "cast_vote", ordinal: 0, args }, want: null });
  }
  const input =
    cases
      .map(({ call: c }) => `{"conversation_id":"${c.conversationId}","turn_index":${c.turnIndex},"tool":"${c.tool}","ordinal":${c.ordinal},"args":${c.args}}`)
      .join("\n") + "\n";
  let out;
  try {
    out = execFileSync("go", ["run", "./cmd/publisher", "key"], { cwd: repo, input, encoding: "utf8", maxBuffer: 64 << 20 });
  } catch (err) {
    if (typeof err.stdout !== "string" || err.stdout === "") throw err;
    out = err.stdout; // it exits non-zero when a line is rejected
  }
  const lines = out.split("\n").slice(0, cases.length);
  assert.equal(lines.length, cases.length);
  let valid = 0;
  for (const [i, { call, want }] of cases.entries()) {
    const goLine = lines[i];
    let ts;
    try {
      ts = callKey(call);
    } catch (err) {
      assert.ok(err instanceof KeyError, String(err));
      ts = err;
    }
    const goRule = goLine.startsWith("error: ") ? (GO_RULES.find(([text]) => goLine.includes(text))?.[1] ?? goLine) : null;
    if (want !== null) {
      assert.ok(ts instanceof KeyError, `case ${i} was accepted: ${call.args}`);
      assert.equal(ts.code, want, `case ${i}: ${ts.message}`);
    }
    if (goRule === null) {
      assert.equal(ts, goLine, `case ${i}: ${call.args}`);
      valid++;
    } else {
      assert.ok(ts instanceof KeyError, `case ${i}: Go refused (${goLine}), TS accepted ${call.args}`);
      assert.equal(ts.code, goRule, `case ${i}: ${goLine} / ${ts.message}`);
    }
  }
  for (const i of pairs) {
    assert.equal(lines[i + 1], lines[i], `one object, two keys in Go:\n ${cases[i].call.args}\n ${cases[i + 1].call.args}`);
  }
  t.diagnostic(`${valid} documents keyed alike, ${cases.length - valid} refused alike, ${pairs.length} respelled pairs`);
  assert.ok(valid >= 6000, `${valid} valid documents`);
});

test("tenants: the default tenant's keys are unchanged, a tenant's material starts with tenant|", () => {
  const call = { conversationId: "conv-1", turnIndex: 3, tool: "send_payment", args: '{"currency":"EUR","amount":1}' };
  // The keys jobs/tenant_test.go pins on the Go side.
  assert.equal(callKey(call), "ab2f01b88ac510ba073855c5f886b155");
  assert.equal(callKey({ ...call, tenant: "" }), "ab2f01b88ac510ba073855c5f886b155");
  const m = callMaterial({ ...call, tenant: "acme" });
  assert.equal(m.text, 'acme|conv-1|3|send_payment|0|{"amount":1,"currency":"EUR"}');
  assert.equal(callKey({ ...call, tenant: "acme" }), "b838ba7140c66d071dd2e52a36af10b4");
  for (const bad of ["jobs", "results", "dlq", "approvals", "decide", "ledger", "tools", "a.b", "*", ">", "x".repeat(65)]) {
    assert.throws(() => callKey({ ...call, tenant: bad }), (e) => e instanceof KeyError && e.field === "tenant", bad);
  }
});
