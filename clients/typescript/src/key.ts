// The idempotency key of a tool call, byte for byte as the Go side derives it
// (jobs.Call.Key, `publisher key`):
//
//   hex(sha256(conversation_id|turn_index|tool|ordinal|canonical(args)))[:32]
//
// where canonical is RFC 8785. The arguments are parsed here by a strict
// parser of their JSON text, with the rules of the Go package internal/jcs,
// because JSON.parse loses exactly what those rules look at: a duplicate
// member name, a lone surrogate escape, the spelling of an integer beyond
// 2^53. Everything that could make two agents derive different keys for the
// same call is refused with a KeyError, never coerced.

import { createHash } from "node:crypto";

/** The deepest nesting of arrays and objects accepted (Go: jcs.MaxDepth). */
export const MAX_DEPTH = 64;

/** The length of a key in hexadecimal characters (128 bits). */
export const KEY_LEN = 32;

export const CONVERSATION_ID_PATTERN = /^[A-Za-z0-9_:-]{1,128}$/;
export const TOOL_NAME_PATTERN = /^[a-zA-Z0-9_-]{1,64}$/;
/** A tenant's name (docs/tenants.md): one subject token, and none of RESERVED_TENANTS. */
export const TENANT_PATTERN = /^[A-Za-z0-9_-]{1,64}$/;
/** The second tokens of the default tenant's subjects, which no tenant may take. */
export const RESERVED_TENANTS: readonly string[] = ["jobs", "results", "dlq", "approvals", "decide", "ledger", "tools"];

/** Whether t may name a tenant: "" (the default tenant) or TENANT_PATTERN and not reserved. */
export function validTenant(t: string): boolean {
  return t === "" || (TENANT_PATTERN.test(t) && !RESERVED_TENANTS.includes(t));
}
export const TOOL_USE_ID_PATTERN = /^[A-Za-z0-9_-]{1,128}$/;

/**
 * The rule a call broke. "field" names an identifying field (see
 * KeyError.field); the others are the rules of the arguments' JSON, each the
 * Go side's sentinel error of the same name.
 */
export type KeyRule =
  | "field"
  | "syntax"
  | "not_object"
  | "duplicate_name"
  | "invalid_utf8"
  | "lone_surrogate"
  | "number_range"
  | "unsafe_integer"
  | "too_deep";

/** A call that has no key: a field breaks its pattern, or the arguments a rule. */
export class KeyError extends Error {
  /** The rule that was broken. */
  readonly rule: KeyRule;
  /** The field: tenant, conversation_id, turn_index, tool, ordinal, tool_use_id or args. */
  readonly field: string;
  /** For an args rule, the offset in the JSON text (UTF-16 code units) where it broke. */
  readonly offset?: number;

  constructor(rule: KeyRule, field: string, message: string, offset?: number) {
    super(offset === undefined ? `toolq: ${field}: ${message}` : `toolq: ${field}: ${message} at offset ${offset}`);
    this.name = "KeyError";
    this.rule = rule;
    this.field = field;
    this.offset = offset;
  }

  /** The rule in the form of the test vectors: "field:<name>" or the args rule. */
  get code(): string {
    return this.rule === "field" ? `field:${this.field}` : this.rule;
  }
}

/**
 * The arguments of a call. Give the JSON text the model streamed (a string, or
 * its UTF-8 bytes): every rule is then checked exactly. A JS value is accepted
 * too, with the limits of one that JSON.parse already made: an integer beyond
 * 2^53 it rounded cannot be told apart any more (9007199254740993 arrives as
 * 9007199254740992 and is accepted), and duplicate names are gone. Non-finite
 * numbers, lone surrogates, values JSON cannot hold (undefined, functions,
 * bigint, symbols) and objects other than plain ones are refused.
 */
export type Args = string | Uint8Array | Record<string, unknown>;

/** One tool call for the purpose of its key; the tool_use_id is not part of it. */
export interface Call {
  /** The tenant whose call it is (docs/tenants.md); absent or "": the default tenant, whose keys are unchanged. */
  tenant?: string;
  conversationId: string;
  turnIndex: number;
  tool: string;
  ordinal?: number;
  args: Args;
}

/** The exact text a key is hashed from, and the canonical arguments inside it. */
export interface Material {
  /** [tenant|]conversation_id|turn_index|tool|ordinal|canonical(args) */
  text: string;
  /** canonical(args), RFC 8785 */
  canonical: string;
}

