"""The idempotency key of a tool call, byte for byte as toolq derives it.

A call is identified by::

    key = hex(sha256(conversation_id | turn_index | tool | ordinal | canonical(args)))[:32]

where ``canonical`` is RFC 8785 (the JSON Canonicalization Scheme). The
arguments are parsed strictly first, with the rules of the Go side
(``internal/jcs``): a parser that loses what those rules look at (Python's
``json`` keeps the last of two duplicate names, accepts lone surrogate
escapes, ``NaN`` and integers of any size) would give a key the consumer
refuses, or another call's key. Each refusal is a :class:`CallKeyError`
subclass naming its rule, as the shared test vectors do.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Mapping
from typing import Any

import rfc8785

__all__ = [
    "MAX_DEPTH",
    "RESERVED_TENANTS",
    "Args",
    "CallKeyError",
    "DuplicateNameError",
    "FieldError",
    "InvalidUTF8Error",
    "JSONSyntaxError",
    "LoneSurrogateError",
    "NotObjectError",
    "NumberRangeError",
    "TooDeepError",
    "UnsafeIntegerError",
    "call_key",
    "call_material",
    "canonicalize",
    "key_of",
    "valid_tenant",
]

#: The arguments of a call: the JSON text as the model streamed it (``str``
#: or UTF-8 ``bytes``; every rule is then checked exactly), or a mapping,
#: which is written as JSON first.
Args = str | bytes | Mapping[str, Any]

#: How deeply arrays and objects may nest.
MAX_DEPTH = 64

KEY_LEN = 32

_CONVERSATION_ID = re.compile(r"[A-Za-z0-9_:-]{1,128}")
_TOOL = re.compile(r"[a-zA-Z0-9_-]{1,64}")
_TENANT = re.compile(r"[A-Za-z0-9_-]{1,64}")
#: The second tokens of the default tenant's subjects, which no tenant may take (docs/tenants.md).
RESERVED_TENANTS = frozenset({"jobs", "results", "dlq", "approvals", "decide", "ledger", "tools"})


def valid_tenant(tenant: str) -> bool:
    """Whether ``tenant`` may name a tenant: "" (the default tenant), or one subject token that is not reserved."""
    return tenant == "" or (isinstance(tenant, str) and bool(_TENANT.fullmatch(tenant)) and tenant not in RESERVED_TENANTS)


_MAX_SAFE = "9007199254740992"  # 2^53: the largest magnitude at which every integer has its own double
_MAX_COUNTER = 10**16 - 1  # turn_index and ordinal: at most 16 digits


class CallKeyError(ValueError):
    """A call that has no key: a field breaks its pattern, or the args a rule."""

    #: The rule, as the shared vectors name it.
    rule: str = ""

    def __init__(self, message: str, *, field: str = "args", offset: int | None = None) -> None:
        super().__init__(message)
        self.field = field
        #: For an args rule, the offset in the JSON text where it broke.
        self.offset = offset

    @property
    def vector_rule(self) -> str:
        """The rule as the shared test vectors write it: the rule, or ``field:<name>``."""
        return f"field:{self.field}" if self.rule == "field" else self.rule


class FieldError(CallKeyError):
    """An identifying field (conversation_id, turn_index, tool, ordinal) breaks its rule."""

    rule = "field"


class NotObjectError(CallKeyError):
    """The args are not a JSON object."""

    rule = "not_object"


class DuplicateNameError(CallKeyError):
    """A member name appears twice in one object, however it is spelled."""

    rule = "duplicate_name"


class InvalidUTF8Error(CallKeyError):
    """The args' bytes are not valid UTF-8."""

    rule = "invalid_utf8"


class LoneSurrogateError(CallKeyError):
    """A string holds half of a surrogate pair."""

    rule = "lone_surrogate"


class NumberRangeError(CallKeyError):
    """A number beyond the range of a double."""

    rule = "number_range"


class UnsafeIntegerError(CallKeyError):
    """An integer beyond ±2^53, or a number whose canonical form is one (1e16): send it as a string."""

    rule = "unsafe_integer"


class TooDeepError(CallKeyError):
    """Arrays and objects nested deeper than MAX_DEPTH."""

    rule = "too_deep"


class JSONSyntaxError(CallKeyError):
    """Not exactly one JSON document."""

    rule = "syntax"


