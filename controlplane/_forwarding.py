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
  (compare-and-set) and raises ``NOT_DELIVERED``; A can no longer take it. Meanwhile B
  notifies A again every `_NOTIFY_AGAIN_S`: A's listener may have missed the first
  notification while it was connecting again (a server restart, a dropped connection).
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
- The store fails while B waits (a restart, a failover: SPEC §9 "Outages"): a read that
  failed says nothing about the message, so B asks again — A's answer may also come
  as a notification once B's listener is back — for up to `TAKE_S` plus the store's
  retry budget, and reports only what the store shows: the answer, or ``NOT_DELIVERED``
  once its take-back stood. Past that bound, nobody can tell whether A took it:
  ``DURABILITY_FAILED`` (it may be in the transcript), never a failure to deliver.
  A's take is durable before the message reaches the run, and A answers every message
  it took however long the store takes to come back (`controlplane._forward_serving`).

A message that was not delivered because A does not run the child (any more) — A died, or
answered that it no longer holds the child — is handed back to the router
(`controlplane._router`) to route again (`forward` returns None): a resume here, a
takeover of a dead runtime's child, or a forward to the runtime that holds the child now.
Never both: it was not delivered anywhere.

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
from typing import TYPE_CHECKING, Any, TypeVar

from controlplane._forward_serving import InFlight, KillHere, Serve, Serving
from controlplane.contract import (
    ErrorCode,
    EventKind,
    ForwardedNode,
    MessageSource,
    SendResult,
    SubagentControlError,
    TaskSnapshot,
    TextBlock,
)
from persistence import InboxItem

if TYPE_CHECKING:
    from controlplane._runtime import Runtime
    from persistence import Inbox, Listener, SqlStore

__all__ = ["TAKE_S", "Forwarder"]

log = logging.getLogger(__name__)

_T = TypeVar("_T")

TAKE_S = 3.0
"""How long a forwarded message waits for its target to take it before it is taken back."""
_POLL_S = 0.25  # a lapsed target is seen this long after its lease at most (~3 reads)
_FIRST_POLL_S = 0.05  # a healthy forward is answered well before; a dead target is seen soon
_NOTIFY_AGAIN_S = 0.5
"""A message not taken this long after its last notification is notified again: its
target's listener may have been between two connections (it listens again 0.5 s after
its connection drops)."""
_READY_S = 10.0
_WORKERS = 8
_KNOWN = 4096
"""How many children's holders a runtime remembers (the least recently used go first)."""
_FORGET_BATCH = 32  # decided messages' rows, deleted together


@dataclass(slots=True)
class _Posted:
    woken: threading.Event
    written: bool = False
    """Whether the message went as a row (too long for a notification)."""
    unsent: SubagentControlError | None = None
    """Why posting it failed: it may still have gone out (a commit whose acknowledgement
    was lost), so it is taken back, or found taken, before anything is reported."""