/** Checks the identifying fields of the call; throws a KeyError naming the first that is wrong. */
export function validateCall(call: Omit<Call, "args">): void {
  if (call.tenant !== undefined && (typeof call.tenant !== "string" || !validTenant(call.tenant))) {
    throw new KeyError("field", "tenant", `must match ${TENANT_PATTERN.source} and not be ${RESERVED_TENANTS.join(", ")}`);
  }
  if (typeof call.conversationId !== "string" || !CONVERSATION_ID_PATTERN.test(call.conversationId)) {
    throw new KeyError("field", "conversation_id", `must match ${CONVERSATION_ID_PATTERN.source}`);
  }
  if (!isIndex(call.turnIndex)) {
    throw new KeyError("field", "turn_index", "must be a non-negative safe integer");
  }
  if (typeof call.tool !== "string" || !TOOL_NAME_PATTERN.test(call.tool)) {
    throw new KeyError("field", "tool", `must match ${TOOL_NAME_PATTERN.source}`);
  }
  if (call.ordinal !== undefined && !isIndex(call.ordinal)) {
    throw new KeyError("field", "ordinal", "must be a non-negative safe integer");
  }
}

function isIndex(n: unknown): n is number {
  return typeof n === "number" && Number.isSafeInteger(n) && n >= 0;
}

/** Validates the call and returns the material its key is hashed from. Throws a KeyError. */
export function callMaterial(call: Call): Material {
  validateCall(call);
  const canonical = canonicalizeArgs(call.args);
  const prefix = call.tenant ? `${call.tenant}|` : ""; // only a tenant's: the default tenant's material is unchanged
  const text = `${prefix}${call.conversationId}|${call.turnIndex}|${call.tool}|${call.ordinal ?? 0}|${canonical}`;
  return { text, canonical };
}

/** The idempotency key of the call, 32 hexadecimal characters. Throws a KeyError. */
export function callKey(call: Call): string {
  return keyOf(callMaterial(call));
}

/** Hashes material into its key. */
export function keyOf(m: Material): string {
  return createHash("sha256").update(m.text, "utf8").digest("hex").slice(0, KEY_LEN);
}

/** canonical(args): the RFC 8785 form of a JSON object. Throws a KeyError (field "args"). */
export function canonicalizeArgs(args: Args): string {
  let text: string;
  if (typeof args === "string") {
    text = args;
  } else if (args instanceof Uint8Array) {
    try {
      text = new TextDecoder("utf-8", { fatal: true, ignoreBOM: true }).decode(args);
    } catch {
      throw new KeyError("invalid_utf8", "args", "invalid UTF-8");
    }
  } else if (isPlainObject(args)) {
    checkValue(args, 0);
    text = JSON.stringify(args);
  } else {
    throw new KeyError("not_object", "args", "not a JSON object: give the JSON text or a plain object");
  }
  return canonicalize(text, true);
}

function isPlainObject(v: unknown): v is Record<string, unknown> {
  if (typeof v !== "object" || v === null || Array.isArray(v)) return false;
  const proto = Object.getPrototypeOf(v);
  return proto === Object.prototype || proto === null;
}

// checkValue refuses, in a JS value, what JSON.stringify would coerce or drop.
function checkValue(v: unknown, depth: number): void {
  switch (typeof v) {
    case "string":
    case "boolean":
      return;
    case "number":
      if (!Number.isFinite(v)) throw new KeyError("number_range", "args", `non-finite number ${v}`);
      return;
    case "object":
      if (v === null) return;
      if (depth + 1 > MAX_DEPTH) throw new KeyError("too_deep", "args", `nesting deeper than ${MAX_DEPTH} levels`);
      if (Array.isArray(v)) {
        for (let i = 0; i < v.length; i++) {
          if (!(i in v)) throw new KeyError("syntax", "args", "an array with a hole");
          checkValue(v[i], depth + 1);
        }
        return;
      }
      if (!isPlainObject(v)) throw new KeyError("syntax", "args", "an object that is not a plain object");
      for (const [k, item] of Object.entries(v)) {
        checkValue(k, depth);
        checkValue(item, depth + 1);
      }
      return;
    default:
      throw new KeyError("syntax", "args", `a ${typeof v} has no JSON form`);
  }
}

/**
 * The RFC 8785 form of a JSON text, under the rules of the Go side's
 * jcs.Canonicalize; with mustBeObject, anything but an object is refused.
 * Throws a KeyError (field "args").
 */
export function canonicalize(text: string, mustBeObject = false): string {
  const p = new Parser(text);
  p.skipSpace();
  const v = p.value(0);
  p.skipSpace();
  if (p.pos !== text.length) p.fail("syntax", "data after the top-level value");
  if (mustBeObject && v.kind !== "object") {
    throw new KeyError("not_object", "args", `not a JSON object: found ${v.kind}`, 0);
  }
  return serialize(v);
}

