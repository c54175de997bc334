"""One activation's approval desk (`controlplane.contract.ApprovalDesk`): where its run asks
before a tool call, and waits for the answer.

`ask` writes the request with its ``approval/request`` event in one transaction (the row,
the Task ``input_required``: `persistence._approvals`), then the Task reads
``input_required`` here too. `wait` waits for the answer: woken at once when it is given in
this runtime, otherwise reading the request's row every `_POLL_S` (an answer given in
another runtime), until its deadline denies it, the activation is killed, or the grace
period ends: then it parks (the child's claim given up, unless the answer came first) and
the run ends. An answer is taken with its ``approval/answer`` event, the Task ``running``
again, in one transaction.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Mapping, Sequence
from datetime import timedelta
from typing import TYPE_CHECKING

from controlplane.contract import (
    ErrorCode,
    EventKind,
    MessageSource,
    SubagentControlError,
    TaskStatus,
    utcnow,
)

if TYPE_CHECKING:
    from controlplane.contract import (
        ActivationFacts,
        ApprovalAnswer,
        ApprovalTranscript,
        CancelSignal,
        JsonValue,
    )
    from controlplane.runtime.tasks._tasks import TaskService
    from persistence import ApprovalBook, Fence, StoredRequest

__all__ = ["ActivationDesk", "Waiters", "deny_at_deadline"]

DEADLINE_SOURCE = MessageSource(kind="system", sender_session_id="approval-deadline")
"""Who answers a request its deadline denied."""

_WAITING = frozenset({TaskStatus.INPUT_REQUIRED.value, TaskStatus.RUNNING.value})
_POLL_S = 0.2
"""How often a waiting run reads its request's row (an answer from another runtime)."""


