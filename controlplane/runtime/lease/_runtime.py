"""This process's runtime in the store: its row, its heartbeat, and the sweep that settles
dead runtimes' Tasks.

Two objects, so that dependencies point one way. `Runtime` is this runtime's presence and
judgement: its row, its renewals, whether another runtime is dead, the sweep, the claim on a
child; it needs only the store, so the router and the Task service are built on it. The
`Heartbeat` drives this runtime's Task service (it fences it, flushes its settlements), so it
is built after the service, from both.

Per open `SubagentControl`, the renewer (`controlplane.runtime.lease._renewer`) renews the runtime's
heartbeat every twentieth of ``lease_ttl_s`` (one write per interval per process, never one per
child; a failed one is retried at once), and one background thread (the heartbeat's)
retries Task settlements the store refused every third of it, and sweeps: every running Task of a
dead runtime — closed, its lease lapsed, or (same host, same boot) its process gone — is
settled ``interrupted`` and its child's open turn closed, once, however many runtimes sweep
at the same moment (`persistence.SqlStore.interrupt`). The first sweep runs before
`SubagentControl` returns, so the next runtime to open the store recovers what a crash left.

A lapsed lease is taken for death only once this runtime's own renewals have run unbroken
for a full lease of the other's since the last outage it saw, and since it opened
(`controlplane.runtime.lease._lease`): leases that lapsed because the store was down say nothing
about who is alive. What needs no store — a closed row, a process gone on this host and boot — is
judged at once, so the next runtime to open the store on the crashed one's host still
recovers at once.

The runtime also judges its own lease (`controlplane.runtime.lease._own_lease`): when no renewal
sent in the last 0.75 of the lease has succeeded, a watchdog that never waits on the store fences
the runtime: every activation is cancelled (its Task settles ``interrupted``, "lease lost") and
new Tasks are refused. Once a renewal succeeds again, this thread writes those Tasks'
settlements with their turns' ends (unless a runtime that took the child over did first)
and admits new Tasks; a later send re-claims the child like any resume.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Sequence
from typing import TYPE_CHECKING

from controlplane.contract import (
    SubagentControlError,
    TaskStatus,
)
from controlplane.runtime.lease._lease import Renewals
from controlplane.runtime.lease._own_lease import OwnLease
from controlplane.runtime.lease._renewer import ATTEMPT_BOUND, Renewer
from controlplane.telemetry import log_lifecycle

if TYPE_CHECKING:
    from controlplane.contract import (
        NewEvent,
        RuntimeInfo,
        TaskSnapshot,
    )
    from controlplane.runtime.lease._recovery import Recovery
    from controlplane.runtime.tasks._tasks import TaskService
    from persistence import LeaseNow, Settlement, SqlStore, Watch

__all__ = ["Heartbeat", "Runtime", "new_runtime_id"]

log = logging.getLogger(__name__)


def new_runtime_id() -> str:
    """A runtime id unique across processes, machines and restarts: host, pid, and 48
    random bits (the host and pid make it readable in the tree and the CLI)."""
    return f"{socket.gethostname()[:40]}-{os.getpid()}-{uuid.uuid4().hex[:12]}"


def _pid_gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except OSError:  # it exists, owned by someone else
        return False
    return False


class Runtime:
    """One open control plane's presence in the store, and its judgement of the others.

    Constructing it writes the runtime's row (its lease starts then); `Heartbeat` keeps it
    renewed.

    Args:
        runtime_id: This runtime's id (`new_runtime_id`).
        store: The shared store.
        lease_ttl_s: How long this runtime's claims outlive its last heartbeat.
    """

    def __init__(self, runtime_id: str, store: SqlStore, *, lease_ttl_s: float) -> None:
        self.id = runtime_id
        self._store = store
        self.lease_ttl_s = lease_ttl_s
        from persistence import boot_id, host_name

        self._host = host_name()
        self._boot = boot_id()
        # Its database sessions bear its name: once the others judge it dead, they end them.
        store.name_sessions(runtime_id)
        self.registered_at = time.monotonic()
        """When (on the clock) the row was sent, fresh: the lease's first renewal."""
        self.register()
        self.renewals = Renewals(lease_ttl_s)
        """This runtime's own renewals: when it may take another's lapsed lease for death."""
        self.recovery: Recovery | None = None
        """Who carries dead runtimes' running Tasks on; None: the
        sweep settles them ``interrupted``."""

    def register(self) -> None:
        """Write this runtime's row, its heartbeat fresh, unless it exists (even closed)."""
        self._store.ledger.register_runtime(
            self.id, host=self._host, pid=os.getpid(), boot_id=self._boot,
            lease_ttl_s=self.lease_ttl_s,
        )  # fmt: skip

    # -- the sweep ---------------------------------------------------------------------

    def sweep(self) -> int:
        """Settle the running Tasks of every dead runtime ``interrupted``; returns how many
        this call settled."""
        if self.recovery is not None:
            # Tasks a runtime without their child's provider took the message of: run here
            # if this runtime has it: work goes where the provider is.
            for waiting in self._store.ledger.awaiting_provider():
                self.recovery.take_waiting(waiting)
        now, suspects = self._store.ledger.suspects()
        dead = {
            r.runtime_id: r for r in suspects if r.runtime_id != self.id and self._is_dead(r, now)
        }
        if not dead:
            return 0
        self._end_sessions(list(dead))
        settled = 0
        for task in self._store.ledger.running(list(dead)):
            runtime = dead[task.runtime_id or ""]
            if self.recovery is not None and self.recovery.take(task, runtime):
                continue  # carried on here, or left for a runtime that has its provider
            settled += self.interrupt(task, runtime)
        return settled

    def _end_sessions(self, dead: list[str]) -> None:
        """End the dead runtimes' database sessions before taking their children: a
        transaction one left open (cut off mid-statement) holds a child's row lock, which
        no server timer releases until the network heals (`persistence._sessions`)."""
        try:
            self._store.end_sessions_of(dead)
        except SubagentControlError as exc:  # the takeover then waits for the locks
            log.warning("runtime %s: could not end the sessions of %s: %s", self.id, dead, exc)

    def sweep_queued(self) -> int:
        """Settle the queued Tasks of every dead runtime ``interrupted`` (a runtime with
        no concurrency limits of its own cannot adopt them, `_admission`);
        returns how many this call settled."""
        settled = 0
        judged: dict[str, bool] = {}
        for task_id, runtime_id in self._store.queue.stranded(self.id):
            if runtime_id not in judged:
                judged[runtime_id] = self.is_dead_id(runtime_id)
            task = self._store.ledger.get(task_id) if judged[runtime_id] else None
            if task is not None and task.status is TaskStatus.QUEUED:
                settled += self.interrupt(task, None)
                self._store.queue.release(task_id)
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

    def interrupt_fenced(self, task: TaskSnapshot) -> bool:
        """Write the settlement of a Task of this runtime that was fenced (its lease lost,
        or its claim taken): ``interrupted`` with its turn's end, once (the Task service's
        `controlplane.runtime.tasks._tasks.Interrupter`)."""
        detail = task.outcome.detail if task.outcome is not None else None
        settled = self._store.interrupt(task, detail or "interrupted: this runtime lost its lease")
        if not settled and task.child_id is not None:
            # Its run waited for an approval answer, so the Task was not interrupted: it
            # goes on elsewhere. Park its claim, which names this runtime, or nobody would
            # (this runtime is alive again and runs it no more).
            self._store.release_waiting(task.id, task.child_id, self.id)
        return settled

    def claim(self, task: TaskSnapshot, opening: Sequence[NewEvent] = ()) -> int | None:
        """Admit a resume's Task and claim its child for this runtime (taking over a dead
        runtime's claim); the fencing number.

        Raises:
            SubagentControlError: ``OWNERSHIP_CONFLICT`` naming the live runtime that holds
                the child; ``CHILD_NOT_FOUND`` for a child not in the store;
                ``NOT_DELIVERED`` (`persistence.TaskInRecovery`) for a dead runtime's
                running Task that this runtime carries on instead (a sweep is asked for
                at once: the retry steers it).
        """
        from persistence import TaskInRecovery

        recovery = self.recovery
        try:
            return self._store.admit_claiming(
                task, is_dead=self._is_dead, opening=opening,
                recoverable=recovery,
            )  # fmt: skip
        except TaskInRecovery:
            assert recovery is not None
            recovery.held_by_dead()  # the sweep carries it on now; the retry steers it
            raise

    def continue_parked(self, task_id: str, child_id: str) -> int | None:
        """Claim a child for its Task that waits on an approval request (parked, or left
        waiting by a dead runtime), so this runtime continues it; the fencing number, or
        None when it is not there to take."""
        return self._store.continue_parked(task_id, child_id, self.id, is_dead=self._is_dead)

    def settle_parked(self, settlement: Settlement) -> bool:
        """Settle a Task parked on an approval request (parked, or left waiting by a dead
        runtime) with its turn's end; False when a live runtime holds it."""
        return self._store.settle_parked(settlement, is_dead=self._is_dead)

    def is_dead_id(self, runtime_id: str) -> bool:
        """Whether the runtime ``runtime_id`` is dead (closed, lapsed, its process gone,
        or not in the store at all). Reads its one row: a forward polls this."""
        lease = self._store.ledger.lease(runtime_id)
        return lease is None or self._is_dead(*lease)

    def expire(self) -> None:
        """Delete what runtimes gone for good left in the store
        (`controlplane.runtime.lease._expiry`)."""
        from controlplane.runtime.lease._expiry import expire_leftovers

        expire_leftovers(self._store, self.id, is_gone=self.is_gone)

    def is_gone(self, runtime: RuntimeInfo, now: LeaseNow) -> bool:
        """Whether a runtime is dead for good, not merely late: closed, its process gone,
        or lapsed for longer than any outage (`controlplane.runtime.lease._expiry.RETAIN_LAPSED_S`),
        judged on the lease's own clock."""
        from controlplane.runtime.lease._expiry import RETAIN_LAPSED_S
        from persistence import is_expired

        retained = runtime.model_copy(update={"lease_ttl_s": runtime.lease_ttl_s + RETAIN_LAPSED_S})
        return is_expired(retained, now) or self._process_gone(runtime)

    def runtime_of(self, task: TaskSnapshot) -> RuntimeInfo | None:
        """The row of the runtime that runs ``task`` (None if it has none, or no row)."""
        if task.runtime_id is None:
            return None
        return self._store.ledger.runtime(task.runtime_id)

    def is_dead(self, runtime: RuntimeInfo) -> bool:
        """Whether ``runtime`` is dead, judged now (`_is_dead`)."""
        return self._is_dead(runtime, self._store.ledger.suspects()[0])

    def judge(self, runtime: RuntimeInfo, now: LeaseNow) -> bool:
        """Whether ``runtime`` is dead at ``now`` (`_is_dead`; the store's claims call it
        under the child's lock)."""
        return self._is_dead(runtime, now)

    def _is_dead(self, runtime: RuntimeInfo, now: LeaseNow) -> bool:
        """Closed, its process gone, or its lease lapsed while this runtime could have seen
        it renewed. A lapse this runtime cannot vouch for (its own renewals broke within
        the other's lease: the store was down, or it was not looking) is unknown, and
        unknown is alive: nothing is swept, taken over or settled on it."""
        from persistence import is_expired

        if runtime.closed_at is not None or self._process_gone(runtime):
            return True
        if not is_expired(runtime, now):
            return False
        steady_s = self.renewals.steady_for()
        if steady_s >= runtime.lease_ttl_s:
            return True
        log.info("runtime %s: the lease of runtime %s lapsed, but this runtime has renewed its "
                 "own without a break for only %.2fs of its %gs lease: not judged dead yet",
                 self.id, runtime.runtime_id, steady_s, runtime.lease_ttl_s)  # fmt: skip
        return False

    def _process_gone(self, runtime: RuntimeInfo) -> bool:
        # Same host and boot: a process that is gone is dead now, not after its lease.
        return (
            runtime.host == self._host
            and self._boot is not None
            and runtime.boot_id == self._boot
            and _pid_gone(runtime.pid)
        )


