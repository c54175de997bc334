"""Recovery: a running turn outlives its runtime.

When a runtime ends mid-turn — a crash, SIGKILL, a lost lease, or `close()` handing its
work over — its running Tasks stay ``running`` in the store, each with its child's open
turn. A live runtime that has the child's provider takes such a Task over from its sweep
(`controlplane.runtime.lease._runtime.Runtime.sweep`): in one transaction under the child's lock it
writes a ``task/recovered`` event into the turn, names itself on the Task's row and takes the
child's claim with a new fencing number (`persistence.SqlStore.recover`); then the child's
supervisor here starts a *continued* activation of the same Task in the same turn, from
its durable events (`ResumeRequest.open_turn`), exactly as an approval's answer continues
a parked Task. The parent does nothing: `tasks.wait` keeps waiting, the Task stays
``running``.

What is not carried on, and why, is settled ``interrupted`` with its reason:

- a Task recovered `DEFAULT_MAX_RECOVERIES` times in its turn (a child that keeps killing
  its runtime): its next death ends it (`persistence._claims.Claims.recover`);
- a Task whose provider cannot carry a turn on (`recovers_turns` false), or cannot carry
  this child's on (its ``recovery_refusal(events)`` says why: an ACP agent that offers
  neither ``session/resume`` nor ``session/load``), or a runtime opened with
  ``recover=False``;
- a Task whose provider no live runtime has: it waits in the store, ``running``, for one
  to open; once its runtime has been dead for `PROVIDER_WAIT_S` with nobody to take it,
  any runtime settles it ``interrupted`` naming the provider it waited for;
- a Task that never wrote its turn's frame (nothing durable to go on from).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import TYPE_CHECKING

from controlplane.contract import (
    ErrorCode,
    SubagentControlError,
    TaskSnapshot,
    TaskStatus,
    fold_descriptor,
)
from controlplane.runtime._defaults import DEFAULT_MAX_RECOVERIES, PROVIDER_WAIT_S
from controlplane.telemetry import log_lifecycle

if TYPE_CHECKING:
    from controlplane.contract import (
        ProviderRegistry,
        RuntimeInfo,
        SessionEvent,
    )
    from controlplane.runtime.lease._runtime import Runtime
    from persistence import SqlStore

__all__ = ["DEFAULT_MAX_RECOVERIES", "PROVIDER_WAIT_S", "RecoverHere", "Recovery"]

log = logging.getLogger(__name__)


RecoverHere = Callable[[TaskSnapshot, int, int], None]
"""Start the recovered Task here: ``recover_here(snapshot, fence, recovery)`` hands its
child's supervisor the order (the child is already claimed for it)."""


