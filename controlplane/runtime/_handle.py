"""`ChildHandle`: the verbs a newcomer needs, on the child they just started.

Shaped after Temporal's ``WorkflowHandle``: `SubagentControl.start` returns one, bound to
the parent that started the child, with ``send``, ``wait``, ``kill``, ``transcript`` and
``usage``; `SubagentControl.child` makes one again for an existing child id (after a
restart, in another process). A handle holds only ids: every verb is the control plane's
own public call (``send_message``, ``tasks.wait``, ``tasks.kill``, ``store.load``,
``usage``) with the parent filled in, so it answers and refuses exactly as those do.

`HandleApi` is the mixin `SubagentControl` takes ``start`` and ``child`` from.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from controlplane.contract import ErrorCode, SubagentControlError
from controlplane.runtime._validate import check_child_id, message_blocks

# `SubagentControl` inherits `HandleApi`: pydantic, the contract's models and the spend wing
# are imported in the calls that use them, so that importing the facade builds no model.
if TYPE_CHECKING:
    from controlplane.contract import (
        AgentHandle,
        ContinuableStart,
        ContinuableStartSpec,
        MessageSource,
        SendResult,
        SessionEvent,
        TaskSnapshot,
        TextBlock,
        Usage,
    )
    from controlplane.runtime._task_view import Tasks
    from persistence import SqlStore

__all__ = ["ChildHandle", "HandleApi", "Message"]

Message = str | Sequence["TextBlock"]
"""A message: a plain ``str`` (one text block), or a list of `TextBlock`."""


class ChildHandle:
    """A durable child as its parent holds it: send it messages, wait for or kill the Task
    it runs, read its transcript and what it spent.

    The handle follows one Task at a time: its start's, then that of each ``send`` made
    through it (a steer keeps the running Task, a resume starts the next). A handle made
    again with `SubagentControl.child` follows the child's newest Task of the parent's
    session. Thread-safe; it holds ids only, so any number may exist for one child.
    """

    __slots__ = ("_child_id", "_control", "_lock", "_parent", "_task_id")

    def __init__(
        self, control: HandleApi, parent: AgentHandle, child_id: str, task_id: str | None
    ) -> None:
        self._control = control
        self._parent = parent
        self._child_id = child_id
        self._task_id = task_id
        self._lock = threading.Lock()

    @property
    def child_id(self) -> str:
        """The child's id: stable across every activation, process and restart."""
        return self._child_id

    @property
    def parent(self) -> AgentHandle:
        """The parent session the handle acts as."""
        return self._parent

    @property
    def task_id(self) -> str | None:
        """The Task the handle follows (``wait``, ``kill``); None for a child whose
        Tasks the parent's session has none of (none were kept)."""
        with self._lock:
            return self._task_id

    def send(self, message: Message, source: MessageSource | None = None) -> SendResult:
        """`SubagentControl.send_message` to this child as its parent: ``steered`` into
        the running turn, or ``started`` (a resume); the handle then follows that Task.

        Raises:
            SubagentControlError: as ``send_message`` (nothing was delivered, except
                ``DURABILITY_FAILED``); ``INVALID_INPUT`` for a message that is neither a
                non-empty ``str`` nor a list of `TextBlock`.
        """
        result = self._control.send_message(self._parent, self._child_id, message, source)
        with self._lock:
            self._task_id = result.task_id
        return result

    def wait(self, timeout: float | None = None) -> TaskSnapshot:
        """`tasks.wait` on the followed Task: block until it settles (or waits for an
        approval answer) and return its snapshot.

        Raises:
            SubagentControlError: ``TIMEOUT`` (the Task keeps running);
                ``TASK_NOT_FOUND`` when the handle follows no Task.
        """
        return self._control.tasks.wait(self._current(), timeout, requester=self._parent)

    def kill(self) -> None:
        """`tasks.kill` on the followed Task: request its cancellation and return at once.

        Raises:
            SubagentControlError: as ``tasks.kill``; ``TASK_NOT_FOUND`` when the handle
                follows no Task.
        """
        self._control.tasks.kill(self._current(), requester=self._parent)

    def transcript(self) -> list[SessionEvent]:
        """The child's durable events, oldest first (empty until its first run is
        published and the child is durable).

        Raises:
            SubagentControlError: ``CHILD_NOT_FOUND`` for a child that is not the parent's;
                ``STORE_UNAVAILABLE``, ``CLOSED``.
        """
        from controlplane.runtime.spend._usage_views import load_own

        try:
            return load_own(self._control._open_store(), self._parent, self._child_id).events
        except SubagentControlError as exc:
            if exc.code is ErrorCode.CHILD_NOT_FOUND and self.task_id is not None:
                return []  # started here, not durable yet
            raise

    def usage(self) -> Usage:
        """`SubagentControl.usage`: what the child spent over all its turns (zero until it
        is durable).

        Raises:
            SubagentControlError: as ``usage``.
        """
        try:
            return self._control.usage(self._parent, self._child_id)
        except SubagentControlError as exc:
            if exc.code is ErrorCode.CHILD_NOT_FOUND and self.task_id is not None:
                from controlplane.contract import Usage

                return Usage.zero()  # started here, not durable yet
            raise

    def _current(self) -> str:
        task_id = self.task_id
        if task_id is None:
            raise SubagentControlError(
                ErrorCode.TASK_NOT_FOUND,
                f"child {self._child_id} has no Task of this session; send it a message "
                "to start one",
                child_id=self._child_id,
            )
        return task_id

    def __repr__(self) -> str:
        return (
            f"<ChildHandle child={self._child_id} task={self.task_id} "
            f"parent={self._parent.session_id}>"
        )


