"""How `SubagentControl` closes: it stops taking work, lets the running turns go on for
its grace, stops the rest (handed over, or killed past the deadline), then stops its actors,
runtime row and store; at interpreter exit the same, with no grace and nothing killed.
Kept apart from the facade so that `controlplane.runtime._facade` reads as the wiring and
the calls; `ClosingApi` is the mixin `SubagentControl` inherits ``close`` and its context
manager from. Like the facade, it imports the actors and pykka only in the calls that use
them (`tests/test_import_cost.py`).
"""

from __future__ import annotations

import contextlib
import threading
import time
from types import TracebackType
from typing import TYPE_CHECKING, Self

from controlplane.runtime._exit import closed

if TYPE_CHECKING:
    from actors import Passivator, RootActorProxy
    from controlplane.runtime._admin import AdminServer
    from controlplane.runtime.approvals._approvals import Approvals
    from controlplane.runtime.lease._runtime import Heartbeat
    from controlplane.runtime.routing._router import Router
    from controlplane.runtime.spend._admission import Admission
    from controlplane.runtime.tasks._tasks import TaskService
    from persistence import SqlStore

__all__ = ["ClosingApi"]

_ROOT_TIMEOUT_S = 30.0
_STOP_TIMEOUT_S = 30.0
"""How long `close` waits, by default, for the activations it stopped to end."""


class ClosingApi:
    """`SubagentControl`'s ``close``, its exit-time close and its context manager. A mixin
    of the facade, which sets these fields in its ``__init__``."""

    _lock: threading.Lock
    _closed: bool
    _close_timeout_s: float
    _admin_servers: list[AdminServer]
    _router: Router | None
    _passivator: Passivator | None
    _root: RootActorProxy | None
    _tasks: TaskService
    _admission: Admission | None
    _approvals: Approvals | None
    _heartbeat: Heartbeat | None
    _store: SqlStore | None

    def close(self, *, timeout_s: float | None = None) -> None:
        """Stop taking work, let running turns go on for at most ``close_timeout_s``, then
        stop the rest (handed over) and wait for them, then stop actors and store.

        Idempotent. Activations that have not ended within ``timeout_s`` (default 30 s) of
        being stopped are abandoned (their daemon threads cannot keep the process alive). A
        control plane still open when the interpreter exits is closed then, within a bound
        (`controlplane.runtime._exit`), with no grace.
        """
        budget = _STOP_TIMEOUT_S if timeout_s is None else timeout_s
        self._close(budget, abandon=True, grace_s=self._close_timeout_s)

    def _close_at_exit(self, timeout_s: float) -> None:
        """`close` at interpreter exit. Past the deadline, a Task whose activation has not
        settled is left running in the store, as a crash leaves it (the next runtime settles
        it ``interrupted`` and closes its turn), not settled ``killed`` over an open turn:
        after the exit nobody here can read it, and the store must stay consistent."""
        self._close(timeout_s, abandon=False)

    def _close(self, budget: float, *, abandon: bool, grace_s: float = 0.0) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            servers, self._admin_servers = self._admin_servers, []
        closed(self)
        for server in servers:
            server.close()
        if self._router is not None:
            self._router.stop_serving()
        if self._passivator is not None:
            self._passivator.stop()
        if self._root is not None:
            import pykka

            with contextlib.suppress(pykka.ActorDeadError, pykka.Timeout):
                self._root.stop_accepting(_ROOT_TIMEOUT_S)
        if grace_s > 0:
            # No new work from here on; the running turns may still end by themselves.
            grace_end = time.monotonic() + grace_s
            for task_id in self._tasks.refuse("control plane closed"):
                self._tasks.wait_released(task_id, max(0.0, grace_end - time.monotonic()))
        deadline = time.monotonic() + budget
        for task_id in self._tasks.close("control plane closed"):
            self._tasks.wait_released(task_id, max(0.0, deadline - time.monotonic()))
        if abandon:
            # Past the deadline: what has not settled is killed here, so no Task reads
            # `running` after close (its daemon thread may still end later; it writes nothing).
            self._tasks.abandon("killed: the control plane closed before the run stopped")
        if self._admission is not None:
            self._admission.close()
        if self._approvals is not None:
            self._approvals.close()
        if self._root is not None:
            import pykka

            with contextlib.suppress(pykka.ActorDeadError, pykka.Timeout):
                self._root.shutdown(max(1.0, deadline - time.monotonic()))
        if self._router is not None:
            self._router.close()
        if self._heartbeat is not None:
            self._heartbeat.close()
        if self._store is not None:
            self._store.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
