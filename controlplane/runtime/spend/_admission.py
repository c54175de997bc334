"""Concurrency limits: at most n activations under a key run at once, across every runtime
on the store (the durable queue is `persistence._queue`).

A key is a provider name or ``"provider:model"`` (the model being the child's descriptor
``agent_model``); an activation falls under each configured key that names it. Its Task
enters the queue — a start at the call (so starts queue in call order), a resume once its
child is loaded (its descriptor names its model) — and reads ``queued`` until the store
admits it. The activation waits for that before it writes or runs anything (its actor's
`_admit`); messages sent to it meanwhile are held, as for any activation not yet
published, and delivered at publication.

One thread per runtime decides for the Tasks waiting here: woken when a slot frees here,
when another runtime frees one (PostgreSQL ``NOTIFY``), and by a bounded poll (SQLite, and
any notification missed), it asks the store to admit each waiting Task in turn. The same
thread adopts the queued Tasks of dead runtimes: a Task first in line whose runtime died
is taken over (same Task id, the child's claim moved here under a new fencing number) and
started here, so a SIGKILL loses nothing that was queued.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from controlplane.contract import (
    CancelSignal,
    SubagentControlError,
    TaskOutcome,
    TaskStatus,
    utcnow,
)
from controlplane.runtime.spend._queued_plans import plan_of, plan_text, queued_at

if TYPE_CHECKING:
    from actors import ActivationPlan
    from controlplane.contract import (
        AgentRegistry,
        Descriptor,
        SupervisorNode,
    )
    from controlplane.runtime.lease._runtime import Runtime
    from controlplane.runtime.tasks._tasks import TaskService
    from persistence import AdmissionListener, AdmissionQueue, Admitted, QueueHead, SqlStore

__all__ = ["Admission", "placed_nodes"]

log = logging.getLogger(__name__)

_POLL_WAITING_S = 0.2
"""How often a runtime with waiting Tasks asks the store, notified or not."""
_POLL_IDLE_S = 1.0
"""How often a runtime with none looks for dead runtimes' queued Tasks to adopt."""
_ADOPT_EVERY_S = 1.0
"""How often a runtime looks for dead runtimes' queued Tasks first in line (a read of the
queue's heads, and of the lease of each other runtime holding one)."""
_SWEEP_EVERY_S = 30.0
"""How often the rows of Tasks settled without a release (their runtime died) are deleted."""


@dataclass(eq=False)
class _Entered:
    """One Task of this runtime with a row in the store's admission queue, from its entry
    until its release: the one place this runtime keeps what its gate needs of it.

    Nothing here is a copy of the Task ledger's projection (which reads ``queued`` and
    the wait's times for the Task's owner, told by this class) or of the activation's
    view: the keys and place are the queue row's (kept so a release of a Task under no
    limit costs no store call, and so the waiting Tasks are asked in the store's order
    without a read), ``admitted`` is the store's answer at entry that the gate takes once,
    and the event is the gate's thread parked on it."""

    task_id: str
    keys: frozenset[str]
    seq: int  # its place in the store's FIFO order: this runtime tries its own in it
    admitted: bool = False  # the store admitted it at entry: a start's gate passes at once
    waiting: bool = False  # its gate waits for a slot (`event`, then `result`)
    event: threading.Event = field(default_factory=threading.Event)
    result: Admitted | None = None


