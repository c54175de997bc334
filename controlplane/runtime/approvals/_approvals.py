"""Approvals: the runtime's side of a child asking and a parent answering.

A child's tool call that needs approval is asked at its activation's desk
(`controlplane.runtime.approvals._approval_desk`): the request is written with its event, the Task
reads ``input_required`` and the parent's notice waits for its drain. The answer
(`Approvals.answer`, from any runtime) is taken once, by compare-and-set in the store
(`persistence._approvals`); the same transaction says where the child's claim is:

- held by a live runtime whose run waits (within its grace period): that run takes it;
- parked (the run ended, holding no thread), or held by a dead runtime: this runtime
  continues the Task — same id, same turn — through the child's supervisor, which claims
  the child for it (`claim_parked`) and starts a *continued* activation.

One thread per runtime sweeps what nobody else would: an answered request whose waiter
died, a deadline past on a parked request (denied with a reason, then continued), and an
ACP agent's request whose runtime died (its agent waited inside that process: the Task is
settled ``interrupted``).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import TYPE_CHECKING

from controlplane.contract import (
    ErrorCode,
    MessageSource,
    SubagentControlError,
    TaskNotice,
    TaskOutcome,
    TaskStatus,
    requester_session,
    text_of,
    utcnow,
)
from controlplane.runtime.approvals._approval_desk import ActivationDesk, Waiters, deny_at_deadline

if TYPE_CHECKING:
    from controlplane.contract import (
        ActivationFacts,
        ApprovalDesk,
        ApprovalRequest,
        ApprovalTranscript,
        CancelSignal,
        ProviderRegistry,
        TaskSnapshot,
        TextBlock,
    )
    from controlplane.runtime.lease._runtime import Runtime
    from controlplane.runtime.tasks._task_entry import Requester
    from controlplane.runtime.tasks._tasks import TaskService
    from persistence import Answered, SqlStore, StoredRequest, WaitingRequest

__all__ = ["Approvals", "ContinueHere", "request_notice"]

log = logging.getLogger(__name__)

ContinueHere = Callable[[str, str, str], None]
"""Continue a parked Task here: ``continue_here(child_id, task_id, parent_session)`` hands
its child's supervisor the order (it claims the child and starts the activation)."""

_SWEEP_EVERY_S = 1.0
"""How often a runtime looks for requests nobody else will act on (a deadline's
precision, and how soon an answer whose waiter died is taken)."""
_CLOSE_JOIN_S = 0.5
"""How long `Approvals.close` waits for a sweep in progress."""
_ARGUMENTS_IN_NOTICE = 300
"""A request's arguments beyond this many characters are clipped in its notice (the
transcript keeps them whole)."""


