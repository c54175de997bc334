"""Plain-JSON checking: the one gate every stored or descriptor value passes."""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping
from typing import Any

from controlplane.contract._errors import ErrorCode, SubagentControlError

__all__ = ["JsonValue", "count_problem", "dumps", "plain_json", "seconds_problem", "storable_text"]

JsonValue = Any
"""A value made only of dict (str keys), list, str, int, finite float, bool and None."""

MAX_DEPTH = 200


def plain_json(value: object, *, code: ErrorCode, what: str) -> JsonValue:
    """Return a detached deep copy of ``value`` if it is plain JSON, else raise.

    Tuples are accepted as lists. Sets, bytes, arbitrary objects, non-string keys,
    NaN and Infinity are refused with ``code``, naming the offending path.
    """
    try:
        return _copy(value, 0)
    except _Refused as refused:
        path = "$" + "".join(reversed(refused.steps))
        raise SubagentControlError(code, refused.describe(what, path)) from None


class _Refused(Exception):
    """Raised inside `_copy`; each level adds its step to the path while it unwinds, so a
    value that passes (nearly every one) never has its paths formatted."""

    def __init__(self, describe: Callable[[str, str], str]) -> None:
        super().__init__()
        self.describe = describe  # (what, path) -> message
        self.steps: list[str] = []


def _copy(value: object, depth: int) -> JsonValue:
    if depth > MAX_DEPTH:
        raise _Refused(lambda what, _path: f"{what} is nested deeper than {MAX_DEPTH} levels")
    if isinstance(value, str):
        # JSON escapes NUL, but a lone surrogate has no UTF-8 form: no store can keep it.
        if not value.isascii() and (reason := _unencodable(value)) is not None:
            raise _surrogate_refused(reason)
        return value
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise _Refused(
                lambda what, path: f"{what} holds {value!r} at {path}; JSON has no NaN or Infinity"
            )
        return float(value)
    if isinstance(value, Mapping):
        out: dict[str, JsonValue] = {}
        for key, item in value.items():
            if not isinstance(key, str):
                raise _non_string_key(key)
            if not key.isascii() and (reason := _unencodable(key)) is not None:
                raise _surrogate_refused(reason, key=True)
            try:
                out[key] = _copy(item, depth + 1)
            except _Refused as refused:
                refused.steps.append(f".{key}")
                raise
        return out
    if isinstance(value, (list, tuple)):
        items: list[JsonValue] = []
        for index, item in enumerate(value):
            try:
                items.append(_copy(item, depth + 1))
            except _Refused as refused:
                refused.steps.append(f"[{index}]")
                raise
        return items
    raise _Refused(
        lambda what, path: (
            f"{what} holds a {type(value).__name__} at {path}, which is not plain JSON"
        )
    )


def _non_string_key(key: object) -> _Refused:
    return _Refused(
        lambda what, path: f"{what} has a non-string key {key!r} at {path}; JSON keys are strings"
    )


def _surrogate_refused(reason: str, *, key: bool = False) -> _Refused:
    part = " key" if key else ""
    return _Refused(lambda what, path: _surrogate(f"{what}{part} at {path}", reason))


def _surrogate(where: str, reason: str) -> str:
    return f"{where} holds a lone surrogate ({reason}), which has no UTF-8 form"


def _unencodable(value: str) -> str | None:
    """Why ``value`` has no UTF-8 form, or None when it has one."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        return str(exc.reason)
    return None


# One encoder for every call: json.dumps builds a new one per call when given options,
# which costs more than encoding a typical event.
_ENCODER = json.JSONEncoder(ensure_ascii=False, allow_nan=False, separators=(",", ":"))


def dumps(value: JsonValue) -> str:
    """Serialise a value already checked by `plain_json`, compactly and strictly."""
    return _ENCODER.encode(value)


def storable_text(
    value: object, *, code: ErrorCode, what: str, max_chars: int | None = None, nul: bool = True
) -> str:
    """Return ``value`` if it is a string every store can keep, else raise ``code``.

    Refuses lone surrogates (no UTF-8 form), NUL when ``nul`` is False (identifiers and
    labels live in text columns, which PostgreSQL keeps NUL-free), and strings longer than
    ``max_chars``.
    """
    if not isinstance(value, str):
        raise SubagentControlError(code, f"{what} must be a string, not {type(value).__name__}")
    if max_chars is not None and len(value) > max_chars:
        raise SubagentControlError(
            code, f"{what} is {len(value)} characters long; the limit is {max_chars}"
        )
    if not nul and "\x00" in value:
        raise SubagentControlError(code, f"{what} holds a NUL character, which cannot be stored")
    if not value.isascii():
        _check_encodable(value, code, what)
    return value


def seconds_problem(value: object, *, at_least: float | None = None) -> str | None:
    """What is wrong with ``value`` as a duration in seconds (a positive, finite int or
    float; not a bool; at least ``at_least`` when given), or None when nothing is."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return f"must be a number of seconds, not {type(value).__name__}"
    if not math.isfinite(value) or value <= 0:
        return f"must be a positive, finite number of seconds, not {value!r}"
    if at_least is not None and value < at_least:
        return f"must be at least {at_least} seconds, not {value!r}"
    return None


def count_problem(value: object, *, at_least: int = 1) -> str | None:
    """What is wrong with ``value`` as a count (an int, not a bool, at least ``at_least``),
    or None when nothing is."""
    if isinstance(value, bool) or not isinstance(value, int):
        return f"must be a whole number, not {type(value).__name__}"
    if value < at_least:
        return f"must be at least {at_least}, not {value!r}"
    return None


def _check_encodable(value: str, code: ErrorCode, what: str) -> None:
    reason = _unencodable(value)
    if reason is not None:
        raise SubagentControlError(code, _surrogate(what, reason))
