"""One activation's transcript writer: ordered, held until publication, closed at turn end.

How its store calls are fenced (abandoned and refused once the runtime fences the
activation) is `actors._transcript_fencing`, a mixin it inherits."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Literal

from actors._transcript_fencing import TranscriptFencing
from controlplane.contract import (
    CancelSignal,
    ChildMeta,
    ErrorCode,
    EventKind,
    MessageSource,
    NewEvent,
    ParkedTask,
    Spent,
    SubagentControlError,
    TextBlock,
    Usage,
    plain_json,
    spent_in,
    text_of,
)
from persistence import steering_record

if TYPE_CHECKING:
    from actors._spend import TurnSpend
    from persistence import Fence, Settlement, SqlStore, SteeringRecord, TxStep

__all__ = ["ActivationTranscript", "SteeringReceipt", "message_data", "turn_frame"]

_NOTHING = Spent()


def message_data(message: Sequence[TextBlock]) -> dict[str, Any]:
    """The stored ``data`` of an inbound message (prompt or steering)."""
    return {"text": text_of(message)}


def turn_frame(
    turn: int,
    *,
    task_id: str,
    kind: str,
    label: str,
    prompt: Sequence[TextBlock],
    source: MessageSource,
) -> list[NewEvent]:
    """The frame that opens a turn: ``turn/start`` naming its Task, then the
    message as ``user/message``. A resume's is written with its claim (its ``turn`` set
    by the store), a new child's at publication."""
    return [
        NewEvent(
            kind=EventKind.TURN_START,
            turn=turn,
            data={"task_id": task_id, "activation": kind, "label": label},
        ),
        NewEvent(kind=EventKind.USER_MESSAGE, turn=turn, data=message_data(prompt), source=source),
    ]


class SteeringReceipt:
    """A message handed to the run whose ``steering/message`` is queued for the transcript.

    The sender calls `commit` before it reports ``steered``: it writes the record (with any
    other queued ones) unless a write of the turn got there first.
    """

    __slots__ = ("_error", "_transcript", "_written", "event", "forwarded", "task_id")

    def __init__(
        self,
        transcript: ActivationTranscript,
        event: SteeringRecord,
        task_id: str,
        forwarded: str | None = None,
    ) -> None:
        self._transcript = transcript
        self._written = False
        self._error: SubagentControlError | None = None
        self.event = event
        self.task_id = task_id
        self.forwarded = forwarded
        """The inbox id of a forwarded message: its record's write also answers it."""

    def commit(self) -> None:
        """Return once the ``steering/message`` is durable.

        Raises:
            SubagentControlError: ``DURABILITY_FAILED``: the run has the message, the
                transcript does not.
        """
        self._transcript._commit(self)

    def _settle(self, error: SubagentControlError | None) -> None:
        self._written, self._error = error is None, error