class Approvals:
    """This runtime's approvals (`controlplane.contract.ApprovalPort` for its actors).
    Thread-safe.

    Args:
        store: The shared store (its requests, claims, Tasks).
        runtime: This runtime (its id; whether another one is dead).
        tasks: This runtime's Task service.
        providers: This runtime's providers: it continues only the Tasks whose child's
            provider it has (one that lacks it would fail the Task).
        grace_s: How long a run waits for an answer holding its thread before it parks.
    """

    def __init__(
        self,
        store: SqlStore,
        runtime: Runtime,
        tasks: TaskService,
        providers: ProviderRegistry,
        *,
        grace_s: float,
    ) -> None:
        self._store = store
        self._providers = providers
        self._book = store.approvals
        self._runtime = runtime
        self._tasks = tasks
        self.grace_s = grace_s
        self._waiters = Waiters()
        self._continue: ContinueHere | None = None
        self._stopped = threading.Event()
        self._thread: threading.Thread | None = None

    # -- lifecycle ---------------------------------------------------------------------

    def start(self, continue_here: ContinueHere) -> None:
        """Act from now on: continue answered Tasks through ``continue_here``, and sweep."""
        self._continue = continue_here
        self._thread = threading.Thread(
            target=self._run, name=f"subagent-approvals:{self._runtime.id}", daemon=True
        )
        self._thread.start()

    def close(self) -> None:
        """Stop sweeping (the activations' signals were aborted: their desks returned).

        Not waited for long: a sweep's store call is given up once stopped (a wait cut
        at once, a connection attempt or a retry within the store's poll), so that a
        sweep stuck on a silent network ends with close, not at its retries' end."""
        self._stopped.set()
        if self._thread is not None:
            if self._thread.ident is not None:
                self._store.abandon_waits([self._thread.ident])
            self._thread.join(_CLOSE_JOIN_S)

    # -- the actors' side (ApprovalPort) ------------------------------------------------

    def desk(
        self,
        view: ActivationFacts,
        *,
        provider: str,
        signal: CancelSignal,
        transcript: ApprovalTranscript,
    ) -> ApprovalDesk:
        """The desk of one activation
        (`controlplane.runtime.approvals._approval_desk.ActivationDesk`)."""
        return ActivationDesk(
            book=self._book,
            tasks=self._tasks,
            waiters=self._waiters,
            runtime_id=self._runtime.id,
            view=view,
            provider=provider,
            signal=signal,
            transcript=transcript,
            grace_s=self.grace_s,
        )

    def claim_parked(self, task_id: str, child_id: str) -> tuple[TaskSnapshot, int] | None:
        """`controlplane.contract.ApprovalPort.claim_parked`."""
        provider, waits_for = self._book.provider_of(task_id), "an approval answer"
        if provider is None:
            # Not parked on a request: it may wait for a runtime with its child's provider
            # (left so by a runtime that lacked it), its turn open with its message.
            waiting = self._store.ledger.get(task_id)
            provider = None if waiting is None else waiting.waiting_for
            waits_for = "a runtime with its provider"
        if provider is not None and provider not in self._providers.names():
            raise SubagentControlError(
                ErrorCode.UNKNOWN_PROVIDER,
                f"child {child_id} waits for {waits_for}, and its provider "
                f"{provider!r} is not registered in this runtime; the message was not "
                "delivered: send it from a runtime that has the provider",
                child_id=child_id,
                task_id=task_id,
            )
        fence = self._runtime.continue_parked(task_id, child_id)
        if fence is None:
            return None
        snapshot = self._store.ledger.get(task_id)
        if snapshot is None:
            return None
        found = self._book.of_tasks([task_id]).get(task_id)
        return snapshot.model_copy(update={"request": found}), fence

    def steer_parked(
        self, task_id: str, child_id: str, message: Sequence[TextBlock], source: MessageSource
    ) -> bool:
        """`controlplane.contract.ApprovalPort.steer_parked`."""
        data = {"text": text_of(message)}
        return self._store.steer_parked(task_id, child_id, data, source)

    # -- the callers' side -----------------------------------------------------------------

    def answer(
        self,
        requester: Requester,
        request_id: str,
        *,
        allow: bool,
        note: str | None = None,
        source: MessageSource | None = None,
    ) -> None:
        """Answer a request once; its Task goes on wherever its child is (see the module
        docstring). Only the child's recorded parent session may answer, or anyone with
        a ``human`` source (a person at any runtime).

        Raises:
            SubagentControlError: ``INVALID_INPUT`` for a bad argument;
                ``REQUEST_NOT_FOUND``; ``REQUEST_CLOSED`` (answered already, or its Task
                settled). Nothing is changed then.
        """
        session = requester_session(requester)
        _check_answer(request_id, allow, note)
        source = source or MessageSource(kind="coordinator", sender_session_id=session)
        answered = self._book.answer(
            request_id,
            allow=allow,
            note=note,
            source=source,
            session=None if source.kind == "human" else session,
        )
        self._after_answer(answered)

    def _after_answer(self, answered: Answered) -> None:
        request = answered.request
        holder = answered.holder
        if holder == self._runtime.id:
            # Its run waits here: the Task runs again from now (a `wait` after this waits
            # for its outcome), and the run takes the answer at once.
            self._tasks.asking(request.task_id, None)
            self._waiters.wake(request.request_id)
        elif holder is None or self._runtime.is_dead_id(holder):
            self._continue_task(request)
        # else: a live runtime's run waits; it reads the answer (or its sweep does)

    def _continue_task(self, request: StoredRequest) -> None:
        if self._continue is None:
            return  # not started: the sweep of a live runtime takes it
        if request.provider not in self._providers.names():
            return  # a runtime that has the child's provider continues it (its sweep)
        try:
            self._continue(request.child_id, request.task_id, request.parent_session)
        except SubagentControlError as exc:
            # Another runtime continued it first, or this one is closing: a live
            # runtime's sweep takes it from the store.
            log.info("task %s not continued here (%s)", request.task_id, exc.message)

    def notices(self, owner: str) -> list[tuple[datetime, TaskNotice]]:
        """Take the owner's request notices (a `TaskService.add_notices` source)."""
        out = []
        for request in self._book.drain(owner):
            snapshot = self._store.ledger.get(request.task_id)
            if snapshot is not None:
                out.append((request.created_at, request_notice(snapshot, request.public())))
        return out

    def requests(self, task_ids: list[str]) -> dict[str, ApprovalRequest]:
        """The open request of each of these Tasks that waits for one."""
        return self._book.of_tasks(task_ids)

    def kill_parked(self, snapshot: TaskSnapshot, reason: str) -> bool:
        """Kill a Task parked on a request (no activation anywhere): settled ``killed``
        in the store, its turn closed, its claim released; False when a live runtime
        holds it (the kill goes there)."""
        outcome = TaskOutcome(status=TaskStatus.KILLED, detail=reason)
        return self._runtime.settle_parked((snapshot.id, outcome, utcnow()))

    # -- the sweep ---------------------------------------------------------------------------

    def _run(self) -> None:
        with self._store.abandoning(self._stopped.is_set):
            self._sweep_until_stopped()

    def _sweep_until_stopped(self) -> None:
        while not self._stopped.wait(_SWEEP_EVERY_S):
            try:
                self._sweep()
            except SubagentControlError as exc:
                if not self._stopped.is_set():
                    log.warning("approvals: the store refused (%s); retrying", exc.message)
            except Exception:  # a bug here must not end the sweep: Tasks would wait forever
                log.exception("approvals sweep failed")

    def _sweep(self) -> None:
        judged: dict[str, bool] = {}
        now = utcnow()
        for waiting in self._book.waiting():
            if self._stopped.is_set():
                return
            if not waiting.claimed_by_it:
                continue
            holder = waiting.holder
            if holder is not None and holder not in judged:
                judged[holder] = holder != self._runtime.id and self._runtime.is_dead_id(holder)
            dead = holder is not None and judged[holder]
            if holder is not None and not dead:
                continue  # a live run waits for it, deadline included
            self._act(waiting, now, dead)

    def _act(self, waiting: WaitingRequest, now: datetime, dead: bool) -> None:
        request = waiting.request
        if dead and not request.parkable:
            # An ACP agent waited inside its own process: nothing can continue it.
            snapshot = self._store.ledger.get(request.task_id)
            if snapshot is not None:
                detail = (
                    f"interrupted: its runtime ended while it waited for the answer to request "
                    f"{request.request_id}; send the child a message to continue it"
                )
                self._store.interrupt(snapshot, detail)
            return
        if waiting.state == "open":
            if request.deadline_at is None or request.deadline_at > now:
                return  # parked, unanswered: the answer will continue it
            if not deny_at_deadline(self._book, request):
                return  # answered meanwhile: whoever answered continues it
        self._continue_task(request)


