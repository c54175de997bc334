"""Short ids on the command line: a unique prefix of an id names the id.

The demo and ``top`` print the first eight characters of each id; every command that takes
an id takes such a prefix too (at least `MIN_PREFIX` characters), resolved by one read of
the store (`persistence.SqlStore.ids_with_prefix`). A prefix that fits several ids is a
usage error listing the first few; one that fits none is not found. An id given whole is
always itself, however short.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

from controlplane.contract import ErrorCode, SubagentControlError, escape_controls

if TYPE_CHECKING:
    from persistence import SqlStore

__all__ = ["MAX_CANDIDATES", "MIN_PREFIX", "resolve_id"]

MIN_PREFIX: Final = 4
"""The shortest prefix that stands for an id (a shorter text must be a whole id)."""
MAX_CANDIDATES: Final = 10
"""How many of the ids an ambiguous prefix fits are listed."""

_NOUNS: Final = {"child": "children", "task": "tasks", "request": "requests"}
_NOT_FOUND: Final = {
    "child": ErrorCode.CHILD_NOT_FOUND,
    "task": ErrorCode.TASK_NOT_FOUND,
    "request": ErrorCode.REQUEST_NOT_FOUND,
}


def resolve_id(store: SqlStore, kind: str, text: str) -> str:
    """The id of ``kind`` that ``text`` is, or is the unique prefix of.

    Raises:
        SubagentControlError: ``INVALID_INPUT`` (a usage error) when the prefix fits more
            than one id, the first `MAX_CANDIDATES` listed; ``CHILD_NOT_FOUND``,
            ``TASK_NOT_FOUND`` or ``REQUEST_NOT_FOUND`` when it fits none.
    """
    if not text:
        raise SubagentControlError(ErrorCode.INVALID_INPUT, f"an empty {kind} id")
    # One more than we list: enough to tell "exactly these" from "these and more".
    found = store.ids_with_prefix(kind, text, limit=MAX_CANDIDATES + 1)
    if text in found:  # a whole id, even if it is also the prefix of another
        return text
    if len(text) < MIN_PREFIX or not found:
        hint = (
            f" (a prefix needs at least {MIN_PREFIX} characters)"
            if found and len(text) < MIN_PREFIX
            else ""
        )
        raise SubagentControlError(
            _NOT_FOUND[kind], escape_controls(f"no {kind} {text!r} in this store{hint}")
        )
    if len(found) == 1:
        return found[0]
    shown = found[:MAX_CANDIDATES]
    more = " and more" if len(found) > MAX_CANDIDATES else ""
    raise SubagentControlError(
        ErrorCode.INVALID_INPUT,
        escape_controls(
            f"{kind} prefix {text!r} is ambiguous: it starts {len(shown)}{more} "
            f"{_NOUNS.get(kind, kind)} ({', '.join(shown)}{', …' if more else ''}); "
            "give more characters"
        ),
    )