class Waiters:
    """The runs of this runtime waiting for answers: an answer given here wakes its run at
    once, with no poll. Thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._events: dict[str, threading.Event] = {}

    def add(self, request_id: str) -> threading.Event:
        event = threading.Event()
        with self._lock:
            self._events[request_id] = event
        return event

    def remove(self, request_id: str) -> None:
        with self._lock:
            self._events.pop(request_id, None)

    def wake(self, request_id: str) -> None:
        with self._lock:
            event = self._events.get(request_id)
        if event is not None:
            event.set()


class ActivationDesk:
    """The `ApprovalDesk` of one activation (built by
    `controlplane.runtime.approvals._approvals.Approvals`).

    Whose request it writes (its Task, child, parent session and claim) it reads from the
    activation's frozen view, and which turn from the transcript it writes through: it
    keeps no copy of either. What it holds of its own: the requests it asked (their
    deadlines), the child's provider (learnt once the child is loaded, named on each
    request so only a runtime that has it continues the Task), and the live signal its
    wait hooks onto.
    """

    def __init__(
        self,
        *,
        book: ApprovalBook,
        tasks: TaskService,
        waiters: Waiters,
        runtime_id: str,
        view: ActivationFacts,
        provider: str,
        signal: CancelSignal,
        transcript: ApprovalTranscript,
        grace_s: float,
    ) -> None:
        self._book = book
        self._tasks = tasks
        self._waiters = waiters
        self._runtime_id = runtime_id
        self._view = view
        self._provider = provider
        self._signal = signal
        self._transcript = transcript
        self.grace_s = grace_s
        self._asked: dict[str, StoredRequest] = {}

    @property
    def _fence(self) -> Fence | None:
        """The claim every parking write is conditional on (None: a run that cannot park)."""
        fence = self._view.fence
        return None if fence is None else (self._runtime_id, fence)

    def ask(
        self,
        *,
        tool: str,
        arguments: Mapping[str, JsonValue],
        call_id: str,
        reason: str | None = None,
        deadline_s: float | None = None,
        pending: Sequence[Mapping[str, JsonValue]] = (),
        parkable: bool = True,
    ) -> str:
        """`controlplane.contract.ApprovalDesk.ask`."""
        from persistence import StoredRequest

        view, now = self._view, utcnow()
        request = StoredRequest(
            request_id=str(uuid.uuid4()),
            task_id=view.task_id,
            child_id=view.child_id,
            parent_session=view.owner_session,
            turn=self._transcript.turn,
            call_id=call_id,
            tool=tool,
            arguments=dict(arguments),
            reason=reason or None,
            pending=[dict(call) for call in pending],
            parkable=parkable and self._fence is not None,
            created_at=now,
            deadline_at=None if deadline_s is None else now + timedelta(seconds=deadline_s),
            provider=self._provider,
        )
        data: dict[str, JsonValue] = {
            "id": request.request_id,
            "call_id": call_id,
            "tool": tool,
            "arguments": request.arguments,
        }
        if request.reason:
            data["reason"] = request.reason
        if request.pending:
            data["pending"] = request.pending
        if request.deadline_at is not None:
            data["deadline_at"] = request.deadline_at.isoformat()
        self._transcript.append_with(
            EventKind.APPROVAL_REQUEST, data, None, self._book.asking(request)
        )
        self._asked[request.request_id] = request
        self._tasks.asking(view.task_id, request.public())
        return request.request_id

    def wait(self, request_id: str, *, park: bool = True) -> ApprovalAnswer | None:
        """`controlplane.contract.ApprovalDesk.wait`."""
        woken = self._waiters.add(request_id)
        self._signal.add_callback(lambda _reason: woken.set())
        park_at = time.monotonic() + self.grace_s if park and self._fence is not None else None
        try:
            while True:
                woken.clear()
                try:
                    state, answer, status = self._book.state(request_id)
                except SubagentControlError as exc:
                    if exc.code is not ErrorCode.STORE_UNAVAILABLE or self._signal.aborted:
                        raise
                    # The store is out of reach longer than its retries: waiting costs
                    # nothing, so wait on (a long outage fences the runtime, which ends
                    # this wait through the signal; the Task is then parked, not lost).
                    woken.wait(_POLL_S)
                    continue
                if state == "answered" and answer is not None:
                    self._take(request_id, answer)
                    return answer
                if state == "closed" or status not in _WAITING:
                    raise _gone(request_id, status)
                if self._signal.aborted:
                    # Closing (not a kill): the Task outlives this runtime, parked, and
                    # the answer continues it after the restart.
                    closing = self._signal.cause is ErrorCode.CLOSED
                    if park and closing and self._park(request_id):
                        return None
                    raise SubagentControlError(
                        ErrorCode.CANCELLED,
                        f"the wait for request {request_id} ended: {self._signal.reason}",
                        task_id=self._view.task_id,
                    )
                if self._deadline_passed(request_id):
                    continue  # denied by its deadline: taken on the next round
                if park_at is not None and time.monotonic() >= park_at:
                    if self._park(request_id):
                        return None
                    park_at = time.monotonic() + self.grace_s  # the answer came first
                    continue
                timeout = _POLL_S
                if park_at is not None:
                    timeout = max(0.0, min(timeout, park_at - time.monotonic()))
                woken.wait(timeout)
        finally:
            self._waiters.remove(request_id)

    def _take(self, request_id: str, answer: ApprovalAnswer) -> None:
        data: dict[str, JsonValue] = {"id": request_id, "allow": answer.allow}
        if answer.note is not None:
            data["note"] = answer.note
        self._transcript.append_with(
            EventKind.APPROVAL_ANSWER,
            data,
            answer.source,
            self._book.taking(request_id, self._view.task_id),
        )
        self._tasks.asking(self._view.task_id, None)

    def _deadline_passed(self, request_id: str) -> bool:
        """Deny an unanswered request whose deadline passed; whether it did."""
        request = self._asked.get(request_id) or self._stored(request_id)
        if request is None or request.deadline_at is None or request.deadline_at > utcnow():
            return False
        deny_at_deadline(self._book, request)  # or the answer came first: taken next round
        return True

    def _stored(self, request_id: str) -> StoredRequest | None:
        from persistence import StoredRequest

        view = self._view
        found = self._book.of_tasks([view.task_id]).get(view.task_id)
        if found is None or found.id != request_id:
            return None
        request = StoredRequest(
            request_id=found.id,
            task_id=view.task_id,
            child_id=view.child_id,
            parent_session=view.owner_session,
            turn=self._transcript.turn,
            call_id="",
            tool=found.tool,
            arguments=found.arguments,
            reason=found.reason,
            pending=[],
            parkable=True,
            created_at=found.created_at or utcnow(),
            deadline_at=found.deadline_at,
        )
        self._asked[request_id] = request
        return request

    def _park(self, request_id: str) -> bool:
        """Give the child's claim up while the request waits, every message steered so
        far recorded first; False (nothing changed) when the answer came first."""
        fence = self._fence
        if fence is None:
            return False
        return self._transcript.park_with(
            lambda: self._book.park(request_id, self._view.child_id, fence)
        )


def deny_at_deadline(book: ApprovalBook, request: StoredRequest) -> bool:
    """Deny ``request``, its deadline past, as the system; False when an answer (or a
    settlement) came first."""
    try:
        book.answer(
            request.request_id,
            allow=False,
            note=deadline_note(request),
            source=DEADLINE_SOURCE,
            session=None,
        )
    except SubagentControlError as exc:
        if exc.code is not ErrorCode.REQUEST_CLOSED:
            raise
        return False
    return True


def deadline_note(request: StoredRequest) -> str:
    """Why a request its deadline denied was denied."""
    waited = ""
    if request.deadline_at is not None:
        waited = f" within {(request.deadline_at - request.created_at).total_seconds():g}s"
    return f"denied: no answer came{waited} (the tool's approval deadline)"


def _gone(request_id: str, status: str) -> SubagentControlError:
    return SubagentControlError(
        ErrorCode.CANCELLED,
        f"request {request_id} was closed while its run waited (its task is {status})",
    )
