"""An activation's inbox: the messages its supervisor decided to steer into the running turn.

The supervisor decides (steer, hold, refuse, resume) and puts the message here; it never
calls the provider's ``steer`` and never waits for the database. Delivery — ``run.steer``,
then the ``steering/message`` record — is done for the activation by its senders' threads,
one at a time, under this inbox's order: a provider whose ``steer`` blocks, or a store
write that waits out its retry budget, holds up the senders into that one turn, never a
supervisor's mailbox. (The run's own thread is inside the provider's turn; a thread of the
activation's own would add a third hop to every steer: caller → supervisor → that thread →
caller. The sender was going to wait for its record anyway.)

Order: messages are delivered by one drainer at a time, in the order they were put here (the
supervisor's mailbox order, or a direct put's place under this inbox's lock); each is handed
to the run and queued for the transcript under the transcript's lock, so the order the model
saw is the transcript's order. Whoever finds queued messages and no drainer drains them all
(its own and those behind it), so a lone sender pays no hop beyond the supervisor's answer
(caller → supervisor → caller), and none at all when it put its message here itself (below).
Messages that arrive before publication wait here; the supervisor hands the inbox the
activation's published view (`ActivationView`, which names the run and its transcript) when
the run is published, and their senders deliver them then, in order. The inbox keeps no
status of its own beside that view: before it, messages wait; with it, they go into its run
unless its transcript has parked; once closed (the reason `close` gave), they are refused.

A sender is answered ``steered`` only once its record is durable; ``NOT_DELIVERED`` when
the run refused it (its turn settled first), the turn ended before it was taken, or its
task was killed first; ``DURABILITY_FAILED`` when the run has it and the record could not
be written.

The common steer skips the supervisor's mailbox: while the activation is published and its
supervisor has not moved it on (settling, parking, broken, closed), a sender puts its message
here itself (`put_direct`), after the checks the supervisor would make (the Task's owner, no
other live agent on the child's id, not killed, the transcript not parked). The supervisor
turns that off under this inbox's lock before it acts on any later step (`stop_direct`), so
a message put directly is one the supervisor would have put had it come just before that
step; a sender refused here goes through the supervisor, which decides as always.

Parking: once the run's transcript has parked on an approval request, a message it has not
taken stays here (nobody delivers any more), and the supervisor takes them all back once the
activation ended (`hand_back`, with the ``parked`` view) and delivers them into the parked
Task's continued turn. Each sender then waits on a `Held` the supervisor resolves with its
message's reply.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Iterable
from typing import TYPE_CHECKING, Protocol

from controlplane.contract import (
    ActivationTrace,
    AgentRegistry,
    CancelSignal,
    ErrorCode,
    ParkedTask,
    SendResult,
    SubagentControlError,
    SubagentRun,
    Telemetry,
)

if TYPE_CHECKING:
    from actors._record import ActivationView
    from actors._transcript import ActivationTranscript, SteeringReceipt
    from actors.messages import SendMessage

__all__ = ["ActivationInbox", "Delivery", "Held"]


class _Answer(Protocol):
    def result(self) -> SendResult: ...


class Held:
    """A message its supervisor holds while the child's run parks: resolved, once the
    Task's next step is known, with the reply the supervisor then gave it (or its refusal).
    Its sender waits here (`result`), on its own thread."""

    __slots__ = ("_answer", "_done", "_error", "send")

    def __init__(self, send: SendMessage) -> None:
        self.send = send
        self._done = threading.Event()
        self._answer: _Answer | None = None
        self._error: SubagentControlError | None = None

    def resolve(self, answer: _Answer | None, error: SubagentControlError | None = None) -> None:
        """The supervisor's reply (or refusal); the first resolution stands."""
        if not self._done.is_set():
            self._answer, self._error = answer, error
            self._done.set()

    def result(self) -> SendResult:
        """The send's result once the supervisor delivered it (and that delivery is final).

        Raises:
            SubagentControlError: it was refused, or its delivery failed.
        """
        self._done.wait()
        if self._error is not None:
            raise self._error
        assert self._answer is not None
        return self._answer.result()


class Delivery:
    """One message put into an activation's inbox; its sender waits for it
    (`ActivationInbox.wait`)."""

    __slots__ = ("_done", "_error", "held", "send", "sender")

    def __init__(self, send: SendMessage) -> None:
        self.send = send
        self.sender: object = None  # the sending call's span, for the activation's trace
        self._done = False
        self._error: SubagentControlError | None = None
        # Taken back by the supervisor at a park: the send's answer comes from here.
        self.held: Held | None = None