def canonicalize(args: Args, *, must_be_object: bool = True) -> str:
    """The RFC 8785 form of the args, under the Go side's rules."""
    from_bytes = False
    if isinstance(args, Mapping):
        plain = _plain(args, 0)
        try:
            # \\u escapes for every non-ASCII character: a lone surrogate in a
            # Python string becomes an escape the parser then refuses.
            text = json.dumps(plain, ensure_ascii=True, allow_nan=False)
        except (TypeError, ValueError) as e:
            raise JSONSyntaxError(f"the args have no JSON form: {e}") from None
    elif isinstance(args, (bytes, bytearray, memoryview)):
        # Invalid bytes become lone surrogates U+DC80..U+DCFF, which the
        # parser reports where it meets them, as the Go side does: inside a
        # string invalid_utf8, elsewhere a syntax error, and after any rule
        # broken earlier in the text.
        text, from_bytes = bytes(args).decode("utf-8", errors="surrogateescape"), True
    elif isinstance(args, str):
        text = args
    else:
        raise NotObjectError(f"the args must be JSON text or a mapping, not {type(args).__name__}", offset=0)
    p = _Parser(text, from_bytes=from_bytes)
    p.skip_space()
    value = p.value(0)
    p.skip_space()
    if p.pos != len(text):
        p.fail(JSONSyntaxError, "data after the top-level value")
    if must_be_object and not isinstance(value, dict):
        raise NotObjectError(f"not a JSON object: found {_kind(value)}", offset=0)
    out: bytes = rfc8785.dumps(value)
    return out.decode("utf-8")


def _plain(v: Any, depth: int) -> Any:
    """The args mapping as plain JSON values: any Mapping a dict, its names
    strings (a non-string name has no JSON form: json.dumps would write 1 as
    "1"), nesting held to MAX_DEPTH."""
    if isinstance(v, Mapping):
        if depth >= MAX_DEPTH:
            raise TooDeepError(f"more than {MAX_DEPTH} levels")
        out = {}
        for k, item in v.items():
            if not isinstance(k, str):
                raise JSONSyntaxError(f"member name {k!r} is not a string")
            out[k] = _plain(item, depth + 1)
        return out
    if isinstance(v, (list, tuple)):
        if depth >= MAX_DEPTH:
            raise TooDeepError(f"more than {MAX_DEPTH} levels")
        return [_plain(item, depth + 1) for item in v]
    return v