class Recovery:
    """This runtime's side of recovery: whether and how to take a dead runtime's Task.

    Args:
        store: The shared store.
        runtime: This runtime (its id, its judgement of the others).
        providers: This runtime's providers: it carries on only Tasks whose child's
            provider it has, and whose provider can carry a turn on.
        enabled: False (``recover=False``): every Task it would take is settled
            ``interrupted`` instead: its turn is closed, not carried on.
        max_recoveries: How many recoveries one turn gets.
        provider_wait_s: How long a Task whose provider this runtime lacks is left for one
            that has it, past its dead runtime's end.
    """

    def __init__(
        self,
        store: SqlStore,
        runtime: Runtime,
        providers: ProviderRegistry,
        *,
        enabled: bool,
        max_recoveries: int,
        provider_wait_s: float = PROVIDER_WAIT_S,
    ) -> None:
        self._store = store
        self._runtime = runtime
        self._providers = providers
        self.enabled = enabled
        self.max_recoveries = max_recoveries
        self.provider_wait_s = provider_wait_s
        self._here: RecoverHere | None = None
        self._wake: Callable[[], None] | None = None
        self._lock = threading.Lock()
        self._carrying: set[str] = set()

    def start(self, recover_here: RecoverHere, wake: Callable[[], None] | None = None) -> None:
        """Take Tasks over from now on, starting them through ``recover_here``; ``wake``
        asks for a sweep at once (`held_by_dead`)."""
        self._here = recover_here
        self._wake = wake

    def recovers_here(self, provider: str | None) -> bool:
        """Whether this runtime carries on a dead runtime's running Task of a child with
        ``provider`` (the claim asks, `persistence.SqlStore.admit_claiming`): a message to
        that child then waits for the recovered Task instead of interrupting it."""
        if not self.enabled or self._here is None or provider is None:
            return False
        if provider not in self._providers.names():
            return False
        return bool(getattr(self._providers.get(provider), "recovers_turns", False))

    def held_by_dead(self) -> None:
        """A send found its child's claim with a dead runtime's running Task that this
        runtime carries on: sweep now, so that the Task goes on (and the send's retry
        steers it) without waiting for the next sweep."""
        if self._wake is not None:
            self._wake()

    def take(self, task: TaskSnapshot, dead: RuntimeInfo | None) -> bool:
        """Carry on ``task``, a running Task of the dead runtime ``dead``, if this runtime
        can; whether it was dealt with (recovered here, settled at its limit, or left for a
        runtime with its provider). False: the caller settles it ``interrupted``."""
        if not self.enabled or self._here is None or task.child_id is None:
            return False
        try:
            provider, events = self._provider_of(task.child_id)
        except SubagentControlError as exc:
            if exc.code is ErrorCode.CHILD_NOT_FOUND:
                return False  # never published, so no resumable child: interrupted
            # Unreadable now (the store is busy or out of reach): the next sweep looks again,
            # within the provider wait.
            return self._wait_for_provider(task, dead, "unknown (its transcript was unreadable)")
        if provider is None:
            return False
        found = self._providers.get(provider) if provider in self._providers.names() else None
        if found is None:
            return self._wait_for_provider(task, dead, provider)
        refusal = getattr(found, "recovery_refusal", None)
        why = refusal(events) if callable(refusal) else None
        if why is not None:
            self._store.interrupt(
                task,
                f"interrupted: its runtime {task.runtime_id} ended mid-turn, and {why}; "
                "send the child a message to continue it in a new turn",
            )
            return True
        if not getattr(found, "recovers_turns", False):
            return False
        with self._carrying_task(task.id):
            return self._recover(task, task.child_id, self._here)

    def _recover(self, task: TaskSnapshot, child_id: str, here: RecoverHere) -> bool:
        """`take`'s takeover, once the provider can carry the turn on (inside
        `_carrying_task`)."""
        result = self._store.recover(
            task.id, child_id, self._runtime.id,
            is_dead=self._runtime.judge, limit=self.max_recoveries,
        )  # fmt: skip
        if result.exhausted:
            log_lifecycle(
                logging.WARNING, "recovery", child_id=task.child_id, task_id=task.id,
                runtime_id=self._runtime.id, status="interrupted", dead_runtime=task.runtime_id,
            )  # fmt: skip
            return True
        if result.unframed:
            self._store.interrupt(
                task,
                f"interrupted: its runtime {task.runtime_id} ended before it wrote the "
                "turn's message, so there was no turn to carry on; send the message again",
            )
            return True
        if result.fence is None:
            return False  # settled meanwhile, or not takeable: interrupt settles it, or not
        log_lifecycle(
            logging.WARNING, "recovery", child_id=task.child_id, task_id=task.id,
            runtime_id=self._runtime.id, status="running", dead_runtime=task.runtime_id,
        )  # fmt: skip
        moved = task.model_copy(update={"runtime_id": self._runtime.id})
        try:
            here(moved, result.fence, result.recoveries)
        except SubagentControlError as exc:
            # Claimed here, not started (this runtime is closing, or the child's supervisor
            # refused): settled, so it does not sit claimed by a live runtime that runs it not.
            self._store.interrupt(
                moved,
                f"interrupted: runtime {self._runtime.id} took it over from runtime "
                f"{task.runtime_id}, which ended, but could not start it ({exc.message}); "
                "send the child a message to continue it",
            )
        return True

    @contextmanager
    def _carrying_task(self, task_id: str) -> Iterator[None]:
        """`carrying` answers True for ``task_id`` inside the block. The block covers the
        store call that claims the child for the Task, from before its commit: a send of
        this runtime's that claims the child between that commit and the mark would find
        the claim this runtime's, naming that Task, and settle it ``interrupted`` as a
        stale Task of its own, when it is being started here."""
        with self._lock:
            self._carrying.add(task_id)
        try:
            yield
        finally:
            with self._lock:
                self._carrying.discard(task_id)

    def carrying(self, task_id: str) -> bool:
        """Whether this runtime is starting ``task_id`` here right now, taken over from a
        runtime that ended (claimed here, its activation not yet begun): a send's claim
        meanwhile must not take it for a stale Task of this runtime's and end it."""
        with self._lock:
            return task_id in self._carrying

    def take_waiting(self, task: TaskSnapshot) -> bool:
        """Run ``task`` here if it waits for a runtime with its child's provider and this
        runtime has it (the runtime that took its message lacked the provider,
        `persistence.SqlStore.await_provider`): same Task,
        in the turn its message opened. A Task that waited `PROVIDER_WAIT_S` past its
        creation with no such runtime taking it is settled ``interrupted``, naming the
        provider. Whether it was dealt with here."""
        provider = task.waiting_for
        if self._here is None or task.child_id is None or provider is None:
            return False
        if provider in self._providers.names():
            with self._carrying_task(task.id):
                return self._take_waiting_here(task, task.child_id, self._here, provider)
        waited = task.created_at + timedelta(seconds=self.provider_wait_s)
        if self._store.ledger.now().wall < waited:
            return False  # a runtime with the provider takes it (or the next to open)
        return self._store.interrupt(
            task,
            f"interrupted: it waited for a runtime with its provider {provider!r}, and none "
            f"took it within {self.provider_wait_s:g} s; open one (or send the message from "
            "one), then send the child the message again",
        )

    def _take_waiting_here(
        self, task: TaskSnapshot, child_id: str, here: RecoverHere, provider: str
    ) -> bool:
        """`take_waiting`'s take, this runtime having the provider (inside
        `_carrying_task`)."""
        fence = self._store.take_waiting(task.id, child_id, self._runtime.id)
        if fence is None:
            return False  # another runtime took it, or it settled
        log_lifecycle(
            logging.INFO, "provider", child_id=task.child_id, task_id=task.id,
            runtime_id=self._runtime.id, status="running", waited_in=task.runtime_id,
        )  # fmt: skip
        moved = task.model_copy(
            update={"runtime_id": self._runtime.id, "status": TaskStatus.RUNNING,
                    "waiting_for": None}
        )  # fmt: skip
        try:
            here(moved, fence, task.recoveries)
        except SubagentControlError as exc:
            self._store.interrupt(
                moved,
                f"interrupted: runtime {self._runtime.id} took it (it has provider "
                f"{provider!r}) but could not start it ({exc.message}); send the child a "
                "message to continue it",
            )
        return True

    def _provider_of(self, child_id: str) -> tuple[str | None, list[SessionEvent]]:
        """The child's provider, from its newest descriptor (None: it has none), and its
        own events (a provider's ``recovery_refusal`` reads them).

        Raises:
            SubagentControlError: the store could not load it.
        """
        loaded = self._store.load(child_id)
        descriptor = fold_descriptor(loaded.own_events)
        return None if descriptor is None else descriptor.provider, loaded.own_events

    def _wait_for_provider(self, task: TaskSnapshot, dead: RuntimeInfo | None,
                           provider: str) -> bool:  # fmt: skip
        """Leave a Task whose provider this runtime lacks for a runtime that has it, for
        `PROVIDER_WAIT_S` past its dead runtime's lease; then settle it, saying why."""
        if dead is None:
            return False
        # From its end: its close, else its last heartbeat (on the wall clock: the wait is
        # long beside any skew between hosts).
        ended = dead.closed_at or dead.heartbeat_at
        if self._store.ledger.now().wall < ended + timedelta(seconds=self.provider_wait_s):
            return True  # a runtime with the provider takes it (or the next to open)
        self._store.interrupt(
            task,
            f"interrupted: its runtime {task.runtime_id} ended before the task settled, and "
            f"no runtime with its provider {provider!r} took it over within "
            f"{self.provider_wait_s:g} s; send the child a message to continue it",
        )
        return True