class Heartbeat:
    """Keeps this runtime alive in the store and its Task service in step with its lease:
    one thread renews the lease, writes the settlements the store refused, and sweeps; a
    watchdog (`controlplane.runtime.lease._own_lease`) fences the Task service when renewals stop.

    Args:
        runtime: This runtime (its row, renewals and sweep).
        store: The shared store.
        tasks: This runtime's Task service (fenced, flushed and readmitted here).
    """

    def __init__(
        self, runtime: Runtime, store: SqlStore, tasks: TaskService, *, adopts: bool = False
    ) -> None:
        self._runtime = runtime
        self._adopts = adopts  # has concurrency limits: adopts dead runtimes' queued Tasks
        self._store = store
        self._tasks = tasks
        self._lease_ttl_s = runtime.lease_ttl_s
        self._stopped = threading.Event()
        self._wake = threading.Event()  # set: sweep now (and by `close`: stop)
        self._flush_now = threading.Event()  # set with the wake: flush and readmit now
        self._thread: threading.Thread | None = None
        self.lease = OwnLease(
            runtime.id, runtime.lease_ttl_s, runtime.renewals, tasks.fence,
            registered_at=runtime.registered_at, on_rearmed=self._rearmed,
        )  # fmt: skip
        """The watchdog that fences this runtime when its renewals stop succeeding."""
        self._renewer = Renewer(
            runtime.id, runtime.lease_ttl_s, self._renew, runtime.renewals, self.lease,
            self._reopen, on_back=store.network_back,
        )  # fmt: skip
        self._watch: Watch | None = None
        self._watch_lock = threading.Lock()

    def start(self) -> None:
        """Sweep once now (what a crash left is recovered before the first send), then keep
        the renewals going on threads of their own (`controlplane.runtime.lease._renewer`) and the
        sweep on one background thread."""
        self._runtime.sweep()
        self.lease.start()
        self._renewer.start()
        self._thread = threading.Thread(
            target=self._beat, name=f"subagent-runtime:{self._runtime.id}", daemon=True
        )
        self._thread.start()

    def _beat(self) -> None:
        # Its store calls are given up once close has begun (a wait cut at once by
        # `_close`, a connection attempt or a retry within the store's poll): close writes
        # the settlements and its row itself, and would otherwise wait for a call stuck on a
        # silent network to run to its deadline, a lease, before its own got a lease more.
        with self._store.abandoning(self._stopped.is_set):
            self._run()

    def close(self) -> None:
        """Stop the threads and give the runtime's claims up at once (closed in the store).

        The heartbeat thread may be in a store call (a partition): that call is given up
        at once; should the thread still not end within a lease, close leaves it (a
        daemon) and records nothing more, as a crash would leave it: its lease lapses,
        and any Task it could not record is settled by another runtime or by the next to
        open the store. Its own store calls are bounded by a lease too.
        """
        try:
            self._close()
        finally:
            # Last: stopping the watch waits out its listener's poll, which the close of
            # the row (and the announcement of what it handed over) must not wait for.
            with self._watch_lock:
                watch, self._watch = self._watch, None
            if watch is not None:
                watch.close()

    def _close(self) -> None:
        runtime_id = self._runtime.id
        self._stopped.set()
        self._wake.set()
        self.lease.stop()
        if self._thread is not None and self._thread.ident is not None:
            self._store.abandon_waits([self._thread.ident])
        self._renewer.stop(self._lease_ttl_s * ATTEMPT_BOUND)
        if self._thread is not None:
            self._thread.join(self._lease_ttl_s)
            if self._thread.is_alive():
                log.warning("runtime %s: its heartbeat is stuck in a store call; closing "
                            "without recording the close", runtime_id)  # fmt: skip
                return
        with self._store.deadline(self._lease_ttl_s):
            with contextlib.suppress(SubagentControlError):
                self._tasks.flush()
            try:
                self._store.ledger.close_runtime(runtime_id)
                # Its handed-over turns are takeable now: a live runtime with their
                # provider hears so at once (not at its next sweep).
                if self._store.ledger.running([runtime_id]):
                    self._store.takeable.announce()
            except SubagentControlError as exc:
                log.warning("runtime %s: could not record its close (%s)", runtime_id, exc.message)

    def sweep_soon(self) -> None:
        """Sweep at once, not at the next renewal (a provider was registered: its dead
        runtimes' Tasks can be carried on here now), and from now on whenever a Task may
        have become takeable (`watch_takeable`)."""
        self._wake.set()
        self.watch_takeable()

    def watch_takeable(self) -> None:
        """Sweep whenever the store says a Task may have become takeable: left for a
        runtime with its provider, or handed over by a closing runtime
        (`persistence.Takeable`), so a runtime with the provider takes it at once, not at
        its next sweep (which stays the fallback). Started once this runtime has a
        provider (a runtime with none can take nothing) and carries Tasks on."""
        recovery = self._runtime.recovery
        if recovery is None or not recovery.enabled:
            return
        with self._watch_lock:
            if self._watch is None and not self._stopped.is_set():
                self._watch = self._store.takeable.watch(self._wake.set)

    def _rearmed(self) -> None:
        """A renewal re-armed the lapsed lease: write the fenced Tasks' settlements and
        readmit now, not at the next period (until then this runtime keeps its fenced
        children's claims, and refuses new Tasks)."""
        self._flush_now.set()
        self._wake.set()

    def _run(self) -> None:
        period = self._lease_ttl_s / 3
        due = time.monotonic() + period
        # A wake (a provider registered, or close) sweeps at once; the flush and the full
        # sweep keep their period. Renewals run on their own threads (`Renewer`).
        while True:
            woken = self._wake.wait(max(0.0, due - time.monotonic()))
            if self._stopped.is_set():
                return
            if woken:
                self._wake.clear()
                if self._flush_now.is_set():
                    self._flush_now.clear()  # re-armed: the flush and readmission below
                else:
                    self._sweep_now()
                    if time.monotonic() < due:
                        continue
            due = time.monotonic() + period
            try:
                with self._store.deadline(self._lease_ttl_s):
                    fenced = self._tasks.suspended
                    if self._tasks.flush() == 0 and fenced is not None and not self.lease.lapsed:
                        self._tasks.readmit(fenced)
                    self._runtime.sweep()
                    if not self._adopts:  # nobody here would start them: settle them
                        self._runtime.sweep_queued()
                    self._runtime.expire()  # after the sweep: it releases what the dead held
            except SubagentControlError as exc:
                log.warning("runtime %s: flush or sweep failed (%s); retrying",
                            self._runtime.id, exc.message)  # fmt: skip
            except Exception:  # a bug here must not end the sweep: others would sweep us
                log.exception("runtime %s: flush or sweep failed", self._runtime.id)

    def _sweep_now(self) -> None:
        try:
            with self._store.deadline(self._lease_ttl_s):
                self._runtime.sweep()
        except SubagentControlError as exc:
            log.warning("runtime %s: sweep failed (%s)", self._runtime.id, exc.message)
        except Exception:  # a bug here must not end the heartbeat
            log.exception("runtime %s: sweep failed", self._runtime.id)

    def _renew(self, bound_s: float) -> bool:
        """One renewal of this runtime's lease, within ``bound_s``: whether its row is
        still open (`controlplane.runtime.lease._renewer.Renewer` paces, records and retries
        them)."""
        with self._store.deadline(bound_s):
            return self._store.ledger.heartbeat(self._runtime.id)

    def _reopen(self) -> None:
        """Write this runtime's row again after the store said it is closed or gone."""
        with self._store.deadline(self._lease_ttl_s * ATTEMPT_BOUND):
            self._runtime.register()