class Admission:
    """This runtime's side of the concurrency limits (`controlplane.contract.AdmissionGate`
    for its activations). Thread-safe.

    Args:
        limits: Key → the most activations under it running at once, store-wide.
        store: The shared store (its admission queue).
        runtime: This runtime (its id; whether another runtime is dead).
        tasks: This runtime's Task service (a Task reads ``queued`` through it).
        agents: This runtime's agent registry (an adopted Task's parent gets a handle).
    """

    def __init__(
        self,
        limits: Mapping[str, int],
        store: SqlStore,
        runtime: Runtime,
        tasks: TaskService,
        agents: AgentRegistry,
    ) -> None:
        self.limits = dict(limits)
        self._queue: AdmissionQueue = store.queue
        self._ledger = store.ledger
        self._runtime = runtime
        self._tasks = tasks
        self._agents = agents
        self._lock = threading.Lock()
        # This runtime's Tasks with rows in the queue (`_Entered`), by Task id.
        self._entered: dict[str, _Entered] = {}
        self._wake = threading.Event()
        self._stopped = threading.Event()
        self._spawn: Callable[[ActivationPlan], None] | None = None
        self._thread: threading.Thread | None = None
        self._listener: AdmissionListener | None = None

    # -- lifecycle ---------------------------------------------------------------------

    def start(self, spawn: Callable[[ActivationPlan], None]) -> None:
        """Decide (and adopt) from now on; ``spawn`` starts an adopted Task's activation."""
        self._spawn = spawn
        self._listener = self._queue.listen(self._wake.set)
        self._thread = threading.Thread(
            target=self._run, name=f"subagent-admission:{self._runtime.id}", daemon=True
        )
        self._thread.start()

    def close(self) -> None:
        """Stop deciding (the activations' signals were aborted: their gates returned)."""
        self._stopped.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(5.0)
        if self._listener is not None:
            self._listener.close()

    # -- the keys ------------------------------------------------------------------------

    def keys_for(self, descriptor: Descriptor | None) -> frozenset[str]:
        """The limited keys an activation of ``descriptor`` falls under."""
        if descriptor is None:
            return frozenset()
        keys = {descriptor.provider} if descriptor.provider in self.limits else set()
        if descriptor.agent_model is not None:
            model_key = f"{descriptor.provider}:{descriptor.agent_model}"
            if model_key in self.limits:
                keys.add(model_key)
        return frozenset(keys)

    # -- entering the queue ----------------------------------------------------------------

    def enter_start(self, plan: ActivationPlan) -> None:
        """Queue a new child's Task at its start, in call order (its keys are known).

        Raises:
            SubagentControlError: the store could not record it (the caller discards
                the Task: nothing was started).
        """
        keys = self.keys_for(plan.descriptor)
        if keys:
            self._enter(plan, keys)

    def _enter(self, plan: ActivationPlan, keys: frozenset[str]) -> Admitted:
        from persistence import Admitted

        entered = _Entered(plan.task_id, keys, 0)
        with self._lock:
            self._entered[plan.task_id] = entered
        try:
            found, seq = self._queue.enter(
                plan.task_id, child_id=plan.child_id, runtime_id=self._runtime.id,
                keys=keys, limits=self.limits, plan=plan_text(plan, keys),
            )  # fmt: skip
        except BaseException:
            with self._lock:
                self._entered.pop(plan.task_id, None)
            raise
        with self._lock:
            entered.seq = seq
            entered.admitted = found is Admitted.NOW
        if found is Admitted.NOW:
            self._tasks.admitted(plan.task_id, None)
        elif found is Admitted.WAIT:
            self._tasks.queue(plan.task_id, utcnow())
        return found

    # -- the gate (the activation's thread) --------------------------------------------------

    def wait(self, plan: object, descriptor: Descriptor) -> TaskOutcome | None:
        """`controlplane.contract.AdmissionGate.wait`."""
        from actors import ActivationPlan
        from persistence import Admitted

        assert isinstance(plan, ActivationPlan)
        task_id = plan.task_id
        with self._lock:
            entered = self._entered.get(task_id)
            ready = entered is not None and entered.admitted
            if entered is not None:
                entered.admitted = False  # taken once
        if ready:
            return None
        if entered is None:  # a resume: its model is known now that its child is loaded
            keys = self.keys_for(descriptor)
            if not keys:
                self._tasks.admitted(task_id, None)
                return None
            try:
                found = self._enter(plan, keys)
            except SubagentControlError as exc:
                return TaskOutcome(status=TaskStatus.FAILED, detail=exc.message, code=exc.code)
            if found is Admitted.NOW:
                return None
            if found is Admitted.GONE:
                return _settled_elsewhere()
        return self._wait_for_slot(plan)

    def _wait_for_slot(self, plan: ActivationPlan) -> TaskOutcome | None:
        from persistence import Admitted

        with self._lock:
            waiter = self._entered.get(plan.task_id)
            if waiter is None:  # released meanwhile (its start was refused)
                return _settled_elsewhere()
            waiter.waiting = True
        plan.signal.add_callback(lambda _reason: waiter.event.set())
        self._wake.set()
        # Ends when admitted, killed (its signal: kill, owner disposal, close, fencing) or
        # settled elsewhere; close aborts every signal, so no gate outlives the runtime.
        waiter.event.wait()
        with self._lock:
            waiter.waiting = False
        if waiter.result is Admitted.NOW:
            self._tasks.admitted(plan.task_id, utcnow())
            return None
        if plan.signal.aborted:
            from actors._outcomes import aborted

            return aborted(plan.signal)
        return _settled_elsewhere()

    def release(self, task_id: str) -> None:
        """`controlplane.contract.AdmissionGate.release`, which also admits, in the same
        transaction, the Tasks waiting here that the freed slot lets run (never raises: a
        release the store refused frees the slot anyway, once the Task's settlement is in:
        the queue joins the Task rows; the row itself goes with the next sweep)."""
        from persistence import Admitted

        with self._lock:
            entered = self._entered.pop(task_id, None)
            if entered is None:
                return
            if entered.waiting:  # its own gate waits (its start was refused): it never runs
                entered.result = Admitted.GONE
                entered.event.set()
            keys = entered.keys
            waiters = sorted(
                (w for w in self._waiting() if w.keys & keys and not w.event.is_set()),
                key=lambda w: w.seq,
            )
        try:
            decided = self._queue.release(
                task_id, waiting=[(w.task_id, w.keys) for w in waiters], limits=self.limits
            )
        except SubagentControlError as exc:
            log.warning("could not release the slot of task %s (%s)", task_id, exc.message)
            self._wake.set()  # the admission thread tries again
            return
        by_id = {w.task_id: w for w in waiters}
        for waiter_id, found in decided:
            waiter = by_id[waiter_id]
            waiter.result = found
            waiter.event.set()

    def _waiting(self) -> Iterator[_Entered]:
        """The entered Tasks whose gates wait for a slot (under the lock)."""
        return (entered for entered in self._entered.values() if entered.waiting)

    # -- deciding (this runtime's admission thread) ----------------------------------------

    def _run(self) -> None:
        last_scan = last_sweep = 0.0
        while not self._stopped.is_set():
            with self._lock:
                waiting = any(True for _ in self._waiting())
            self._wake.wait(_POLL_WAITING_S if waiting else _POLL_IDLE_S)
            self._wake.clear()
            if self._stopped.is_set():
                return
            try:
                self._admit_waiting()
                now = time.monotonic()
                if now - last_scan >= _ADOPT_EVERY_S:
                    last_scan = now
                    self._adopt_dead()
                if now - last_sweep >= _SWEEP_EVERY_S:
                    last_sweep = now
                    self._queue.sweep()
            except SubagentControlError as exc:
                log.warning("admission: the store refused (%s); retrying", exc.message)
            except Exception:  # a bug here must not end admission: Tasks would wait forever
                log.exception("admission round failed")

    def _admit_waiting(self) -> None:
        """Ask the store to admit each Task waiting here, in the store's order; a key found
        full (or with an older Task of another runtime first in line) skips the later Tasks
        under it this round."""
        from persistence import Admitted

        with self._lock:
            waiters = sorted(self._waiting(), key=lambda w: w.seq)
        full: set[str] = set()
        for waiter in waiters:
            if waiter.event.is_set() or waiter.keys & full:
                continue
            found = self._queue.admit(waiter.task_id, self.limits)
            if found is Admitted.WAIT:
                full |= waiter.keys
                continue
            waiter.result = found
            waiter.event.set()

    # -- adoption ----------------------------------------------------------------------------

    def _adopt_dead(self) -> None:
        """Take over every Task first in line whose runtime is dead, and start it here."""
        judged: dict[str, bool] = {}
        for head in self._queue.heads():
            holder = head.runtime_id
            if holder == self._runtime.id:
                continue
            if holder not in judged:
                judged[holder] = self._runtime.is_dead_id(holder)
            if judged[holder]:
                self._adopt(head)

    def _adopt(self, head: QueueHead) -> None:
        taken, fence = self._queue.adopt(
            head.task_id, dead=head.runtime_id, runtime_id=self._runtime.id
        )
        if not taken:
            return  # another live runtime adopted it first
        data = json.loads(head.plan)
        stored = self._ledger.get(head.task_id)
        if stored is None:
            return
        log.info("runtime %s adopts queued task %s of dead runtime %s",
                 self._runtime.id, head.task_id, head.runtime_id)  # fmt: skip
        if data["kind"] == "resumed" and fence is None:
            # The child's claim went to another Task meanwhile (a send that took the dead
            # runtime's claim over): this one never ran and cannot now.
            self._settle_unadopted(head.task_id, "its child was continued by another task")
            return
        signal = CancelSignal()
        plan = plan_of(data, self._agents, task=stored, signal=signal, fence=fence)
        keys = frozenset(data["keys"])
        try:
            self._tasks.take_over_queued(
                stored.model_copy(update={"queued_at": queued_at(data)}), signal
            )
        except SubagentControlError:
            return  # closing: it stays queued under this runtime, adopted again once dead
        with self._lock:
            self._entered[head.task_id] = _Entered(head.task_id, keys, head.seq)
        assert self._spawn is not None
        try:
            self._spawn(plan)
        except Exception as exc:
            outcome = TaskOutcome(
                status=TaskStatus.FAILED,
                detail=f"adopted from dead runtime {head.runtime_id} but could not start: {exc}",
            )
            self._tasks.settle(head.task_id, outcome)
            self._tasks.release(head.task_id)
            self.release(head.task_id)

    def _settle_unadopted(self, task_id: str, why: str) -> None:
        detail = f"interrupted: its runtime ended while it was queued, and {why}"
        outcome = TaskOutcome(status=TaskStatus.INTERRUPTED, detail=detail)
        self._ledger.settle((task_id, outcome, utcnow()))
        self._queue.release(task_id)