def _check_fields(conversation_id: str, turn_index: int, tool: str, ordinal: int) -> None:
    if not isinstance(conversation_id, str) or not _CONVERSATION_ID.fullmatch(conversation_id):
        raise FieldError(f"conversation_id: must match ^{_CONVERSATION_ID.pattern}$", field="conversation_id")
    if not isinstance(tool, str) or not _TOOL.fullmatch(tool):
        raise FieldError(f"tool: must match ^{_TOOL.pattern}$", field="tool")
    for name, v in (("turn_index", turn_index), ("ordinal", ordinal)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 0 or v > _MAX_COUNTER:
            raise FieldError(f"{name}: must be a non-negative integer of at most 16 digits", field=name)


def call_material(*, conversation_id: str, turn_index: int, tool: str, ordinal: int = 0, args: Args, tenant: str = "") -> str:
    """The exact text that is hashed: ``conversation_id|turn_index|tool|ordinal|canonical(args)``, after
    ``tenant|`` for a tenant's call (docs/tenants.md); the default tenant's ("") is unchanged."""
    if not isinstance(tenant, str) or not valid_tenant(tenant):
        raise FieldError(f"tenant: must match ^{_TENANT.pattern}$ and not be {', '.join(sorted(RESERVED_TENANTS))}", field="tenant")
    _check_fields(conversation_id, turn_index, tool, ordinal)
    prefix = f"{tenant}|" if tenant else ""
    return f"{prefix}{conversation_id}|{turn_index}|{tool}|{ordinal}|{canonicalize(args)}"


def call_key(*, conversation_id: str, turn_index: int, tool: str, ordinal: int = 0, args: Args, tenant: str = "") -> str:
    """The idempotency key of a call: what ``publisher key`` prints for it."""
    return key_of(
        call_material(conversation_id=conversation_id, turn_index=turn_index, tool=tool, ordinal=ordinal, args=args, tenant=tenant)
    )


def key_of(material: str) -> str:
    """The key of a call's material (call_material)."""
    return hashlib.sha256(material.encode("utf-8")).hexdigest()[:KEY_LEN]


def _kind(v: Any) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "boolean"
    if isinstance(v, float):
        return "number"
    if isinstance(v, str):
        return "string"
    return "array" if isinstance(v, list) else "object"


class _Parser:
    """A strict RFC 8259 parser with the rules of the Go package internal/jcs."""

    def __init__(self, text: str, *, from_bytes: bool = False) -> None:
        self.s = text
        self.pos = 0
        self.from_bytes = from_bytes

    def fail(self, cls: type[CallKeyError], detail: str, at: int | None = None) -> Any:
        raise cls(detail, offset=self.pos if at is None else at)

    def skip_space(self) -> None:
        s, n = self.s, len(self.s)
        while self.pos < n and s[self.pos] in " \t\n\r":
            self.pos += 1

    def value(self, depth: int) -> Any:
        s = self.s
        if self.pos >= len(s):
            self.fail(JSONSyntaxError, "unexpected end of input")
        c = s[self.pos]
        if c == "{":
            return self.object(depth + 1)
        if c == "[":
            return self.array(depth + 1)
        if c == '"':
            return self.string()
        if c == "-" or "0" <= c <= "9":
            return self.number()
        for lit, v in (("true", True), ("false", False), ("null", None)):
            if c == lit[0]:
                if not s.startswith(lit, self.pos):
                    self.fail(JSONSyntaxError, "invalid literal")
                self.pos += len(lit)
                return v
        return self.fail(JSONSyntaxError, f"unexpected character {c!r}")

    def object(self, depth: int) -> dict[str, Any]:
        if depth > MAX_DEPTH:
            self.fail(TooDeepError, f"more than {MAX_DEPTH} levels")
        s = self.s
        self.pos += 1
        members: dict[str, Any] = {}
        self.skip_space()
        if self.pos < len(s) and s[self.pos] == "}":
            self.pos += 1
            return members
        while True:
            self.skip_space()
            if self.pos >= len(s) or s[self.pos] != '"':
                self.fail(JSONSyntaxError, "expected a member name")
            at = self.pos
            name = self.string()
            if name in members:
                self.fail(DuplicateNameError, f"duplicate member name {name!r}", at)
            self.skip_space()
            if self.pos >= len(s) or s[self.pos] != ":":
                self.fail(JSONSyntaxError, "expected ':'")
            self.pos += 1
            self.skip_space()
            members[name] = self.value(depth)
            self.skip_space()
            if self.pos >= len(s):
                self.fail(JSONSyntaxError, "unexpected end of input in an object")
            c = s[self.pos]
            self.pos += 1
            if c == "}":
                return members
            if c != ",":
                self.fail(JSONSyntaxError, "expected ',' or '}'", self.pos - 1)

    def array(self, depth: int) -> list[Any]:
        if depth > MAX_DEPTH:
            self.fail(TooDeepError, f"more than {MAX_DEPTH} levels")
        s = self.s
        self.pos += 1
        items: list[Any] = []
        self.skip_space()
        if self.pos < len(s) and s[self.pos] == "]":
            self.pos += 1
            return items
        while True:
            self.skip_space()
            items.append(self.value(depth))
            self.skip_space()
            if self.pos >= len(s):
                self.fail(JSONSyntaxError, "unexpected end of input in an array")
            c = s[self.pos]
            self.pos += 1
            if c == "]":
                return items
            if c != ",":
                self.fail(JSONSyntaxError, "expected ',' or ']'", self.pos - 1)

    def _digits(self) -> None:
        s, n = self.s, len(self.s)
        while self.pos < n and "0" <= s[self.pos] <= "9":
            self.pos += 1

    def number(self) -> float:
        s, n = self.s, len(self.s)
        start = self.pos
        if s[self.pos] == "-":
            self.pos += 1
        int_start = self.pos
        if self.pos < n and s[self.pos] == "0":
            self.pos += 1
        elif self.pos < n and "1" <= s[self.pos] <= "9":
            self._digits()
        else:
            self.fail(JSONSyntaxError, "invalid number")
        int_digits = s[int_start : self.pos]
        integer = True
        if self.pos < n and s[self.pos] == ".":
            integer = False
            self.pos += 1
            if self.pos >= n or not "0" <= s[self.pos] <= "9":
                self.fail(JSONSyntaxError, "invalid number: no digit after '.'")
            self._digits()
        if self.pos < n and s[self.pos] in "eE":
            integer = False
            self.pos += 1
            if self.pos < n and s[self.pos] in "+-":
                self.pos += 1
            if self.pos >= n or not "0" <= s[self.pos] <= "9":
                self.fail(JSONSyntaxError, "invalid number: no digit in the exponent")
            self._digits()
        lit = s[start : self.pos]
        if integer and (len(int_digits) > len(_MAX_SAFE) or (len(int_digits) == len(_MAX_SAFE) and int_digits > _MAX_SAFE)):
            self.fail(UnsafeIntegerError, f"integer beyond ±2^53 (send it as a string): {lit}", start)
        f = float(lit)
        if math.isinf(f):
            self.fail(NumberRangeError, f"number outside the double range: {lit}", start)
        # Spelled another way (1e16), a value in (2^53, 1e21) still has an
        # integer beyond 2^53 as its canonical form.
        if 2**53 < abs(f) < 1e21:
            self.fail(UnsafeIntegerError, f"integer beyond ±2^53 (send it as a string): {lit}", start)
        return f

    def string(self) -> str:
        s, n = self.s, len(self.s)
        self.pos += 1  # the opening quote
        out: list[str] = []
        run = self.pos
        while True:
            if self.pos >= n:
                self.fail(JSONSyntaxError, "unterminated string")
            c = s[self.pos]
            o = ord(c)
            if c == '"':
                out.append(s[run : self.pos])
                self.pos += 1
                return "".join(out)
            if c == "\\":
                out.append(s[run : self.pos])
                out.append(self.escape())
                run = self.pos
            elif o < 0x20:
                self.fail(JSONSyntaxError, "control character in a string")
            elif self.from_bytes and 0xDC80 <= o <= 0xDCFF:
                self.fail(InvalidUTF8Error, "invalid UTF-8 in a string")
            elif 0xD800 <= o <= 0xDFFF:
                # A Python str may hold a raw surrogate; only a high one
                # followed by a low one is a character.
                nxt = ord(s[self.pos + 1]) if self.pos + 1 < n else 0
                if o <= 0xDBFF and 0xDC00 <= nxt <= 0xDFFF:
                    out.append(s[run : self.pos])
                    out.append(chr(0x10000 + ((o - 0xD800) << 10) + (nxt - 0xDC00)))
                    self.pos += 2
                    run = self.pos
                else:
                    self.fail(LoneSurrogateError, "lone surrogate in a string")
            else:
                self.pos += 1

    def escape(self) -> str:
        s = self.s
        at = self.pos
        self.pos += 1
        if self.pos >= len(s):
            self.fail(JSONSyntaxError, "unterminated escape")
        c = s[self.pos]
        self.pos += 1
        simple = {'"': '"', "\\": "\\", "/": "/", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t"}
        if c in simple:
            return simple[c]
        if c != "u":
            self.fail(JSONSyntaxError, f"invalid escape \\{c}", at)
        r = self.hex4()
        if 0xDC00 <= r <= 0xDFFF:
            self.fail(LoneSurrogateError, f"lone surrogate escape \\u{r:04x}", at)
        if 0xD800 <= r <= 0xDBFF:
            if s[self.pos : self.pos + 2] != "\\u" or self.pos + 6 > len(s):
                self.fail(LoneSurrogateError, f"lone surrogate escape \\u{r:04x}", at)
            self.pos += 2
            lo = self.hex4()
            if not 0xDC00 <= lo <= 0xDFFF:
                self.fail(LoneSurrogateError, f"lone surrogate escape \\u{r:04x}", at)
            return chr(0x10000 + ((r - 0xD800) << 10) + (lo - 0xDC00))
        return chr(r)

    def hex4(self) -> int:
        h = self.s[self.pos : self.pos + 4]
        if len(h) < 4:
            self.fail(JSONSyntaxError, "short \\u escape")
        if not re.fullmatch(r"[0-9a-fA-F]{4}", h):
            self.fail(JSONSyntaxError, "invalid \\u escape")
        self.pos += 4
        return int(h, 16)
