"""What children spent, read back from the store: one child, a child and its descendants
(its tree), or everything a session's children and their descendants spent.

Every figure is a sum over the usage recorded with the children's own events
(`controlplane.contract.usage_of`; a fork's seed is its parent's spend, not its own), so
it holds across resumes, runtimes and restarts, and a turn still running counts what it
has written so far. A child's descendants are the children it started: those whose
parent session is its id, and theirs, recursively.
"""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING, Final

from controlplane.contract import (
    ErrorCode,
    SubagentControlError,
    Usage,
    requester_session,
    usage_of,
)

if TYPE_CHECKING:
    from controlplane.contract import (
        LoadedSession,
        Requester,
    )
    from persistence import SqlStore

__all__ = ["child_usage", "load_own", "session_usage"]

MAX_TREE_CHILDREN: Final = 100_000
"""The most descendants one aggregate reads: a bound on the walk, far past any real tree."""


def child_usage(store: SqlStore, requester: Requester, child_id: str, *, tree: bool) -> Usage:
    """What ``child_id`` spent over all its turns (with ``tree``: and every descendant).

    Raises:
        SubagentControlError: ``CHILD_NOT_FOUND`` for an unknown child or one that is not
            the requester's (the same error: whether it exists is not told);
            ``INVALID_INPUT`` for a requester that is neither a handle nor a session id,
            or a ``tree`` that is not a bool.
    """
    session = requester_session(requester)
    if not isinstance(tree, bool):
        raise SubagentControlError(
            ErrorCode.INVALID_INPUT, f"tree must be True or False, not {tree!r}"
        )
    loaded = load_own(store, session, child_id)
    total = usage_of(loaded.own_events)
    if tree:
        total = total + _descendants_usage(store, [loaded.meta.child_id])
    return total


def session_usage(store: SqlStore, requester: Requester) -> Usage:
    """Everything ``requester``'s children and their descendants spent.

    Raises:
        SubagentControlError: ``INVALID_INPUT`` for a requester that is neither a handle
            nor a session id.
    """
    return _descendants_usage(store, [requester_session(requester)])


def _descendants_usage(store: SqlStore, roots: list[str]) -> Usage:
    """The spend of every child below the sessions ``roots`` (not of the roots)."""
    total = Usage.zero()
    pending = deque(roots)
    seen: set[str] = set(roots)
    while pending:
        for meta in store.list_children(pending.popleft()):
            if meta.child_id in seen:
                continue  # a child's session is its id: no cycle, but never walked twice
            if len(seen) > MAX_TREE_CHILDREN:
                raise SubagentControlError(
                    ErrorCode.CAPACITY,
                    f"this tree has more than {MAX_TREE_CHILDREN} children; its spend was "
                    "not summed",
                )
            seen.add(meta.child_id)
            try:
                loaded = store.load(meta.child_id)
            except SubagentControlError as exc:
                if exc.code is ErrorCode.CHILD_NOT_FOUND:
                    continue  # listed, then gone: nothing of it to count
                raise
            total = total + usage_of(loaded.own_events)
            pending.append(meta.child_id)
    return total


def load_own(store: SqlStore, requester: Requester, child_id: str) -> LoadedSession:
    """``child_id`` loaded, if it is ``requester``'s child.

    Raises:
        SubagentControlError: ``CHILD_NOT_FOUND`` for an unknown child, an id the store
            cannot hold, or another session's child (the same error: whether it exists
            is not told).
    """
    session = requester_session(requester)
    unknown = SubagentControlError(
        ErrorCode.CHILD_NOT_FOUND,
        f"no child {child_id!r} for this session; list your children and use one of those ids",
        child_id=child_id if isinstance(child_id, str) else None,
    )
    try:
        loaded = store.load(child_id)
    except SubagentControlError as exc:
        # An id the store cannot even hold is as unknown as one it does not have.
        if exc.code in (ErrorCode.CHILD_NOT_FOUND, ErrorCode.INVALID_INPUT):
            raise unknown from None
        raise
    if loaded.meta.parent_session != session:
        raise unknown
    return loaded
