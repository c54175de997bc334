"""This process's runtime in the store: its row, its heartbeat, and the sweep that settles
dead runtimes' Tasks (SPEC §9).

One background thread per open `SubagentControl` renews the runtime's heartbeat every third
of ``lease_ttl_s`` (one write per interval per process, never one per child), retries Task
settlements the store refused, and sweeps: every running Task of a dead runtime — closed,
its lease lapsed, or (same host, same boot) its process gone — is settled ``interrupted``
and its child's open turn closed, once, however many runtimes sweep at the same moment
(`persistence.SqlStore.interrupt`). The first sweep runs before `SubagentControl` returns, so
the next runtime to open the store recovers what a crash left.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import threading
import uuid
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING

from controlplane._errors import ErrorCode, SubagentControlError
from controlplane._lifecycle import log_lifecycle
from controlplane._task_types import RuntimeInfo, TaskSnapshot

if TYPE_CHECKING:
    from controlplane._tasks import ForeignKill, TaskService
    from persistence import SqlStore

__all__ = ["Runtime", "new_runtime_id"]

log = logging.getLogger(__name__)

_BOOT_ID = Path("/proc/sys/kernel/random/boot_id")


def new_runtime_id() -> str:
    """A runtime id unique across processes, machines and restarts: host, pid, and 48
    random bits (the host and pid make it readable in the tree and the CLI)."""
    return f"{socket.gethostname()[:40]}-{os.getpid()}-{uuid.uuid4().hex[:12]}"


def _boot_id() -> str | None:
    try:
        return _BOOT_ID.read_text().strip() or None
    except OSError:
        return None


def _pid_gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except OSError:  # it exists, owned by someone else
        return False
    return False


class Runtime:
    """One open control plane's presence in the store.

    Args:
        runtime_id: This runtime's id (`new_runtime_id`).
        store: The shared store.
        tasks: This runtime's Task service (its unsaved settlements are retried here).
        lease_ttl_s: How long this runtime's claims outlive its last heartbeat.
    """

    def __init__(
        self, runtime_id: str, store: SqlStore, tasks: TaskService, *, lease_ttl_s: float
    ) -> None:
        self.id = runtime_id
        self._store = store
        self._tasks = tasks
        self._lease_ttl_s = lease_ttl_s
        self._host = socket.gethostname()[:255]
        self._boot = _boot_id()
        self._stopped = threading.Event()
        self._thread: threading.Thread | None = None
        self.forward_kill: ForeignKill | None = None
        """How a kill reaches a live runtime's Task (PostgreSQL: forwarding); unset, it is
        refused with ``OWNERSHIP_CONFLICT``."""
        store.ledger.register_runtime(
            self.id, host=self._host, pid=os.getpid(), boot_id=self._boot, lease_ttl_s=lease_ttl_s
        )

    def start(self) -> None:
        """Sweep once now (what a crash left is recovered before the first send), then keep
        the heartbeat and the sweep going on one background thread."""
        self.sweep()
        self._thread = threading.Thread(
            target=self._run, name=f"subagent-runtime:{self.id}", daemon=True
        )
        self._thread.start()

    def close(self) -> None:
        """Stop the thread and give the runtime's claims up at once (closed in the store)."""
        self._stopped.set()
        if self._thread is not None:
            self._thread.join()
        with contextlib.suppress(SubagentControlError):
            self._tasks.flush()
        try:
            self._store.ledger.close_runtime(self.id)
        except SubagentControlError as exc:
            log.warning("runtime %s: could not record its close (%s)", self.id, exc.message)

    # -- the sweep ---------------------------------------------------------------------

    def sweep(self) -> int:
        """Settle the running Tasks of every dead runtime ``interrupted``; returns how many
        this call settled."""
        now, suspects = self._store.ledger.suspects()
        dead = {
            r.runtime_id: r for r in suspects if r.runtime_id != self.id and self._is_dead(r, now)
        }
        if not dead:
            return 0
        settled = 0
        for task in self._store.ledger.running(list(dead)):
            settled += self.interrupt(task, dead[task.runtime_id or ""])
        return settled

    def interrupt(self, task: TaskSnapshot, runtime: RuntimeInfo | None) -> bool:
        """Settle one running Task of a dead runtime ``interrupted`` (once)."""
        where = f" (process {runtime.pid} on {runtime.host})" if runtime is not None else ""
        detail = (
            f"interrupted: its runtime {task.runtime_id}{where} ended before the task "
            "settled; send the child a message to continue it"
        )
        settled = self._store.interrupt(task, detail)
        if settled:
            log_lifecycle(
                logging.WARNING, "takeover", child_id=task.child_id, task_id=task.id,
                runtime_id=self.id, status="interrupted", dead_runtime=task.runtime_id,
            )  # fmt: skip
        return settled

    def claim(self, task: TaskSnapshot) -> int | None:
        """Admit a resume's Task and claim its child for this runtime (taking over a dead
        runtime's claim); the fencing number.

        Raises:
            SubagentControlError: ``OWNERSHIP_CONFLICT`` naming the live runtime that holds
                the child; ``CHILD_NOT_FOUND`` for a child not in the store.
        """
        return self._store.admit_claiming(task, is_dead=self._is_dead)

    def kill_foreign(self, task: TaskSnapshot, reason: str) -> None:
        """`tasks.kill` of a running Task that another runtime holds: if that runtime is
        dead the Task is settled ``interrupted`` now; a live one's Task cannot be reached
        from here on SQLite, so the caller is told which runtime holds it; on PostgreSQL
        the kill is forwarded to it (`forward_kill`)."""
        runtime = self._runtime_of(task)
        if runtime is None or self._is_dead(runtime, self._store.ledger.suspects()[0]):
            self.interrupt(task, runtime)
            return
        if self.forward_kill is not None:
            self.forward_kill(task, reason)
            return
        raise SubagentControlError(
            ErrorCode.OWNERSHIP_CONFLICT,
            f"task {task.id} runs in runtime {runtime.runtime_id} (process {runtime.pid} on "
            f"{runtime.host}), not in this one; kill it there ({reason} was not applied)",
            task_id=task.id,
            child_id=task.child_id,
        )

    def is_dead_id(self, runtime_id: str) -> bool:
        """Whether the runtime ``runtime_id`` is dead (closed, lapsed, its process gone,
        or not in the store at all)."""
        now = self._store.ledger.suspects()[0]
        for runtime in self._store.ledger.runtimes():
            if runtime.runtime_id == runtime_id:
                return self._is_dead(runtime, now)
        return True

    def _runtime_of(self, task: TaskSnapshot) -> RuntimeInfo | None:
        if task.runtime_id is None:
            return None
        return self._store.ledger.runtime(task.runtime_id)

    def _is_dead(self, runtime: RuntimeInfo, now: datetime) -> bool:
        from persistence import is_expired

        if is_expired(runtime, now):
            return True
        # Same host and boot: a process that is gone is dead now, not after its lease.
        return (
            runtime.host == self._host
            and self._boot is not None
            and runtime.boot_id == self._boot
            and _pid_gone(runtime.pid)
        )

    # -- the thread ----------------------------------------------------------------------

    def _run(self) -> None:
        period = self._lease_ttl_s / 3
        while not self._stopped.wait(period):
            try:
                if not self._store.ledger.heartbeat(self.id):
                    log.error("runtime %s: its row is closed or gone; it is dead to the others",
                              self.id)  # fmt: skip
                self._tasks.flush()
                self.sweep()
            except SubagentControlError as exc:
                log.warning("runtime %s: heartbeat or sweep failed (%s); retrying",
                            self.id, exc.message)  # fmt: skip
            except Exception:  # a bug here must not end the heartbeat: others would sweep us
                log.exception("runtime %s: heartbeat or sweep failed", self.id)
