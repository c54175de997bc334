"""The lifecycle lines of the logs: one per start, publish, steer, settle, kill, retry and
takeover, each naming the child, the Task and the runtime, at levels an operator filters on.

Logger `LIFECYCLE_LOGGER` (``controlplane.lifecycle``), under the package's NullHandler:
the host decides where lines go. INFO is the normal lifecycle; WARNING a failed or
interrupted Task, a takeover, a store retry. No line carries a message's text, only its
length (``chars=``): a message may be private.
"""

from __future__ import annotations

import logging
from contextvars import ContextVar, Token
from typing import TYPE_CHECKING, Final, NamedTuple

from controlplane.contract import TaskStatus, escape_controls

if TYPE_CHECKING:
    from controlplane.contract import TaskSnapshot

__all__ = [
    "LIFECYCLE_LOGGER",
    "current_scope",
    "lifecycle_enabled",
    "log_kill",
    "log_lifecycle",
    "log_settled",
    "scoped",
]

LIFECYCLE_LOGGER: Final = "controlplane.lifecycle"

_VALUE_LIMIT = 1000

_log = logging.getLogger(LIFECYCLE_LOGGER)


class _Scope(NamedTuple):  # a tuple: built on every steer, where a dataclass costs 4x
    runtime_id: str | None
    child_id: str | None
    task_id: str | None


_SCOPE: ContextVar[_Scope | None] = ContextVar("subagent_control_scope", default=None)


class scoped:  # noqa: N801 - used as a function: `with scoped(...):`
    """Bind ids to this thread's log lines that cannot see them (a store retry deep in a
    write names the child and Task it was writing for)."""

    __slots__ = ("_scope", "_token")

    def __init__(
        self, runtime_id: str | None, child_id: str | None = None, task_id: str | None = None
    ) -> None:
        self._scope = _Scope(runtime_id, child_id, task_id)
        self._token: Token[_Scope | None] | None = None

    def __enter__(self) -> None:
        self._token = _SCOPE.set(self._scope)

    def __exit__(self, *exc: object) -> None:
        if self._token is not None:
            _SCOPE.reset(self._token)


def current_scope() -> tuple[str | None, str | None]:
    """The (child id, Task id) bound to this thread by `scoped`, if any."""
    scope = _SCOPE.get()
    return (None, None) if scope is None else (scope.child_id, scope.task_id)


def lifecycle_enabled(level: int) -> bool:
    """Whether the lifecycle logger would emit a line at ``level``."""
    return _log.isEnabledFor(level)


def log_lifecycle(
    level: int,
    event: str,
    *,
    child_id: str | None,
    task_id: str | None,
    runtime_id: str | None,
    **fields: object,
) -> None:
    """One lifecycle line: ``EVENT child=… task=… runtime=… key=value…``.

    The ids are also record attributes (``child_id``, ``task_id``, ``runtime_id``,
    ``subagent_event``) for structured handlers. Values are shown on one line, controls
    escaped. Callers pass lengths, never a message's text.
    """
    if not _log.isEnabledFor(level):
        return
    extra = "".join(f" {key}={_shown(value)}" for key, value in fields.items() if value is not None)
    _log.log(
        level,
        "%s child=%s task=%s runtime=%s%s",
        event,
        _shown(child_id or "-"),
        task_id or "-",
        runtime_id or "-",
        extra,
        extra={
            "subagent_event": event,
            "child_id": child_id,
            "task_id": task_id,
            "runtime_id": runtime_id,
        },
    )


def _shown(value: object) -> str:
    text = escape_controls(str(value))
    if len(text) > _VALUE_LIMIT:
        text = text[: _VALUE_LIMIT - 1] + "…"
    return repr(text) if " " in text or not text else text


def log_kill(child_id: str | None, task_id: str, runtime_id: str | None, reason: str) -> None:
    """A kill was requested (the activation's signal aborted for the first time)."""
    log_lifecycle(
        logging.INFO, "kill", child_id=child_id, task_id=task_id, runtime_id=runtime_id,
        reason=reason,
    )  # fmt: skip


def log_settled(snapshot: TaskSnapshot, runtime_id: str | None) -> None:
    """A Task settled: INFO when completed or killed, WARNING when it failed or was
    interrupted (with its detail; a completed Task's output is never logged)."""
    outcome = snapshot.outcome
    if outcome is None:
        return
    trouble = outcome.status in (TaskStatus.FAILED, TaskStatus.INTERRUPTED)
    log_lifecycle(
        logging.WARNING if trouble else logging.INFO,
        "settle",
        child_id=snapshot.child_id,
        task_id=snapshot.id,
        runtime_id=runtime_id,
        status=outcome.status.value,
        code=outcome.code.value if outcome.code is not None else None,
        detail=outcome.detail if outcome.status is not TaskStatus.COMPLETED else None,
    )