class HandleApi:
    """``start`` and ``child`` of `SubagentControl` (a mixin: the facade defines the calls
    a handle forwards to)."""

    tasks: Tasks

    if TYPE_CHECKING:

        def start_continuable(self, spec: ContinuableStartSpec) -> ContinuableStart: ...

        def send_message(
            self,
            parent: AgentHandle,
            child_id: str,
            message: Message,
            source: MessageSource | None = None,
        ) -> SendResult: ...

        def usage(
            self, requester: AgentHandle | str, child_id: str, *, tree: bool = False
        ) -> Usage: ...

        def _open_store(self) -> SqlStore: ...

        def _check_open(self) -> None: ...

        def _check_parent(self, parent: object) -> None: ...

    def start(
        self,
        parent: AgentHandle,
        prompt: Message,
        *,
        provider: str = "inprocess",
        label: str | None = None,
        **options: Any,
    ) -> ChildHandle:
        """Start a durable child of ``parent`` in the background and return its handle.

        `start_continuable` with the prompt as a ``str`` (or a list of `TextBlock`), the
        label derived from the prompt unless given (whitespace collapsed, at most 80
        characters), and ``options`` the other fields of `ContinuableStartSpec`
        (``persona``, ``tool_filter``, ``budget``, ``inputs``, ``agent_model``, …).

        Example:
            >>> child = control.start(parent, "research X")  # doctest: +SKIP
            >>> child.wait(timeout=60).outcome  # doctest: +SKIP

        Raises:
            SubagentControlError: as `start_continuable`; ``INVALID_INPUT`` for an empty
                or non-text prompt or an unknown option. Nothing is left behind.
        """
        self._check_open()
        from pydantic import ValidationError

        from actors import follow_up_label
        from controlplane.contract import ContinuableStartSpec

        blocks = message_blocks(prompt)
        try:
            spec = ContinuableStartSpec(
                provider=provider,
                label=follow_up_label(blocks) if label is None else label,
                prompt=list(blocks),
                parent=parent,
                **options,
            )
        except ValidationError as exc:
            error = exc.errors()[0]
            where = ".".join(str(part) for part in error["loc"])
            raise SubagentControlError(
                ErrorCode.INVALID_INPUT, f"start: {where}: {error['msg']}; nothing was started"
            ) from None
        started = self.start_continuable(spec)
        return ChildHandle(self, parent, started.child_id, started.task_id)

    def child(self, parent: AgentHandle, child_id: str) -> ChildHandle:
        """The handle of an existing child of ``parent`` (started by this process or any
        other, before or after a restart), following the child's newest Task.

        Raises:
            SubagentControlError: ``CHILD_NOT_FOUND`` for an unknown child or one that is
                not the parent's (the same error); ``UNAUTHORIZED`` for a parent that is
                not live; ``INVALID_INPUT`` for an id that is not a str; ``CLOSED``.
        """
        self._check_open()
        self._check_parent(parent)
        check_child_id(child_id)
        newest = [t for t in self.tasks.list(parent) if t.child_id == child_id]
        if not newest:
            from controlplane.runtime.spend._usage_views import load_own

            load_own(self._open_store(), parent, child_id)  # CHILD_NOT_FOUND unless the parent's
        return ChildHandle(self, parent, child_id, newest[-1].id if newest else None)