class ActivationTranscript(TranscriptFencing):
    """Writes one activation's turn to the child's transcript, in order.

    One lock orders every write of the turn: the frame, the provider's events, steering messages
    and the turn end. Provider writes before publication are held and written right after the
    frame. A resumed turn writes its frame first (`write_frame`), before the provider starts, so
    the message that resumed it is durable whatever the start does; its provider's early writes
    are still held until publication, and a turn that ends unpublished still gets its
    ``turn/end``. A steer runs ``run.steer`` and queues its ``steering/message`` under the same
    lock; the next write of the turn — the sender's own `SteeringReceipt.commit`, or whatever
    the run writes first, or the turn's end — writes the queued records before anything else, so
    a message is always in the transcript before any reply it causes. The supervisor thus hands
    the message over without waiting for the database, and the sender's thread does the write it
    was going to wait for anyway. A forwarded message's answer to the runtime that sent it goes
    in the same transaction as its record (`persistence.SqlStore.append`'s ``answer_steered``):
    the holder pays no transaction of its own for it, and the sender hears ``steered`` exactly
    when the record commits.
    """

    def __init__(
        self,
        store: SqlStore,
        child_id: str,
        turn: int,
        *,
        fence: Fence | None = None,
        task_id: str | None = None,
        signal: CancelSignal | None = None,
        spend: TurnSpend | None = None,
    ) -> None:
        self._store = store
        # Prices the turn's model calls before they are written, counts them after.
        self._spend = spend
        self._child_id = child_id
        self._turn = turn
        # Every write is conditional on this runtime still holding the child's claim; a
        # refused one (FENCED) cancels the activation through its signal.
        self._fence = fence
        self._task_id = task_id
        self._signal = signal
        self._lock = threading.Lock()
        # The threads inside a store write now; a lock of its own: writes run under _lock.
        self._writers: set[int] = set()
        self._writers_lock = threading.Lock()
        if signal is not None:
            # Fenced also after a kill: a killed activation's write waits on the network too.
            signal.add_fence_callback(self._on_fence)
        # The writer's own state, which leads the activation's phase (the supervisor learns
        # of each change by the activation's report): held: nothing written; framed: the
        # frame written, the provider's writes held; open: published, every write goes
        # straight to the store; parked: closed by `park_with` (the Task goes on
        # elsewhere); closed: ended. Changed under _lock; `append_with` waits on _settled
        # for it to leave held and framed.
        self._state: Literal["held", "framed", "open", "parked", "closed"] = "held"
        # Made for the first write that has to wait (most turns have none, and a Condition
        # is ~1 KiB of every live child's memory).
        self._settled: threading.Condition | None = None
        self._held: list[NewEvent] = []
        # The run's last event (`append`'s ``last``), kept for the turn's end to write.
        self._last: NewEvent | None = None
        self._queued: list[SteeringReceipt] = []  # delivered, record not yet written
        # The write refusal that closed the turn (this runtime lost the claim, or fenced
        # itself): its end is not written, and `close` says so.
        self._refusal: SubagentControlError | None = None

    @property
    def turn(self) -> int:
        """The turn number of this activation."""
        return self._turn

    @property
    def parked(self) -> bool:
        """Whether the turn parked on an approval request (it takes nothing more here)."""
        return self._state == "parked"

    @property
    def spent(self) -> Usage:
        """What this turn has written so far (its model and tool calls' usage)."""
        return self._spend.total if self._spend is not None else Usage.zero()

    # -- the provider's side (TranscriptWriter) --------------------------------------

    def append(
        self, kind: str, data: Any, *, source: MessageSource | None = None, last: bool = False
    ) -> None:
        """Append one event of the child's own production (``assistant/message``, …).

        A ``last`` one is kept for the turn's end, which writes it with ``turn/end`` and the
        Task's settlement in one transaction (`close`); before publication it is not written
        with the held events either, so a turn that ended before it was published commits
        its frame, reply and end at most twice.
        """
        if not isinstance(kind, str) or not kind:
            raise SubagentControlError(ErrorCode.INVALID_INPUT, "an event kind must be a string")
        data = plain_json(data, code=ErrorCode.INVALID_INPUT, what=f"{kind} event data")
        if self._spend is not None:
            data = self._spend.priced(data)
        event = NewEvent(kind=kind, turn=self._turn, data=data, source=source)
        with self._lock:
            if self._state in ("held", "framed"):
                if self._last is not None:  # written after its last: the kept one goes first
                    self._held.append(self._last)
                    self._last = None
                if last:
                    self._last = event
                else:
                    self._held.append(event)
            elif self._state == "open":
                if last and self._last is None:
                    self._last = event
                    return
                self._write_queued()
                self._write_last()
                if last:
                    self._last = event
                else:
                    self._write([event])
            else:
                raise SubagentControlError(
                    ErrorCode.CLOSED,
                    f"turn {self._turn} of child {self._child_id} has ended; nothing was written",
                    child_id=self._child_id,
                )

    def append_with(
        self,
        kind: str,
        data: dict[str, Any],
        source: MessageSource | None,
        also: TxStep,
    ) -> None:
        """Append one event now, with ``also`` run in its transaction (an approval's row
        and its Task's status go with its event: `persistence._approvals`). Before
        publication it waits for it: a request must be durable before the run waits.

        Raises:
            SubagentControlError: ``CLOSED`` once the turn ended; ``FENCED``; what the
                store or ``also`` raised (nothing written then).
        """
        data = plain_json(data, code=ErrorCode.INVALID_INPUT, what=f"{kind} event data")
        event = NewEvent(kind=kind, turn=self._turn, data=data, source=source)
        with self._lock:
            if self._state in ("held", "framed"):
                if self._settled is None:
                    self._settled = threading.Condition(self._lock)
                self._settled.wait_for(lambda: self._state not in ("held", "framed"))
            if self._state != "open":
                raise SubagentControlError(
                    ErrorCode.CLOSED,
                    f"turn {self._turn} of child {self._child_id} has ended; nothing was written",
                    child_id=self._child_id,
                )
            self._write_queued()
            self._write_last()
            self._fenced(
                lambda: self._store.append(self._child_id, [event], fence=self._fence, also=also)
            )

    def park_with(self, park: Callable[[], bool]) -> bool:
        """Park the turn: under this writer's lock — so no steer is handed to
        the run meanwhile — write the steering records still queued, then run ``park``
        (the claim given up in the store); when it returns True the turn takes nothing
        more (a later steer is refused `ParkedTask`, and the supervisor delivers it into the
        parked Task's continued turn). Returns what ``park`` returned."""
        with self._lock:
            if self._state != "open":
                return False
            self._write_queued()
            self._write_last()
            parked = self._fenced_call(park)
            if parked:
                self._state = "parked"
            return parked

    def held_spend(self) -> Spent:
        """What the run's events held until publication record spending: the store counts
        them only once they are written (a budget's gate adds them meanwhile)."""
        with self._lock:
            unwritten = self._held if self._last is None else [*self._held, self._last]
            if not unwritten:
                return _NOTHING
            return spent_in([event.data for event in unwritten]) or _NOTHING

    # -- the control plane's side ----------------------------------------------------

    def frame(
        self, prompt: Sequence[TextBlock], source: MessageSource, **start: Any
    ) -> list[NewEvent]:
        """The events that open the turn: ``turn/start`` then the prompt as ``user/message``."""
        return [
            NewEvent(kind=EventKind.TURN_START, turn=self._turn, data=start),
            NewEvent(
                kind=EventKind.USER_MESSAGE,
                turn=self._turn,
                data=message_data(prompt),
                source=source,
            ),
        ]

    def write_frame(self, frame: Sequence[NewEvent]) -> None:
        """Write the frame of an existing child's turn now, before its run is published; the
        provider's writes stay held until `publish` (called with no frame).

        Raises:
            SubagentControlError: ``DURABILITY_FAILED`` if the store keeps failing;
                ``FENCED`` if another runtime claimed the child meanwhile.
        """
        with self._lock:
            try:
                # Neither refused here nor abandoned once fenced, as the run's writes are:
                # no provider has been called, so nothing acts meanwhile, and the message
                # was answered `started`: it is written if the claim still allows it (the
                # store checks the fencing number), the turn then closed as interrupted.
                if frame:  # none when it goes on in the turn it opened before (adopted)
                    self._store.append(self._child_id, frame, fence=self._fence)
            except SubagentControlError as exc:
                self._end()
                if exc.code is ErrorCode.FENCED:
                    self._refused(exc)
                    raise
                raise _durability(self._child_id, "record the turn's message", exc) from exc
            self._state = "framed"

    def publish(self, frame: Sequence[NewEvent], *, header: ChildMeta | None = None) -> None:
        """Write the frame (with the header for a new child), then the held events, at once.

        Raises:
            SubagentControlError: ``DURABILITY_FAILED`` if the store keeps failing.
        """
        with self._lock:
            events = [*frame, *self._held]
            try:
                if not events:
                    pass  # framed already, and the provider wrote nothing while it started
                elif header is not None:
                    claim = None
                    if self._fence is not None and self._task_id is not None:
                        claim = (self._fence[0], self._task_id)
                    self._fenced(lambda: self._store.create_child(header, events, claim=claim))
                else:
                    self._fenced(
                        lambda: self._store.append(self._child_id, events, fence=self._fence)
                    )
            except SubagentControlError as exc:
                self._end()
                raise _durability(self._child_id, "publish the turn", exc) from exc
            if self._spend is not None:
                self._spend.written(self._held)
            self._held = []
            self._state = "open"
            self._notify_settled()

    def steer(
        self,
        deliver: Callable[[], object],
        message: Sequence[TextBlock],
        source: MessageSource,
        *,
        task_id: str,
        forwarded: str | None = None,
    ) -> SteeringReceipt:
        """Hand ``message`` to the run (``deliver``) and queue its ``steering/message``
        (whose data names the inbox id of a ``forwarded`` message).

        The caller must `SteeringReceipt.commit` the receipt before it reports delivery.
        A ``forwarded`` message is answered ``steered`` (into ``task_id``) to its sender
        by the transaction that writes its record, whichever write of the turn that is.

        Raises:
            SubagentControlError: ``NOT_DELIVERED`` if the run refuses it (nothing queued);
                ``INVALID_INPUT`` if the store could not keep its record (the run never
                has it).
        """
        # Checked and serialised here, once: the store writes it as it is.
        text = message[0].text if len(message) == 1 else text_of(message)
        event = steering_record(self._turn, text, source, forwarded)
        with self._lock:
            if self._state != "open":
                if self._state == "parked" and self._task_id is not None:
                    # Parked on an approval request: sent again, it continues that turn.
                    raise ParkedTask(child_id=self._child_id, task_id=self._task_id)
                raise _not_delivered(self._child_id, "its turn has ended")
            if self._signal is not None and self._signal.cause is ErrorCode.FENCED:
                why = f"its turn was stopped ({self._signal.reason})"
                raise _not_delivered(self._child_id, why)
            try:
                deliver()
            except BaseException as exc:  # escaping, it would stop every actor
                raise _not_delivered(self._child_id, f"the turn settled first ({exc})") from exc
            receipt = SteeringReceipt(self, event, task_id, forwarded)
            self._queued.append(receipt)
            return receipt

    def close(
        self,
        end: dict[str, Any] | None,
        *,
        settle: Settlement | None = None,
        seconds: float = 0.0,
    ) -> None:
        """End the turn: write ``turn/end`` (when published) and refuse later writes.

        ``settle``, the Task's settlement, is written in the same transaction as
        ``turn/end`` (so the two never disagree), after the run's ``last`` event if it kept
        one (the reply and the end land together or not at all); the caller writes it
        itself when this raises, or when there is no ``turn/end`` to write. ``seconds``, the turn's
        wall-clock time, is added to the child's spend in that transaction too.

        Raises:
            SubagentControlError: ``DURABILITY_FAILED`` if ``turn/end`` cannot be written.
        """
        with self._lock:
            was_open = self._state in ("open", "framed")
            self._end()
            self._held = []
            # An unpublished turn's kept reply goes with its held events: not written.
            kept, self._last = ([] if self._last is None else [self._last]), None
            self._write_queued()  # delivered during the turn: recorded before its end
            if end is not None and self._refusal is not None:
                # A refused (or abandoned) write closed the turn: its end and the Task's
                # settlement were not written. Raised, so the Task service keeps the
                # settlement for its flush, which writes it with the turn's end and
                # releases the child once the store answers (issue 36, break 1).
                raise self._refusal
            if not was_open or end is None:
                return
            try:
                end_event = NewEvent(kind=EventKind.TURN_END, turn=self._turn, data=end)
                self._fenced(
                    lambda: self._store.append(
                        self._child_id,
                        [*kept, end_event],
                        settle=settle,
                        fence=self._fence,
                        seconds=seconds,
                    )
                )
            except SubagentControlError as exc:
                raise _durability(self._child_id, "record the end of the turn", exc) from exc
            if self._spend is not None and kept:
                self._spend.written(kept)

    def _commit(self, receipt: SteeringReceipt) -> None:
        with self._lock:
            if not receipt._written and receipt._error is None:
                self._write_queued()
        if receipt._error is not None:
            raise receipt._error
        if not receipt._written:  # never reached a write that settled it: not durable
            raise _durability(
                self._child_id,
                "record the steered message",
                SubagentControlError(ErrorCode.INTERNAL, "its record was never written"),
            )

    def _write_queued(self) -> None:
        """Write the queued ``steering/message`` records, in one batch (under the lock).

        A failed batch is not retried later: a record written after what followed it
        would break the transcript's order, so each of its senders hears
        ``DURABILITY_FAILED`` instead.
        """
        queued, self._queued = self._queued, []
        if not queued:
            return
        steered = [(r.forwarded, r.task_id) for r in queued if r.forwarded is not None]
        try:
            # No spend to count: a steering record carries only its text.
            self._fenced(
                lambda: self._store.append(
                    self._child_id,
                    [receipt.event for receipt in queued],
                    fence=self._fence,
                    answer_steered=steered,
                )
            )
        except BaseException as exc:
            # Whatever escapes (a store error, a bug, KeyboardInterrupt in the committing
            # thread), every receipt taken off the queue ends failed, never "written" by
            # default; a store error is the turn's to survive, anything else goes on up.
            cause = exc if isinstance(exc, SubagentControlError) else _internal(exc)
            for receipt in queued:
                error = _durability(self._child_id, "record the steered message", cause)
                error.task_id = receipt.task_id
                error.__cause__ = cause  # FENCED: never written (a forward's holder says so)
                receipt._settle(error)
            if not isinstance(exc, SubagentControlError):
                raise
            return
        for receipt in queued:
            receipt._settle(None)

    def _write(self, events: list[NewEvent]) -> None:
        self._fenced(lambda: self._store.append(self._child_id, events, fence=self._fence))
        if self._spend is not None:
            self._spend.written(events)

    def _write_last(self) -> None:
        """Under the lock: write the run's kept last event now (something follows it)."""
        if self._last is not None:
            last, self._last = self._last, None
            self._write([last])

    def _end(self) -> None:
        """Under the lock: the turn takes no more writes (a parked one stays parked)."""
        if self._state != "parked":
            self._state = "closed"
        self._notify_settled()

    def _notify_settled(self) -> None:
        """Under the lock: wake the writes waiting for the turn to open (if one waited)."""
        if self._settled is not None:
            self._settled.notify_all()


def _not_delivered(child_id: str, why: str) -> SubagentControlError:
    return SubagentControlError(
        ErrorCode.NOT_DELIVERED,
        f"child {child_id}: {why}; the message was not delivered; retry after it settles",
        child_id=child_id,
    )


def _internal(exc: BaseException) -> SubagentControlError:
    return SubagentControlError(ErrorCode.INTERNAL, str(exc) or type(exc).__name__)


def _durability(child_id: str, what: str, exc: SubagentControlError) -> SubagentControlError:
    return SubagentControlError(
        ErrorCode.DURABILITY_FAILED,
        f"durability failed: could not {what} for child {child_id}: {exc.message}",
        child_id=child_id,
    )