def placed_nodes(nodes: list[SupervisorNode], tasks: TaskService) -> list[SupervisorNode]:
    """The tree's supervisors, each activation whose Task waits (or waited) for a slot
    with its status, queue position and wait, and each whose child waits for an approval
    answer with status ``input_required`` (the supervisors know neither)."""
    ids = [n.activation.task_id for n in nodes if n.activation is not None]
    snapshots = {s.id: s for s in tasks.live(ids)}
    out = []
    for node in nodes:
        snapshot = snapshots.get(node.task_id or "")
        if (
            node.activation is not None
            and snapshot is not None
            and snapshot.status is TaskStatus.INPUT_REQUIRED
        ):
            status = snapshot.status.value
            activation = node.activation.model_copy(update={"task_status": status})
            node = node.model_copy(update={"task_status": status, "activation": activation})
        elif node.activation is not None and snapshot is not None and snapshot.queued_at:
            status = snapshot.status.value
            waited = (snapshot.admitted_at or utcnow()) - snapshot.queued_at
            activation = node.activation.model_copy(
                update={
                    "task_status": status,
                    "queue_position": snapshot.queue_position,
                    "queued_s": max(0.0, waited.total_seconds()),
                }
            )
            node = node.model_copy(update={"task_status": status, "activation": activation})
        out.append(node)
    return out


def _settled_elsewhere() -> TaskOutcome:
    return TaskOutcome(
        status=TaskStatus.INTERRUPTED,
        detail="interrupted: its task was settled elsewhere while it waited for a slot",
    )