class ActivationInbox:
    """The inbox of one activation; see the module docstring.

    Messages wait until the supervisor hands it the published view (`publish`), and
    again once that view's transcript has parked (for `hand_back`); once closed (the
    activation ended, or its supervisor stopped) a message put then, or still queued, is
    refused with the reason `close` gave.
    """

    def __init__(
        self,
        child_id: str,
        task_id: str,
        *,
        signal: CancelSignal,
        trace: ActivationTrace,
        telemetry: Telemetry,
        agents: AgentRegistry | None = None,
    ) -> None:
        self._child_id = child_id
        self._agents = agents
        self._task_id = task_id
        self._signal = signal
        self._trace = trace
        self._telemetry = telemetry
        # Held only for the few lines around the queue: never across a steer or a write.
        self._lock = threading.Lock()
        # Made for the first sender that has to wait (a Condition is ~1 KiB of every live
        # child's memory, and most children's senders never wait: each drains its own).
        self._changed: threading.Condition | None = None
        self._queue: deque[Delivery] = deque()
        # The activation's view as its supervisor last handed it (at publication, at its
        # park): the run and transcript to deliver into; None until published.
        self._view: ActivationView | None = None
        self._closed: SubagentControlError | None = None
        self._draining = False
        self._waiting = 0  # senders asleep on `_changed`: nobody to wake, no notify paid
        self._held = 0  # messages put before publication (the held-messages gauge's share)
        # Whether senders may put messages here without the supervisor (`put_direct`):
        # from publication until the supervisor's next step.
        self._direct = False
        self.last_direct_s = 0.0  # when a sender last did (wall clock), for the tree dump
        self._steered: SendResult | None = None
        # A kill refuses what is still queued at once: its senders need not wait for a
        # drainer stuck in the provider's steer or a store write to tell them.
        signal.add_callback(self._on_abort)

    def steered(self, task_id: str) -> SendResult:
        """The answer ``steered`` into ``task_id`` (this activation's Task): one frozen
        value, made once and given to each of its steers."""
        result = self._steered
        if result is None or result.task_id != task_id:
            result = self._steered = SendResult(route="steered", task_id=task_id)
        return result

    @property
    def pending(self) -> int:
        """How many messages wait for delivery (held until publication, mostly)."""
        return len(self._queue)

    # -- the supervisor's side ---------------------------------------------------------

    def put(self, send: SendMessage) -> Delivery:
        """Queue a message for the turn; never blocks on the run or the store."""
        delivery = Delivery(send)
        with self._lock:
            if self._closed is None:
                self._queue.append(delivery)
                if self._view is None:
                    self._held += 1
                    self._telemetry.held_messages(1)
                return delivery
            self._resolve(delivery, self._refusal(self._closed))
        return delivery

    def stop_direct(self) -> None:
        """The supervisor moves the activation on: senders go through it from now on."""
        if self._direct:
            with self._lock:
                self._direct = False

    def close(self, code: ErrorCode, why: str) -> None:
        """Refuse every message not taken yet, and every later one (first reason wins)."""
        with self._lock:
            if self._closed is None:
                self._closed = SubagentControlError(
                    code,
                    f"child {self._child_id}: {why}; the message was not delivered",
                    child_id=self._child_id,
                    task_id=self._task_id,
                )
            self._unhold()
            queued, self._queue = self._queue, deque()
            for delivery in queued:
                self._resolve(delivery, self._refusal(self._closed))

    def _unhold(self) -> None:
        """Under the lock: the held messages stop waiting for publication."""
        if self._held:
            self._telemetry.held_messages(-self._held)
            self._held = 0

    def hand_back(self, view: ActivationView) -> list[Held]:
        """The run parked (``view``, its activation's ``parked`` view): close the inbox
        and give the supervisor every message the run did not take, in order, each as a
        `Held` its sender now waits on. A message a drainer still holds, which the parked
        run then refuses, is answered `ParkedTask`: never delivered, its sender routes it
        again (`actors._delivery`), and finds the park known."""
        with self._lock:
            queued, self._queue = self._queue, deque()
            held = self._held_all(queued)
            self._view = view
            if self._closed is None:
                self._closed = self._not_delivered("its run parked before it could take it")
            self._unhold()
            return held

    def _held_all(self, deliveries: Iterable[Delivery]) -> list[Held]:
        """Under the lock: answer each delivery with a `Held` (its sender waits there)."""
        held: list[Held] = []
        for delivery in deliveries:
            if delivery._done:
                continue
            delivery.held = Held(delivery.send)
            held.append(delivery.held)
            self._resolve(delivery, None)
        return held

    def publish(
        self, view: ActivationView, refuse_held: SubagentControlError | None = None
    ) -> None:
        """The run is published (``view``, its activation's ``published`` view, names it
        and its transcript): the held messages' senders deliver them now, in order — or
        refuse them all with ``refuse_held`` (they were admitted on a guess the published
        run disproved)."""
        assert view.run is not None
        assert view.transcript is not None
        with self._lock:
            if self._view is not None or self._closed is not None:
                return
            self._view = view
            self._unhold()
            self._direct = refuse_held is None and view.run.steer is not None
            if refuse_held is not None:
                queued, self._queue = self._queue, deque()
                for delivery in queued:
                    self._resolve(delivery, self._refusal(refuse_held))
            self._notify()

    def _on_abort(self, reason: str) -> None:
        if self._signal.cause is None:  # a kill, not a close or a lost claim
            self._trace.killed()  # on the kill's thread: its span links to the activation
        with self._lock:
            queued, self._queue = self._queue, deque()
            for delivery in queued:
                self._resolve(delivery, self._killed(reason))

    # -- the senders' side -------------------------------------------------------------

    def put_direct(self, send: SendMessage) -> Delivery | None:
        """Queue a steer without the supervisor (see the module docstring); None when the
        supervisor must decide (not published or moved on, another session's Task, a
        live agent on the child's id that is not the run's, killed, parked)."""
        if not self._direct or send.continues is not None:
            return None
        agents = self._agents
        with self._lock:
            view = self._view
            if (
                not self._direct
                or self._closed is not None
                or view is None
                or view.run is None
                or view.transcript is None
                or view.owner_session != send.parent.session_id
                or self._signal.aborted
                or view.transcript.parked
            ):
                return None
            agent = agents.get(self._child_id) if agents is not None else None
            if agent is not None and agent is not view.run.local_agent:
                return None  # the supervisor names the conflict
            delivery = Delivery(send)
            self._queue.append(delivery)
        return delivery

    def wait(self, delivery: Delivery) -> Held | None:
        """Return once ``delivery``'s record is durable (the sender's thread): drain the
        inbox when nobody else does, else wait for whoever does. A `Held` when the run
        parked before taking it: the supervisor delivers it on (its answer comes there).

        Raises:
            SubagentControlError: the message was not delivered (``NOT_DELIVERED``,
                ``OWNERSHIP_CONFLICT``, ``CLOSED``, ``FENCED``…), or ``DURABILITY_FAILED``:
                the run has it, the transcript does not.
        """
        delivery.sender = self._trace.sender()
        while True:
            with self._lock:
                while not delivery._done and (self._draining or self._stalled()):
                    self._waiting += 1
                    if self._changed is None:
                        self._changed = threading.Condition(self._lock)
                    try:
                        self._changed.wait()
                    finally:
                        self._waiting -= 1
                if delivery._done:
                    break
                # Open, nobody draining, ours not taken yet: ours is queued, so drain.
                self._draining = True
            self._drain_and_release()
        if delivery._error is not None:
            raise delivery._error
        return delivery.held

    def _stalled(self) -> bool:
        """Under the lock: whether delivery waits — for the run's publication, or, its
        transcript parked, for the supervisor to take the messages back (`hand_back`)."""
        if self._closed is not None:
            return False
        view = self._view
        return view is None or view.transcript is None or view.transcript.parked

    def _drain_and_release(self) -> None:
        try:
            self._drain()
        except BaseException:
            with self._lock:
                self._draining = False
                if self._waiting:
                    self._notify()
            raise

    def _drain(self) -> None:
        """Deliver every queued message, batch by batch, until none is left (as the one
        drainer), then let the drainer's role go, under the lock that found none left.
        Each batch's records are written by its first commit, in one write."""
        while True:
            with self._lock:
                view = self._view
                if self._closed is not None or self._stalled() or not self._queue:
                    self._draining = False
                    if self._waiting:
                        self._notify()
                    return
                batch, self._queue = self._queue, deque()
            assert view is not None
            run, transcript = view.run, view.transcript
            assert run is not None
            assert transcript is not None
            taken: list[tuple[Delivery, SteeringReceipt]] = []
            try:
                for index, delivery in enumerate(batch):
                    try:
                        receipt = self._hand_over(run, transcript, delivery)
                    except ParkedTask:
                        # The run parked: this message and those behind it wait for the
                        # supervisor (`hand_back`), ahead of any put since.
                        rest = list(batch)[index:]
                        for _ in rest:
                            batch.pop()
                        self._park_rest(rest)
                        break
                    if receipt is not None:
                        taken.append((delivery, receipt))
                with self._telemetry.scoped(self._child_id, self._task_id):
                    for delivery, receipt in taken:
                        try:
                            receipt.commit()
                        except SubagentControlError as exc:
                            exc.task_id = self._task_id
                            self._settle(delivery, exc)
                        else:
                            self._settle(delivery, None)
            finally:
                # Whatever escaped (KeyboardInterrupt in a sender's thread), no message of
                # the batch is left unanswered: the run may have one, the record is unsure.
                for delivery in batch:
                    if not delivery._done:
                        self._settle(delivery, self._unsure())

    def _park_rest(self, rest: list[Delivery]) -> None:
        """The parked run refused ``rest`` (a drainer's, in order): they wait for the
        supervisor's `hand_back`, ahead of any put since; handed back already (the view
        it was handed is ``parked``), each is answered `ParkedTask` (routed again by its
        sender); closed otherwise, refused."""
        with self._lock:
            if self._closed is None:
                self._queue.extendleft(reversed(rest))
                return
            handed_back = self._view is not None and self._view.phase == "parked"
            for delivery in rest:
                refusal = self._refusal(self._closed)
                if handed_back:
                    refusal = ParkedTask(child_id=self._child_id, task_id=self._task_id)
                self._resolve(delivery, refusal)

    def _hand_over(
        self, run: SubagentRun, transcript: ActivationTranscript, delivery: Delivery
    ) -> SteeringReceipt | None:
        """Hand one message to the run and queue its record; None if refused (answered)."""
        refusal: SubagentControlError | None = None
        if self._signal.aborted:
            refusal = self._killed(self._signal.reason)
        steer = run.steer
        if refusal is None and steer is None:
            refusal = self._not_delivered("its provider has no live delivery into a running turn")
        if refusal is not None or steer is None:
            self._settle(delivery, refusal)
            return None
        message, source = delivery.send.message, delivery.send.source
        try:
            receipt = transcript.steer(
                lambda: steer(message, source),
                message,
                source,
                task_id=self._task_id,
                forwarded=delivery.send.forwarded,
            )
        except ParkedTask:
            raise  # its run parked: the supervisor delivers it on (`_drain`)
        except SubagentControlError as exc:
            exc.task_id = self._task_id
            self._settle(delivery, exc)
            return None
        self._trace.steered(message, source.kind, delivery.sender)
        return receipt

    def _notify(self) -> None:
        """Under the lock: wake the senders asleep on `_changed` (if one ever waited)."""
        if self._changed is not None:
            self._changed.notify_all()

    def _settle(self, delivery: Delivery, error: SubagentControlError | None) -> None:
        with self._lock:
            self._resolve(delivery, error)

    def _resolve(self, delivery: Delivery, error: SubagentControlError | None) -> None:
        """Under the lock: answer a delivery (once) and wake its waiting sender."""
        if delivery._done:
            return
        delivery._error = error
        delivery._done = True
        if self._waiting:
            self._notify()

    def _refusal(self, closed: SubagentControlError) -> SubagentControlError:
        return SubagentControlError(
            closed.code, closed.message, child_id=closed.child_id, task_id=closed.task_id
        )

    def _killed(self, reason: str | None) -> SubagentControlError:
        return self._not_delivered(f"its task was killed before delivery ({reason})")

    def _not_delivered(self, why: str) -> SubagentControlError:
        return SubagentControlError(
            ErrorCode.NOT_DELIVERED,
            f"child {self._child_id}: {why}; the message was not delivered; retry after it settles",
            child_id=self._child_id,
            task_id=self._task_id,
        )

    def _unsure(self) -> SubagentControlError:
        return SubagentControlError(
            ErrorCode.DURABILITY_FAILED,
            f"durability failed: delivery into child {self._child_id} was interrupted; the "
            "turn may have the message; look in the transcript before sending it again",
            child_id=self._child_id,
            task_id=self._task_id,
        )
