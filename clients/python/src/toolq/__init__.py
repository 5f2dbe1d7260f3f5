"""toolq for Python agents: the idempotency key of a tool call, byte for byte
as toolq's consumer derives it."""

from toolq.key import (
    MAX_DEPTH,
    Args,
    CallKeyError,
    DuplicateNameError,
    FieldError,
    InvalidUTF8Error,
    JSONSyntaxError,
    LoneSurrogateError,
    NotObjectError,
    NumberRangeError,
    TooDeepError,
    UnsafeIntegerError,
    call_key,
    call_material,
    canonicalize,
)

__all__ = [
    "MAX_DEPTH",
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
]