type Value =
  | { kind: "null" | "boolean"; lit: string }
  | { kind: "number"; n: number }
  | { kind: "string"; s: string }
  | { kind: "array"; items: Value[] }
  | { kind: "object"; members: [string, Value][] };

// 2^53 in decimal: the largest magnitude at which every integer has its own double.
const MAX_SAFE = "9007199254740992";

class Parser {
  pos = 0;
  constructor(readonly in_: string) {}

  fail(rule: KeyRule, detail: string, at = this.pos): never {
    throw new KeyError(rule, "args", detail, at);
  }

  skipSpace(): void {
    for (; this.pos < this.in_.length; this.pos++) {
      const c = this.in_[this.pos];
      if (c !== " " && c !== "\t" && c !== "\n" && c !== "\r") return;
    }
  }

  value(depth: number): Value {
    if (this.pos >= this.in_.length) this.fail("syntax", "unexpected end of input");
    const c = this.in_[this.pos];
    if (c === "{") return this.object(depth + 1);
    if (c === "[") return this.array(depth + 1);
    if (c === '"') return { kind: "string", s: this.string() };
    if (c === "-" || (c >= "0" && c <= "9")) return { kind: "number", n: this.number() };
    for (const lit of ["true", "false", "null"]) {
      if (c === lit[0]) {
        if (!this.in_.startsWith(lit, this.pos)) this.fail("syntax", "invalid literal");
        this.pos += lit.length;
        return { kind: lit === "null" ? "null" : "boolean", lit };
      }
    }
    return this.fail("syntax", `unexpected character ${JSON.stringify(c)}`);
  }

  object(depth: number): Value {
    if (depth > MAX_DEPTH) this.fail("too_deep", `more than ${MAX_DEPTH} levels`);
    this.pos++;
    const members: [string, Value][] = [];
    const seen = new Set<string>();
    this.skipSpace();
    if (this.in_[this.pos] === "}") {
      this.pos++;
      return { kind: "object", members };
    }
    for (;;) {
      this.skipSpace();
      if (this.in_[this.pos] !== '"') this.fail("syntax", "expected a member name");
      const at = this.pos;
      const name = this.string();
      if (seen.has(name)) this.fail("duplicate_name", `duplicate member name ${JSON.stringify(name)}`, at);
      seen.add(name);
      this.skipSpace();
      if (this.in_[this.pos] !== ":") this.fail("syntax", "expected ':'");
      this.pos++;
      this.skipSpace();
      members.push([name, this.value(depth)]);
      this.skipSpace();
      if (this.pos >= this.in_.length) this.fail("syntax", "unexpected end of input in an object");
      const c = this.in_[this.pos++];
      if (c === "}") return { kind: "object", members };
      if (c !== ",") this.fail("syntax", "expected ',' or '}'", this.pos - 1);
    }
  }

  array(depth: number): Value {
    if (depth > MAX_DEPTH) this.fail("too_deep", `more than ${MAX_DEPTH} levels`);
    this.pos++;
    const items: Value[] = [];
    this.skipSpace();
    if (this.in_[this.pos] === "]") {
      this.pos++;
      return { kind: "array", items };
    }
    for (;;) {
      this.skipSpace();
      items.push(this.value(depth));
      this.skipSpace();
      if (this.pos >= this.in_.length) this.fail("syntax", "unexpected end of input in an array");
      const c = this.in_[this.pos++];
      if (c === "]") return { kind: "array", items };
      if (c !== ",") this.fail("syntax", "expected ',' or ']'", this.pos - 1);
    }
  }

  number(): number {
    const start = this.pos;
    const s = this.in_;
    const digit = () => this.pos < s.length && s[this.pos] >= "0" && s[this.pos] <= "9";
    if (s[this.pos] === "-") this.pos++;
    const intStart = this.pos;
    if (s[this.pos] === "0") {
      this.pos++;
    } else if (digit()) {
      while (digit()) this.pos++;
    } else {
      this.fail("syntax", "invalid number");
    }
    const intDigits = s.slice(intStart, this.pos);
    let integer = true;
    if (s[this.pos] === ".") {
      integer = false;
      this.pos++;
      if (!digit()) this.fail("syntax", "invalid number: no digit after '.'");
      while (digit()) this.pos++;
    }
    if (s[this.pos] === "e" || s[this.pos] === "E") {
      integer = false;
      this.pos++;
      if (s[this.pos] === "+" || s[this.pos] === "-") this.pos++;
      if (!digit()) this.fail("syntax", "invalid number: no digit in the exponent");
      while (digit()) this.pos++;
    }
    const lit = s.slice(start, this.pos);
    if (integer && (intDigits.length > MAX_SAFE.length || (intDigits.length === MAX_SAFE.length && intDigits > MAX_SAFE))) {
      this.fail("unsafe_integer", `integer beyond ±2^53 (send it as a string): ${lit}`, start);
    }
    const n = Number(lit);
    if (!Number.isFinite(n)) this.fail("number_range", `number outside the double range: ${lit}`, start);
    // Spelled another way (1e16), a value in (2^53, 1e21) still has an integer
    // beyond 2^53 as its canonical form.
    const a = Math.abs(n);
    if (a > 2 ** 53 && a < 1e21) this.fail("unsafe_integer", `integer beyond ±2^53 (send it as a string): ${lit}`, start);
    return n;
  }

