"""Short ids from MCP clients: a tool's ``subagent_id``, ``task_id`` or ``request_id`` may
be a unique prefix (4+ characters) of the id, as every id argument of the CLI may.

Resolved among the calling session's own children, Tasks and pending requests only, so a
prefix neither reaches nor reveals another session's ids. A whole id is passed on as it is
(the tool answers for it); an ambiguous prefix is refused, listing the candidates.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Final

from controlplane.contract import AgentHandle, ErrorCode, SubagentControlError, escape_controls

if TYPE_CHECKING:
    from controlplane.runtime._facade import SubagentControl

__all__ = ["expand_ids", "needs_expanding"]

MIN_PREFIX: Final = 4
_WHOLE: Final = 36  # a uuid's length: the ids the control plane makes
_SHOWN: Final = 10
_KINDS: Final = {"subagent_id": "child", "task_id": "task", "request_id": "request"}


def needs_expanding(arguments: dict[str, Any]) -> bool:
    """Whether an id argument is short enough to be a prefix: only then does `expand_ids`
    read the session's ids (a whole id, or none, is passed on without a read)."""
    for key in _KINDS:
        value = arguments.get(key)
        if isinstance(value, str) and MIN_PREFIX <= len(value) < _WHOLE:
            return True
    return False


def expand_ids(
    control: SubagentControl, parent: AgentHandle, arguments: dict[str, Any]
) -> dict[str, Any]:
    """``arguments`` with each id argument given as a unique prefix replaced by its id.

    Raises:
        SubagentControlError: ``INVALID_INPUT`` for a prefix that fits several of the
            session's ids (the first few are listed).
    """
    expanded = dict(arguments)
    for key, kind in _KINDS.items():
        value = expanded.get(key)
        if not isinstance(value, str) or not MIN_PREFIX <= len(value) < _WHOLE:
            continue
        own = _own_ids(control, parent, kind)
        if value in own:
            continue
        found = sorted(i for i in own if i.startswith(value))
        if len(found) == 1:
            expanded[key] = found[0]
        elif found:
            shown = ", ".join(found[:_SHOWN]) + (", …" if len(found) > _SHOWN else "")
            raise SubagentControlError(
                ErrorCode.INVALID_INPUT,
                escape_controls(
                    f"{key} {value!r} is ambiguous: it starts {len(found)} of this session's "
                    f"ids ({shown}); give more characters"
                ),
            )
    return expanded


def _own_ids(control: SubagentControl, parent: AgentHandle, kind: str) -> set[str]:
    if kind == "child":
        store = control.store
        if store is None:
            return set()
        return {meta.child_id for meta in store.list_children(parent.session_id)}
    tasks = control.tasks.list(parent)
    if kind == "task":
        return {task.id for task in tasks}
    return {task.request.id for task in tasks if task.request is not None}
