"""Ids that start with a prefix: the one query behind the CLI's short ids.

A person types the first characters of an id (the demo and ``top`` print eight); the CLI
asks for the ids that start with them, one read on the table's primary key. The range
``prefix <= id < next(prefix)`` is what both databases can walk on the key's index (a
plain ``LIKE`` cannot: SQLite's is case-insensitive against a binary-collated key, and
PostgreSQL uses an index for it only under the C collation); the escaped ``LIKE`` beside it
keeps the answer exact. The range assumes the key sorts in code point order: SQLite's
binary collation, PostgreSQL's ``C`` and ``C.UTF-8``.
"""

from __future__ import annotations

import sys
from typing import Final

from sqlalchemy import Column, Select, select

from controlplane.contract import ErrorCode, SubagentControlError
from persistence._approval_sql import approval_table
from persistence._children_sql import child_table
from persistence._task_sql import task_table

__all__ = ["ID_KINDS", "KEPT_SINCE", "prefix_query"]

ID_KINDS: Final[dict[str, Column[str]]] = {
    "child": child_table.c.child_id,
    "task": task_table.c.task_id,
    "request": approval_table.c.request_id,
}
"""Each kind of id a person may abbreviate, and the primary key that holds it (each table
as its statements' module names it)."""
KEPT_SINCE: Final = {"child": 1, "task": 4, "request": 10}
"""The schema version whose store first has each kind's table (an older one, read as it
is, has none)."""

_MAX_LIMIT: Final = 1000


def prefix_query(kind: str, prefix: str, limit: int) -> Select[str]:
    """The first ``limit`` ids of ``kind`` that start with ``prefix``, in key order (an
    id equal to the prefix comes first).

    Raises:
        SubagentControlError: ``INVALID_INPUT`` for an unknown kind, an empty prefix or a
            limit outside 1..1000.
    """
    key = ID_KINDS.get(kind)
    if key is None:
        raise SubagentControlError(
            ErrorCode.INVALID_INPUT,
            f"no ids of kind {kind!r}; use one of {', '.join(sorted(ID_KINDS))}",
        )
    if not isinstance(prefix, str) or not prefix:
        raise SubagentControlError(ErrorCode.INVALID_INPUT, "an id prefix must be non-empty text")
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= _MAX_LIMIT:
        raise SubagentControlError(
            ErrorCode.INVALID_INPUT, f"limit must be an integer from 1 to {_MAX_LIMIT}"
        )
    query = select(key).where(key >= prefix, key.like(_like_pattern(prefix), escape=_ESCAPE))
    upper = _successor(prefix)
    if upper is not None:
        query = query.where(key < upper)
    return query.order_by(key).limit(limit)


def _like_pattern(prefix: str) -> str:
    escaped = prefix.replace(_ESCAPE, _ESCAPE * 2)
    escaped = escaped.replace("%", _ESCAPE + "%").replace("_", _ESCAPE + "_")
    return escaped + "%"


def _successor(prefix: str) -> str | None:
    """The least string greater than every string that starts with ``prefix`` (None: no
    bound, for a prefix of only the highest code point)."""
    text = prefix
    while text:
        last = ord(text[-1])
        if last < sys.maxunicode:
            step = 0xE000 if last + 1 == 0xD800 else last + 1  # skip the surrogates
            return text[:-1] + chr(step)
        text = text[:-1]
    return None


_ESCAPE = "!"
"""The LIKE escape character: not a backslash, which SQLAlchemy before 2.0.31 renders into
PostgreSQL's ESCAPE clause as two characters (refused), and not one an id needs escaped."""
