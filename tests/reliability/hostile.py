"""Hypothesis strategies for hostile input (unicode edge cases, odd JSON and non-JSON values),
and the settings the fuzz tests run under."""

from __future__ import annotations

import datetime
import decimal
import sqlite3
from collections.abc import Callable
from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from controlplane import SubagentControl

__all__ = [
    "EDGE_PIECES",
    "any_value",
    "fuzz",
    "hostile_text",
    "json_values",
    "mostly",
    "non_json",
    "store_counts",
]


def fuzz(max_examples: int) -> settings:
    """Hypothesis settings for a fuzz test: reproducible, no example database, no deadline.

    The tests share function-scoped fixtures (one control plane) across examples on purpose.
    """
    return settings(
        max_examples=max_examples,
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    )


EDGE_PIECES = [
    "",
    "\x00",
    "\ud800",  # lone high surrogate
    "\udfff",  # lone low surrogate
    "\u202e",  # right-to-left override
    "\u200f",  # right-to-left mark
    "\u200b",  # zero-width space
    "\ufeff",  # byte-order mark
    "\U0001f600",
    "\u0301",  # a combining accent with nothing to combine with
    "\r\n\t\x0b\x0c\x1b[2J",
    "\u2028\u2029\u0085",
    "'); DROP TABLE subagent_events; --",
    "%s%(x)s{0}:p?",
    "../../etc/passwd",
    "null",
    "x" * 300,
]


def mostly(
    common: st.SearchStrategy[Any], rare: st.SearchStrategy[Any], times: int = 3
) -> st.SearchStrategy[Any]:
    """``common`` ``times`` times as often as ``rare`` (``one_of`` merges repeated branches)."""
    return st.sampled_from([common] * times + [rare]).flatmap(lambda chosen: chosen)


def hostile_text(max_pieces: int = 6) -> st.SearchStrategy[str]:
    """Strings mixing arbitrary unicode with the edge cases above (surrogates included)."""
    piece = st.one_of(
        st.sampled_from(EDGE_PIECES),
        st.text(st.characters(exclude_categories=[]), max_size=8),
        st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF),
    )
    return st.lists(piece, max_size=max_pieces).map("".join)


def json_values(max_leaves: int = 12) -> st.SearchStrategy[Any]:
    """Plain JSON (str keys, finite numbers) with hostile strings and big numbers."""
    leaves = st.one_of(
        st.none(),
        st.booleans(),
        st.integers(min_value=-(2**70), max_value=2**70),
        st.floats(allow_nan=False, allow_infinity=False),
        hostile_text(3),
    )
    return st.recursive(
        leaves,
        lambda inner: st.one_of(
            st.lists(inner, max_size=4),
            st.dictionaries(hostile_text(2), inner, max_size=4),
        ),
        max_leaves=max_leaves,
    )


class Nested(list[Any]):
    """Lists nested ``levels`` deep, printed briefly (a falsifying example must print)."""

    def __init__(self, levels: int) -> None:
        inner: Any = "bottom"
        for _ in range(levels - 1):
            inner = [inner]
        super().__init__([inner])
        self.levels = levels

    def __repr__(self) -> str:
        return f"<lists nested {self.levels} deep>"

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        printer.text(repr(self))


def _deep(levels: int) -> Any:
    return Nested(levels)


class _Opaque:
    def __repr__(self) -> str:
        return "<opaque>"


NON_JSON: list[Callable[[], Any]] = [
    lambda: {1, 2},
    lambda: frozenset({"a"}),
    lambda: b"bytes",
    lambda: bytearray(b"x"),
    lambda: _Opaque(),
    lambda: float("nan"),
    lambda: float("inf"),
    lambda: -float("inf"),
    lambda: {1: "int key"},
    lambda: {("tuple", "key"): 1},
    lambda: decimal.Decimal("1.5"),
    lambda: datetime.datetime(2024, 1, 1),
    lambda: print,
    lambda: _deep(250),
    lambda: _deep(5000),
    lambda: {"ok": [1, 2, {"deeper": float("nan")}]},
    lambda: iter([1, 2]),
]


def non_json() -> st.SearchStrategy[Any]:
    """A value that is not plain JSON, or a list holding one."""
    single = st.sampled_from(NON_JSON).map(lambda make: make())
    return st.one_of(single, st.lists(single, min_size=1, max_size=2))


def any_value() -> st.SearchStrategy[Any]:
    """Plain JSON three times in four; otherwise something that is not JSON at all."""
    return mostly(json_values(), non_json())


def store_counts(control: SubagentControl) -> tuple[int, int]:
    """``(children, events)`` in a SQLite store, counted straight from its tables."""
    assert control.store is not None
    path = control.store.url.removeprefix("sqlite:///")
    with sqlite3.connect(path) as conn:
        children = conn.execute("SELECT count(*) FROM subagent_children").fetchone()[0]
        events = conn.execute(
            "SELECT (SELECT count(*) FROM subagent_events) + (SELECT "
            "coalesce(sum(last_seq - first_seq + 1), 0) FROM subagent_segments)"
        ).fetchone()[0]
    conn.close()
    return int(children), int(events)