def request_notice(snapshot: TaskSnapshot, request: ApprovalRequest) -> TaskNotice:
    """The notice a request leaves the child's parent: who asks, for what, and how to
    answer (its arguments clipped: the transcript keeps them whole)."""
    from controlplane.contract import dumps

    arguments = " ".join(dumps(request.arguments).split())
    if len(arguments) > _ARGUMENTS_IN_NOTICE:
        arguments = arguments[: _ARGUMENTS_IN_NOTICE - 1] + "…"
    arguments = arguments.encode("utf-8", "replace").decode("utf-8")
    summary = (
        f"subagent task {snapshot.id} ({snapshot.label}) of child {snapshot.child_id} asks to "
        f"run tool {request.tool} with {arguments}"
    )
    if request.reason:
        reason = " ".join(request.reason.split())
        summary += f" — its reason: {reason[:200]}"
    summary += (
        f"; answer request {request.id} with answer(request_id={request.id!r}, allow=true "
        "or false, note=...)"
    )
    return TaskNotice(
        task_id=snapshot.id,
        child_id=snapshot.child_id,
        label=snapshot.label,
        status=TaskStatus.INPUT_REQUIRED,
        summary=summary,
    )


_REQUEST_ID_MAX = 200
"""The longest request id an answer may name (ours are 36 characters)."""


def _check_answer(request_id: object, allow: object, note: object) -> None:
    if not isinstance(request_id, str) or not request_id:
        raise SubagentControlError(
            ErrorCode.INVALID_INPUT, "request_id must be a non-empty string; nothing was changed"
        )
    if len(request_id) > _REQUEST_ID_MAX:  # never echoed back whole
        raise SubagentControlError(
            ErrorCode.INVALID_INPUT,
            f"request_id is {len(request_id)} characters long; a request id has at most "
            f"{_REQUEST_ID_MAX}; nothing was changed",
        )
    if not isinstance(allow, bool):
        raise SubagentControlError(
            ErrorCode.INVALID_INPUT,
            f"allow must be true or false, not {allow!r}; nothing was changed",
        )
    if note is not None and not isinstance(note, str):
        raise SubagentControlError(
            ErrorCode.INVALID_INPUT, "note must be a string or None; nothing was changed"
        )