  string(): string {
    const s = this.in_;
    this.pos++; // the opening quote
    let out = "";
    let runStart = this.pos;
    for (;;) {
      if (this.pos >= s.length) this.fail("syntax", "unterminated string");
      const c = s.charCodeAt(this.pos);
      if (c === 0x22) {
        out += s.slice(runStart, this.pos);
        this.pos++;
        return out;
      }
      if (c === 0x5c) {
        out += s.slice(runStart, this.pos);
        out += this.escape();
        runStart = this.pos;
      } else if (c < 0x20) {
        this.fail("syntax", "control character in a string");
      } else if (c >= 0xd800 && c <= 0xdfff) {
        // A JS string may hold a raw surrogate; only a high one followed by a low one is a character.
        const next = s.charCodeAt(this.pos + 1);
        if (c <= 0xdbff && next >= 0xdc00 && next <= 0xdfff) {
          this.pos += 2;
        } else {
          this.fail("lone_surrogate", "lone surrogate in a string");
        }
      } else {
        this.pos++;
      }
    }
  }

  escape(): string {
    const s = this.in_;
    const at = this.pos;
    this.pos++;
    if (this.pos >= s.length) this.fail("syntax", "unterminated escape");
    const c = s[this.pos++];
    switch (c) {
      case '"':
      case "\\":
      case "/":
        return c;
      case "b":
        return "\b";
      case "f":
        return "\f";
      case "n":
        return "\n";
      case "r":
        return "\r";
      case "t":
        return "\t";
      case "u":
        break;
      default:
        this.fail("syntax", `invalid escape \\${c}`, at);
    }
    const r = this.hex4();
    const lone = () => this.fail("lone_surrogate", `lone surrogate escape \\u${r.toString(16).padStart(4, "0")}`, at);
    if (r >= 0xdc00 && r <= 0xdfff) lone();
    if (r >= 0xd800 && r <= 0xdbff) {
      if (s[this.pos] !== "\\" || s[this.pos + 1] !== "u" || this.pos + 6 > s.length) lone();
      this.pos += 2;
      const lo = this.hex4();
      if (lo < 0xdc00 || lo > 0xdfff) lone();
      return String.fromCharCode(r, lo);
    }
    return String.fromCharCode(r);
  }

  hex4(): number {
    if (this.pos + 4 > this.in_.length) this.fail("syntax", "short \\u escape");
    const h = this.in_.slice(this.pos, this.pos + 4);
    if (!/^[0-9a-fA-F]{4}$/.test(h)) this.fail("syntax", "invalid \\u escape");
    this.pos += 4;
    return parseInt(h, 16);
  }
}

function serialize(v: Value): string {
  switch (v.kind) {
    case "null":
    case "boolean":
      return v.lit;
    case "number":
      // Number.prototype.toString is the form RFC 8785 requires; -0 is "0".
      return String(v.n);
    case "string":
      return quote(v.s);
    case "array":
      return "[" + v.items.map(serialize).join(",") + "]";
    case "object": {
      // JS compares strings by UTF-16 code units, the order RFC 8785 sorts names in.
      const members = [...v.members].sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0));
      return "{" + members.map(([k, item]) => quote(k) + ":" + serialize(item)).join(",") + "}";
    }
  }
}

const ESCAPES: Record<string, string> = { '"': '\\"', "\\": "\\\\", "\b": "\\b", "\f": "\\f", "\n": "\\n", "\r": "\\r", "\t": "\\t" };

function quote(s: string): string {
  // eslint-disable-next-line no-control-regex
  return '"' + s.replace(/["\\\u0000-\u001f]/g, (c) => ESCAPES[c] ?? "\\u00" + c.charCodeAt(0).toString(16).padStart(2, "0")) + '"';
}
