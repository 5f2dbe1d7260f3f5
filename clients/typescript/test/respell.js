// A seeded generator of one JSON object in two spellings: the second with
// the members of every object in another order, other whitespace, and every
// string and number written another way (escapes where a literal would do,
// 1 as 1.0, 1e0, 10E-1, 0.1e1; -0 as 0). Names are drawn mostly from
// characters that make orders disagree: 👍 👎 😀 share the high surrogate
// U+D83D, 𝄞 𝄢 share U+D834, the last plane U+DBFF, and U+E000..U+FFFF sort
// after all of them in UTF-16 though before none in code point order. The
// two texts are one value: one canonical form, one key. (Go has the same
// generator in internal/jsontest.)

// rng is a small deterministic PRNG (mulberry32), so that a failure can be replayed.
export function rng(seed) {
  let s = seed >>> 0;
  return () => {
    s = (s + 0x6d2b79f5) >>> 0;
    let t = s;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

const ORDER = ["a", "b", "é", "\ue000", "\uffff", "\ufb33", "😀", "👍", "👎", "𝄞", "𝄢", "\u{100000}", "\u{10fffe}", "\u{10ffff}"];
const OTHER = ["Z", "0", " ", '"', "\\", "/", "\n", "\t", "\u0001", "\u001f", "\u007f", "ß", "€", "\u2028", "中", "\ufffd"];

export function respelled(r) {
  const v = node(r, 0, true);
  return [write(v, r, false), write(v, r, true)];
}

const pick = (r, a) => a[Math.floor(r() * a.length)];
const int = (r, n) => Math.floor(r() * n);

function name(r) {
  const pool = r() < 0.25 ? OTHER.concat(ORDER) : ORDER;
  let s = "";
  for (let i = 1 + int(r, 3); i > 0; i--) s += pick(r, pool);
  return s;
}

function node(r, depth, object) {
  let kind = object ? 7 : depth >= 4 ? int(r, 5) : int(r, 8);
  if (kind === 0) return { kind: "lit", text: pick(r, ["null", "true", "false"]) };
  if (kind <= 2) {
    if (int(r, 6) === 0) return { kind: "num", neg: r() < 0.5, digits: "0", exp: 0 };
    let digits = String(1 + int(r, 9));
    for (let i = int(r, 6); i > 0; i--) digits += String(int(r, 10));
    return { kind: "num", neg: int(r, 3) === 0, digits, exp: int(r, 15) - 8 };
  }
  if (kind <= 4) return { kind: "str", text: name(r) };
  if (kind <= 6) return { kind: "arr", items: Array.from({ length: int(r, 4) }, () => node(r, depth + 1, false)) };
  const names = [...new Set(Array.from({ length: int(r, 7) }, () => name(r)))];
  return { kind: "obj", members: names.map((n) => [n, node(r, depth + 1, false)]) };
}

// No raw line break: a document is one line of JSON Lines for Go.
const ws = (r) => (r() < 0.6 ? "" : pick(r, [" ", "\t", " \t ", "  "]));

function str(s, r) {
  let out = '"';
  for (const ch of s) {
    const cp = ch.codePointAt(0);
    if (ch === '"' || ch === "\\") out += "\\" + ch;
    else if (ch === "/" && r() < 0.25) out += "\\/";
    else if (cp < 0x20 || r() < 0.3) {
      for (let i = 0; i < ch.length; i++) {
        const hex = ch.charCodeAt(i).toString(16).padStart(4, "0");
        out += "\\u" + (r() < 0.5 ? hex : hex.toUpperCase());
      }
    } else out += ch;
  }
  return out + '"';
}

function num(n, r) {
  const sign = n.neg ? "-" : "";
  if (n.digits === "0") return sign + pick(r, ["0", "0.0", "0e0", "0E+5", "0.000e-3"]);
  const shift = int(r, 3);
  const digits = n.digits + "0".repeat(shift);
  const exp = n.exp - shift;
  const e = (x) => (x >= 0 && r() < 0.5 ? "+" + x : String(x));
  switch (int(r, 3)) {
    case 0:
      return sign + digits + pick(r, ["e", "E"]) + e(exp);
    case 1:
      if (r() < 0.5) return sign + "0." + digits + "e" + e(exp + digits.length);
      return sign + digits[0] + "." + (digits.slice(1) || "0") + "E" + e(exp + digits.length - 1);
  }
  if (exp >= 0) return sign + digits + "0".repeat(exp) + (r() < 0.5 ? "." + "0".repeat(1 + int(r, 2)) : "");
  if (digits.length > -exp) return sign + digits.slice(0, digits.length + exp) + "." + digits.slice(digits.length + exp);
  return sign + "0." + "0".repeat(-exp - digits.length) + digits;
}

function write(v, r, shuffle) {
  switch (v.kind) {
    case "lit":
      return v.text;
    case "num":
      return num(v, r);
    case "str":
      return str(v.text, r);
    case "arr":
      return "[" + ws(r) + v.items.map((x) => write(x, r, shuffle)).join(ws(r) + "," + ws(r)) + ws(r) + "]";
  }
  const order = v.members.map((_, i) => i);
  if (shuffle) {
    for (let i = order.length - 1; i > 0; i--) {
      const j = int(r, i + 1);
      [order[i], order[j]] = [order[j], order[i]];
    }
  }
  return "{" + order.map((i) => ws(r) + str(v.members[i][0], r) + ws(r) + ":" + ws(r) + write(v.members[i][1], r, shuffle)).join(",") + ws(r) + "}";
}
