"""Routing across runtimes on PostgreSQL: a send to a child that another live runtime runs
is forwarded to it through the database (SPEC §9).

The sender (runtime B) writes the message to the store's inbox and notifies the holder
(runtime A) in one transaction, then waits for A's answer. A's listener hands the message to
a worker, which takes it (compare-and-set: once taken, B can no longer take it back, only
give it up when A is dead) and sends it to the child's supervisor as a steer-only message.
The steering record, which names the inbox id, is committed as a local steer's is, and that
same transaction answers the message (``steered`` with A's Task id: the inbox row becomes
``answered``) and notifies B, at commit (`persistence.SqlStore.append`'s
``answer_steered``): the record and the answer are durable together or not at all, and A
spends two transactions on a forwarded steer, the take and the record. A refusal, or a
kill's answer, is written and notified in a transaction of its own. The promise is the local
one, exactly once or not delivered:

- A never took it within `TAKE_S` (stopped, overloaded, deaf): B takes it back
  (compare-and-set) and raises ``NOT_DELIVERED``; A can no longer take it.
- A took it and answered: B returns A's answer (``steered`` with A's Task id, or A's
  refusal raised as such).
- A took it and died before answering: B gives it up (the row, still ``taken``, becomes
  ``abandoned``, so a late answer no longer lands), settles A's Tasks ``interrupted``
  (which takes A's claim and its fencing number away, so A can never write again), then
  looks for the steering record: found, ``steered`` with the Task of its turn (A, seen dead
  but only paused, committed it after B gave up and before the fencing); not found, not
  delivered.
- A died before taking it: B takes it back as soon as it sees A dead, and it is not
  delivered.

A message that was not delivered because A does not run the child (any more) — A died, or
answered that it no longer holds the child — is handed back to the caller to route again
(`forward` returns None): a resume here, a takeover of a dead runtime's child, or a forward
to the runtime that holds the child now. Never both: it was not delivered anywhere.

B remembers, per child, the runtime its last forward reached (`forward_known`), so the next
message goes there directly instead of first trying to claim the child here, which would
only find it held: an answer that A no longer holds it costs that guess one round trip.

`dump_tree` shows the forwards in flight: on B each message waiting for its answer, on A
each message being served (`in_flight`).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from controlplane._content import MessageSource, TextBlock
from controlplane._errors import ErrorCode, SubagentControlError
from controlplane._session import EventKind
from controlplane._spec import SendResult
from controlplane._task_types import TaskSnapshot
from controlplane._tree import ForwardedNode
from persistence import InboxItem

if TYPE_CHECKING:
    from controlplane._runtime import Runtime
    from persistence import Inbox, Listener, SqlStore

__all__ = ["TAKE_S", "Forwarder"]

log = logging.getLogger(__name__)

TAKE_S = 3.0
"""How long a forwarded message waits for its target to take it before it is taken back."""
_POLL_S = 0.25  # a lapsed target is seen this long after its lease at most (~3 reads)
_FIRST_POLL_S = 0.05  # a healthy forward is answered well before; a dead target is seen soon
_READY_S = 10.0
_WORKERS = 8
_KNOWN = 4096
"""How many children's holders a runtime remembers (the least recently used go first)."""
_FORGET_BATCH = 32  # decided messages' rows, deleted together

Serve = Callable[["InboxItem"], SendResult]
"""Deliver a message taken from the inbox here (steer only); raises the refusal."""
KillHere = Callable[[str, str], bool]
"""Abort a Task of this runtime, given its id and the reason; False if it is not here."""


@dataclass(frozen=True, slots=True)
class _InFlight:
    child_id: str
    runtime_id: str
    """The other end: the holder a message was sent to, or the sender of one served here."""
    since: float  # time.monotonic()


@dataclass(slots=True)
class _Posted:
    woken: threading.Event
    written: bool = False
    """Whether the message went as a row (too long for a notification)."""


