"""Integer fields of the wire: the widths they are kept in, and the one check that names a field.

Every integer a request carries ends up in a fixed-width slot (a record header field, a consume
queue unit, an index entry), so each is checked against its range where it enters, and a value
out of range is a 400 naming the field rather than a failure deeper down. ``bool`` is not an
integer here, although Python says it is. JSON decoding (orjson) turns an integer too large for
64 bits into a float; such a value is reported as out of range, not as "not an integer".
"""

from __future__ import annotations

from typing import Any

from tidemq.protocol.codes import ErrorCode, ProtocolError

INT32_MAX = 2**31 - 1  # a 32-bit signed slot (queue ids, counts, flags)
INT64_MAX = 2**63 - 1  # a 64-bit signed slot (offsets, epoch milliseconds)
INT32_MIN = -(2**31)
INT64_MIN = -(2**63)


def out_of_range(value: Any, low: int, high: int) -> bool:
    """True when ``value`` is a whole number outside ``[low, high]``: an int, or the float a
    JSON integer beyond 64 bits decodes to."""
    if isinstance(value, bool):
        return False
    if isinstance(value, int):
        return not low <= value <= high
    return isinstance(value, float) and value.is_integer() and not low <= value <= high


def shown(value: Any) -> str:
    """``value`` as an error message shows it (a huge JSON integer is not shown as a float)."""
    if isinstance(value, float) and value.is_integer() and abs(value) > INT64_MAX:
        return "an integer beyond 64 bits"
    return repr(value)


def integer(value: Any, name: str, low: int, high: int,
            code: ErrorCode = ErrorCode.BAD_REQUEST, rule: str | None = None) -> int:
    """``value`` when it is an integer in ``[low, high]``; else a ProtocolError naming ``name``.

    ``rule`` says what the field must be (default: "an integer from low to high"); the error is
    ``code`` for a number out of range and BAD_REQUEST for a value that is no integer at all.
    """
    if type(value) is int and low <= value <= high:  # the fast path: almost every call
        return value
    must = rule or f"an integer from {low} to {high}"
    if out_of_range(value, low, high):
        raise ProtocolError(code, f"{name}: must be {must}, got {shown(value)}")
    if isinstance(value, bool) or not isinstance(value, int):
        raise ProtocolError(ErrorCode.BAD_REQUEST,
                            f"{name}: must be {must}, got {type(value).__name__} {value!r}")
    return int(value)  # an int subclass in range