class Forwarder:
    """This runtime's end of the forwarding: it sends messages to other runtimes and
    serves the ones they send here.

    It sends from its construction on, and serves once told where messages go (`listen`):
    what serves them (the router, this runtime's Task service) is built on this object, so
    it cannot be handed in here.

    Args:
        runtime: This runtime (its id, and whether another one is dead).
        store: The shared store (PostgreSQL: it has an inbox).
    """

    def __init__(self, runtime: Runtime, store: SqlStore) -> None:
        assert store.inbox is not None
        self._runtime = runtime
        self._store = store
        self._inbox: Inbox = store.inbox
        self._lock = threading.Lock()
        self._waiting: dict[str, threading.Event] = {}
        self._answers: dict[str, dict[str, Any]] = {}  # heard in notifications
        self._holders: OrderedDict[str, str] = OrderedDict()  # child id -> runtime id
        self._sending: dict[str, InFlight] = {}  # inbox id -> where it went
        self._decided: list[str] = []  # sent messages whose rows are left to forget
        self._workers = ThreadPoolExecutor(_WORKERS, thread_name_prefix="subagent-forwarded")
        self._serving: Serving | None = None
        self._listener: Listener | None = None

    def listen(self, serve: Serve, kill_here: KillHere) -> None:
        """Hear this runtime's notifications: answers to the messages it sent (before,
        a sender only polls for them) and messages other runtimes forward here, served by
        ``serve`` (a send, steer only) and ``kill_here`` (a kill of a Task of this runtime).

        Called once, when everything they reach exists.
        """
        assert self._listener is None, "listen is called once"
        runtime_id = self._runtime.id
        self._serving = Serving(runtime_id, self._inbox, self._workers, serve, kill_here)
        self._listener = self._inbox.listen(
            runtime_id, on_message=self._serving.on_message, on_reply=self._on_reply
        )
        if not self._listener.wait_ready(_READY_S):
            log.warning("runtime %s: not listening yet; messages to it wait", runtime_id)

    def stop_listening(self) -> None:
        """Take no more messages (close has begun); those taken are still answered
        (unless the store is failing: their senders then decide from the transcript)."""
        if self._serving is not None:
            self._serving.closing()
        if self._listener is not None:
            self._listener.close()

    def close(self) -> None:
        """Stop listening, wait for the messages being served to be answered, and forget
        the rows of the messages this runtime sent."""
        self.stop_listening()
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
        serving = self._serving.in_flight() if self._serving is not None else {}
        with self._lock:
            ends = [("sending", self._sending), ("serving", serving)]
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
            self._sending[inbox_id] = InFlight(item.child_id, holder, time.monotonic())
        try:
            try:
                posted.written = self._inbox.post(item, target=holder)
            except SubagentControlError as exc:
                if exc.code is not ErrorCode.STORE_UNAVAILABLE:
                    raise
                posted.unsent = exc
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

        A store that fails meanwhile (a restart, a failover) is asked again: a read that
        failed says nothing about the message, so it is never reported as its failure.

        Raises:
            SubagentControlError: ``NOT_DELIVERED`` if it did not take it in time (or
                ``STORE_UNAVAILABLE`` if posting it failed and it was taken back: never
                delivered either); ``DURABILITY_FAILED`` if the store stayed unreachable
                past the forwarding deadline plus its retry budget, so that nobody can
                tell whether the holder took it.
        """
        inbox_id, child_id, woken = item.inbox_id, item.child_id, posted.woken
        now = time.monotonic()
        # Posting failed: it may have gone out all the same, so take it back at once.
        take_by = now if posted.unsent is not None else now + TAKE_S
        ask = _Asking(child_id, holder, now + TAKE_S + self._store.retry_budget_s)
        notify_at, written = now + _NOTIFY_AGAIN_S, posted.written
        poll_s = _FIRST_POLL_S
        while True:
            woken.wait(max(0.0, min(poll_s, take_by - time.monotonic())))
            woken.clear()
            poll_s = min(_POLL_S, poll_s * 2)
            with self._lock:
                heard = self._answers.pop(inbox_id, None)
            if heard is not None:
                return heard
            read = ask(lambda: self._inbox.state_of(inbox_id))
            if read is None:
                continue  # the store failed: nothing learnt, ask again
            state, reply = read
            if state is None and not posted.written:
                state = "pending"  # only its notification carries it: not taken yet
            if state == "answered" and reply is not None:
                return reply
            if state is None or state == "abandoned":  # never so while we wait; be safe
                return None
            if state == "pending":
                late = time.monotonic() >= take_by
                if not late and not ask(lambda: self._runtime.is_dead_id(holder)):
                    if time.monotonic() >= notify_at:  # its listener may have missed it
                        ask(lambda: self._inbox.notify_again(item, target=holder, written=written))
                        notify_at = time.monotonic() + _NOTIFY_AGAIN_S
                    continue
                if not ask(lambda: self._inbox.take_back(item, target=holder)):
                    continue  # taken at the last moment (or unknown): wait for its answer
                if posted.unsent is not None:
                    raise posted.unsent  # taken back: it never went anywhere
                if late:
                    raise _not_delivered(
                        child_id, f"runtime {holder} did not take it within {TAKE_S:g} s"
                    )
                return None  # it died first: never delivered
            if state == "taken" and ask(lambda: self._runtime.is_dead_id(holder)) is not True:
                take_by = time.monotonic() + _POLL_S  # only the poll bounds the wait now
                continue
            if ask(lambda: self._inbox.abandon(inbox_id, state="taken")):
                return None
            # It answered at the last moment: read it on the next round.

    def _decide_without(self, inbox_id: str, child_id: str, holder: str) -> SendResult | None:
        """The holder died with the message: whether it was delivered is in the
        transcript, once the holder can no longer write to it. None: it was not."""
        give_up_at = time.monotonic() + self._store.retry_budget_s
        ask = _Asking(child_id, holder, give_up_at)
        pause = threading.Event()  # never set: a bounded pause between failed rounds
        # Its Tasks interrupted, its claims gone: only then can it write no more. The sweep
        # judges the holder again and may spare it (this runtime's own renewals broke
        # meanwhile: SPEC §9 Outages); the transcript read before it is fenced could miss
        # a record it commits after, and a delivered message be reported not delivered.
        while ask(self._runtime.sweep) is None or ask(lambda: self._holds(holder, child_id)) in (
            None,
            True,
        ):
            if time.monotonic() >= give_up_at:
                raise _unconfirmed(child_id, holder, _not_fenced(holder))
            pause.wait(_POLL_S)
        while (loaded := ask(lambda: self._store.load(child_id))) is None:
            pause.wait(_POLL_S)
        task_of_turn: dict[int, str] = {}
        for event in loaded.events:
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

    def _holds(self, holder: str, child_id: str) -> bool:
        """Whether ``holder`` still has a running Task of ``child_id`` in the store (and so
        its claim: it could still write)."""
        return any(t.child_id == child_id for t in self._store.ledger.running([holder]))

    # -- the holder's side ---------------------------------------------------------------

    def _on_reply(self, inbox_id: str, answer: dict[str, Any] | None) -> None:
        with self._lock:
            woken = self._waiting.get(inbox_id)
            if woken is not None and answer is not None:
                self._answers[inbox_id] = answer
        if woken is not None:
            woken.set()


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


class _Asking:
    """A sender's store calls once its message is posted: a call the store fails
    (``STORE_UNAVAILABLE`` after its own retries) answers None — nothing learnt, ask
    again — until ``give_up_at``, then raises `_unconfirmed`: whether the message was
    delivered is unknown, and it is never reported as not delivered."""

    __slots__ = ("_child_id", "_give_up_at", "_holder")

    def __init__(self, child_id: str, holder: str, give_up_at: float) -> None:
        self._child_id = child_id
        self._holder = holder
        self._give_up_at = give_up_at

    def __call__(self, call: Callable[[], _T]) -> _T | None:
        try:
            return call()
        except SubagentControlError as exc:
            if exc.code is not ErrorCode.STORE_UNAVAILABLE:
                raise
            if time.monotonic() >= self._give_up_at:
                raise _unconfirmed(self._child_id, self._holder, exc) from exc
            log.warning("child %s: a message forwarded to runtime %s awaits its outcome; "
                        "the store failed (%s), asking again", self._child_id, self._holder,
                        exc.message)  # fmt: skip
            return None


def _not_fenced(holder: str) -> SubagentControlError:
    return SubagentControlError(
        ErrorCode.STORE_UNAVAILABLE,
        f"runtime {holder} seemed dead but could not be fenced off in time",
    )


def _unconfirmed(child_id: str, holder: str, exc: SubagentControlError) -> SubagentControlError:
    return SubagentControlError(
        ErrorCode.DURABILITY_FAILED,
        f"child {child_id} runs in runtime {holder}, which may have taken the message, but "
        f"the store could not confirm it ({exc.message}); it may be in the child's "
        "transcript: look there before sending it again",
        child_id=child_id,
    )