class Forwarder:
    """This runtime's end of the forwarding: it sends messages to other runtimes and
    serves the ones they send here.

    Args:
        runtime: This runtime (its id, and whether another one is dead).
        store: The shared store (PostgreSQL: it has an inbox).
        serve: Delivers a message forwarded here to the child's supervisor, steer only.
        kill_here: Kills a Task of this runtime whose kill was forwarded here.
    """

    def __init__(
        self, runtime: Runtime, store: SqlStore, serve: Serve, kill_here: KillHere
    ) -> None:
        assert store.inbox is not None
        self._runtime = runtime
        self._store = store
        self._inbox: Inbox = store.inbox
        self._serve = serve
        self._kill_here = kill_here
        self._lock = threading.Lock()
        self._waiting: dict[str, threading.Event] = {}
        self._answers: dict[str, dict[str, Any]] = {}  # heard in notifications
        self._holders: OrderedDict[str, str] = OrderedDict()  # child id -> runtime id
        self._sending: dict[str, _InFlight] = {}  # inbox id -> where it went
        self._serving: dict[str, _InFlight] = {}  # inbox id -> where it came from
        self._decided: list[str] = []  # sent messages whose rows are left to forget
        self._workers = ThreadPoolExecutor(_WORKERS, thread_name_prefix="subagent-forwarded")
        self._listener: Listener = self._inbox.listen(
            runtime.id, on_message=self._on_message, on_reply=self._on_reply
        )
        if not self._listener.wait_ready(_READY_S):
            log.warning("runtime %s: not listening yet; messages to it wait", runtime.id)

    def stop_listening(self) -> None:
        """Take no more messages (close has begun); those taken are still answered."""
        self._listener.close()

    def close(self) -> None:
        """Stop listening, wait for the messages being served to be answered, and forget
        the rows of the messages this runtime sent."""
        self._listener.close()
        self._workers.shutdown(wait=True)
        with self._lock:
            batch, self._decided = self._decided, []
        if batch:
            self._forget(batch)

    def holder_of(self, child_id: str) -> str | None:
        """The runtime that holds the child's claim now, if another one does."""
        holder = self._inbox.holder_of(child_id)
        return None if holder == self._runtime.id else holder

    def in_flight(self) -> list[ForwardedNode]:
        """The messages this runtime forwarded and awaits answers to, and those it is
        serving for other runtimes, oldest first."""
        now = time.monotonic()
        with self._lock:
            ends = [("sending", self._sending), ("serving", self._serving)]
            nodes = [
                (
                    flight.since,
                    ForwardedNode(
                        inbox_id=inbox_id,
                        direction=direction,
                        child_id=flight.child_id,
                        runtime_id=flight.runtime_id,
                        age_s=round(now - flight.since, 3),
                    ),
                )
                for direction, flights in ends
                for inbox_id, flight in flights.items()
            ]
        return [node for _, node in sorted(nodes, key=lambda pair: pair[0])]

    # -- the sender's side ---------------------------------------------------------------

    def forward_known(
        self,
        child_id: str,
        *,
        parent_session: str,
        message: tuple[TextBlock, ...],
        source: MessageSource,
    ) -> SendResult | None:
        """`forward` to the runtime this one last reached ``child_id`` in, if any.

        Returns:
            Its answer; None when no runtime is known, or the message was not delivered
            there because that runtime no longer runs the child: route it again.

        Raises:
            SubagentControlError: as `forward`.
        """
        with self._lock:
            holder = self._holders.get(child_id)
        if holder is None:
            return None
        return self.forward(
            child_id, holder, parent_session=parent_session, message=message, source=source
        )

    def forward(
        self,
        child_id: str,
        holder: str,
        *,
        parent_session: str,
        message: tuple[TextBlock, ...],
        source: MessageSource,
    ) -> SendResult | None:
        """Send ``message`` to ``child_id``'s activation in runtime ``holder``.

        Returns:
            The holder's answer; None when the message was not delivered because the
            holder does not run the child (any more): it said so, or it died. Route it
            again.

        Raises:
            SubagentControlError: the holder's refusal, or ``NOT_DELIVERED`` when it did not
                take the message in time.
        """
        item = InboxItem(
            inbox_id=uuid.uuid4().hex,
            kind="send",
            child_id=child_id,
            sender_runtime=self._runtime.id,
            parent_session=parent_session,
            message=[block.model_dump(mode="json") for block in message],
            source=source.model_dump(mode="json"),
        )
        sent: SendResult | None = None
        try:
            with self._posted(item, holder) as posted:
                reply = self._outcome(item, holder, posted)
            if reply is None:
                sent = self._decide_without(item.inbox_id, child_id, holder)
            else:
                sent = _answer_of(reply, child_id, holder)
            return sent
        finally:
            self._learn(child_id, holder, reached=sent is not None)

    def kill(self, task: TaskSnapshot, reason: str) -> None:
        """`tasks.kill` of ``task``, which runs in another live runtime: the kill is
        forwarded there, and returns once that runtime has aborted it (settlement follows,
        as for a local kill). A runtime that dies first leaves its Task ``interrupted``.

        Raises:
            SubagentControlError: ``NOT_DELIVERED`` if that runtime did not take it.
        """
        holder = task.runtime_id or ""
        item = InboxItem(
            inbox_id=uuid.uuid4().hex,
            kind="kill",
            child_id=task.child_id or "",
            sender_runtime=self._runtime.id,
            parent_session=task.owner_session,
            message=[],
            source={"task_id": task.id, "reason": reason},
        )
        with self._posted(item, holder) as posted:
            try:
                reply = self._outcome(item, holder, posted)
            except SubagentControlError as exc:
                exc.task_id = task.id
                raise
        if reply is None:  # it died with the Task: the sweep settles it `interrupted`
            self._runtime.sweep()

    def _learn(self, child_id: str, holder: str, *, reached: bool) -> None:
        """Remember where a forward reached the child, or forget it did not."""
        with self._lock:
            if reached:
                self._holders[child_id] = holder
                self._holders.move_to_end(child_id)
                while len(self._holders) > _KNOWN:
                    self._holders.popitem(last=False)
            elif self._holders.get(child_id) == holder:
                del self._holders[child_id]

    @contextlib.contextmanager
    def _posted(self, item: InboxItem, holder: str) -> Iterator[_Posted]:
        """Post ``item`` to ``holder`` and wait for its answer while the block runs;
        forget the row after it."""
        inbox_id = item.inbox_id
        posted = _Posted(threading.Event())
        with self._lock:
            self._waiting[inbox_id] = posted.woken
            self._sending[inbox_id] = _InFlight(item.child_id, holder, time.monotonic())
        try:
            posted.written = self._inbox.post(item, target=holder)
            yield posted
        finally:
            with self._lock:
                self._waiting.pop(inbox_id, None)
                self._answers.pop(inbox_id, None)
                self._sending.pop(inbox_id, None)
                self._decided.append(inbox_id)
                batch = self._decided if len(self._decided) >= _FORGET_BATCH else []
                if batch:
                    self._decided = []
            if batch:  # off the callers' path: the rows are only clutter now
                with contextlib.suppress(RuntimeError):  # closing: leftover rows harm nothing
                    self._workers.submit(self._forget, batch)

    def _forget(self, inbox_ids: list[str]) -> None:
        try:
            self._inbox.forget(inbox_ids)
        except SubagentControlError as exc:  # a leftover row harms nothing
            log.warning("%d forwarded messages: not forgotten (%s)", len(inbox_ids), exc.message)

    def _outcome(self, item: InboxItem, holder: str, posted: _Posted) -> dict[str, Any] | None:
        """The holder's answer; None if it died with the message untaken or unanswered
        (then it can no longer take or answer it: its late answer is dropped).

        Raises:
            SubagentControlError: ``NOT_DELIVERED`` if it did not take it in time.
        """
        inbox_id, child_id, woken = item.inbox_id, item.child_id, posted.woken
        take_by = time.monotonic() + TAKE_S
        poll_s = _FIRST_POLL_S
        while True:
            woken.wait(max(0.0, min(poll_s, take_by - time.monotonic())))
            woken.clear()
            poll_s = min(_POLL_S, poll_s * 2)
            with self._lock:
                heard = self._answers.pop(inbox_id, None)
            if heard is not None:
                return heard
            state, reply = self._inbox.state_of(inbox_id)
            if state is None and not posted.written:
                state = "pending"  # only its notification carries it: not taken yet
            if state == "answered" and reply is not None:
                return reply
            if state is None or state == "abandoned":  # never so while we wait; be safe
                return None
            if state == "pending":
                late = time.monotonic() >= take_by
                if not late and not self._runtime.is_dead_id(holder):
                    continue
                if self._inbox.take_back(item, target=holder):
                    if late:
                        raise _not_delivered(
                            child_id, f"runtime {holder} did not take it within {TAKE_S:g} s"
                        )
                    return None  # it died first: never delivered
                continue  # taken at the last moment: wait for its answer
            if state == "taken" and not self._runtime.is_dead_id(holder):
                take_by = time.monotonic() + _POLL_S  # only the poll bounds the wait now
                continue
            if self._inbox.abandon(inbox_id, state="taken"):
                return None
            # It answered at the last moment: read it on the next round.

    def _decide_without(self, inbox_id: str, child_id: str, holder: str) -> SendResult | None:
        """The holder died with the message: whether it was delivered is in the
        transcript, once the holder can no longer write to it. None: it was not."""
        self._runtime.sweep()  # its Tasks interrupted, its claims and fencing numbers gone
        events = self._store.load(child_id).events
        task_of_turn: dict[int, str] = {}
        for event in events:
            if event.kind == EventKind.TURN_START and isinstance(event.data, dict):
                task_of_turn[event.turn] = str(event.data.get("task_id"))
            if (
                event.kind == EventKind.STEERING_MESSAGE
                and isinstance(event.data, dict)
                and event.data.get("forwarded") == inbox_id
                and event.turn in task_of_turn
            ):
                return SendResult(route="steered", task_id=task_of_turn[event.turn])
        log.info("forwarded message %s: runtime %s ended before it delivered it", inbox_id, holder)
        return None

    # -- the holder's side ---------------------------------------------------------------

    def _on_reply(self, inbox_id: str, answer: dict[str, Any] | None) -> None:
        with self._lock:
            woken = self._waiting.get(inbox_id)
            if woken is not None and answer is not None:
                self._answers[inbox_id] = answer
        if woken is not None:
            woken.set()

    def _on_message(self, inbox_id: str, carried: InboxItem | None) -> None:
        # On a worker: taking and delivering wait for the database and the supervisor,
        # and the listener must keep hearing answers meanwhile.
        with contextlib.suppress(RuntimeError):  # closing: its sender takes it back
            self._workers.submit(self._take, inbox_id, carried)

    def _take(self, inbox_id: str, carried: InboxItem | None) -> None:
        try:
            item = self._inbox.take(inbox_id, self._runtime.id, carried)
            if item is None:
                # Its sender gave up on it first: never delivered. The row that refused this
                # take, the only one there is (one notification per message), is clutter
                # now, whether or not its sender lives to forget it.
                self._forget([inbox_id])
                return
            flight = _InFlight(item.child_id, item.sender_runtime, time.monotonic())
            with self._lock:
                self._serving[inbox_id] = flight
            try:
                reply = self._deliver(item)
                # `steered` only ever comes back once the steering record is written, and
                # that transaction answered it (`persistence.SqlStore.append`).
                if reply.get("route") != "steered" and not self._inbox.answer(
                    inbox_id, item.sender_runtime, reply
                ):
                    log.warning("forwarded message %s: answered after its sender left", inbox_id)
            finally:
                with self._lock:
                    self._serving.pop(inbox_id, None)
        except Exception:  # unanswered, its sender decides from the transcript
            log.exception("forwarded message %s: serving it failed", inbox_id)

    def _deliver(self, item: InboxItem) -> dict[str, Any]:
        if item.kind == "kill":
            task_id = str(item.source.get("task_id"))
            self._kill_here(task_id, str(item.source.get("reason")))
            # Not running here any more: it settled meanwhile, so there is nothing to kill.
            return {"route": "killed", "task_id": task_id}
        try:
            sent = self._serve(item)
        except SubagentControlError as exc:
            refusal: dict[str, Any] = {
                "code": exc.code.value, "message": exc.message, "task_id": exc.task_id
            }  # fmt: skip
            if (
                exc.code is ErrorCode.NOT_DELIVERED
                and self._inbox.holder_of(item.child_id) != self._runtime.id
            ):
                refusal["elsewhere"] = True  # not ours (any more): its sender routes it again
            return refusal
        except Exception as exc:
            return {
                "code": ErrorCode.INTERNAL.value,
                "message": f"internal error ({exc}); the message was not delivered",
                "task_id": None,
            }
        return {"route": sent.route, "task_id": sent.task_id}


def _answer_of(reply: dict[str, Any], child_id: str, holder: str) -> SendResult | None:
    if "route" in reply:
        return SendResult(route=reply["route"], task_id=reply["task_id"])
    if reply.get("elsewhere"):
        log.info("child %s: runtime %s no longer runs it; routing the message again",
                 child_id, holder)  # fmt: skip
        return None
    raise SubagentControlError(
        ErrorCode(reply["code"]),
        f"{reply['message']} (answered by runtime {holder}, which runs the child)",
        child_id=child_id,
        task_id=reply.get("task_id"),
    )


def _not_delivered(child_id: str, why: str) -> SubagentControlError:
    return SubagentControlError(
        ErrorCode.NOT_DELIVERED,
        f"child {child_id} runs in another runtime and {why}; the message was not "
        "delivered; retry it",
        child_id=child_id,
    )
