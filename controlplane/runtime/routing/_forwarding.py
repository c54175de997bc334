"""Routing across runtimes on PostgreSQL: a send to a child that another live runtime runs
is forwarded to it through the database.

The sender (runtime B) writes the message to the store's inbox and notifies the holder
(runtime A) in one transaction, then waits for A's answer. A's listener hands the message to
a worker, which takes it (compare-and-set: once taken, B can no longer take it back, only
give it up when A is dead) and hands it to a thread of its own that sends it to the child's
supervisor as a steer-only message (a delivery waits for its child; a take must not).
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
- The store fails while B waits (a restart, a failover): a read that
  failed says nothing about the message, so B asks again — A's answer may also come
  as a notification once B's listener is back — for up to `TAKE_S` plus the store's
  retry budget, and reports only what the store shows: the answer, or ``NOT_DELIVERED``
  once its take-back stood. Past that bound, nobody can tell whether A took it:
  ``DURABILITY_FAILED`` (it may be in the transcript), never a failure to deliver.
  A's take is durable before the message reaches the run, and A answers every message
  it took however long the store takes to come back
  (`controlplane.runtime.routing._forward_serving`).

A message that was not delivered because A does not run the child (any more) — A died, or
answered that it no longer holds the child — is handed back to the router
(`controlplane.runtime.routing._router`) to route again (`forward` returns None): a resume here, a
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
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from controlplane.contract import (
    ErrorCode,
    ForwardedNode,
    SubagentControlError,
)
from controlplane.runtime.routing._forward_answer import TAKE_S, AnswerFinder, Posted, answer_of
from controlplane.runtime.routing._forward_serving import InFlight, Serving
from controlplane.telemetry import Telemetry

if TYPE_CHECKING:
    from controlplane.contract import (
        MessageSource,
        SendResult,
        TaskSnapshot,
        TextBlock,
    )
    from controlplane.runtime.lease._runtime import Runtime
    from controlplane.runtime.routing._forward_serving import KillHere, Serve
    from persistence import Inbox, InboxItem, Listener, SqlStore

__all__ = ["TAKE_S", "Forwarder"]

log = logging.getLogger(__name__)

_READY_S = 10.0
_WORKERS = 8
_KNOWN = 4096
"""How many children's holders a runtime remembers (the least recently used go first)."""
_FORGET_BATCH = 32  # decided messages' rows, deleted together


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

    def __init__(
        self, runtime: Runtime, store: SqlStore, telemetry: Telemetry | None = None
    ) -> None:
        assert store.inbox is not None
        # Carries the trace context out (`traceparent`) and continues it in (delivering).
        self._telemetry = telemetry or Telemetry(runtime.id, enabled=False)
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
        self._finder = AnswerFinder(runtime, store, self._take_heard)

    def listen(self, serve: Serve, kill_here: KillHere) -> None:
        """Hear this runtime's notifications: answers to the messages it sent (before,
        a sender only polls for them) and messages other runtimes forward here, served by
        ``serve`` (a send, steer only) and ``kill_here`` (a kill of a Task of this runtime).

        Called once, when everything they reach exists.
        """
        assert self._listener is None, "listen is called once"
        runtime_id = self._runtime.id
        self._serving = Serving(
            runtime_id, self._inbox, self._workers, serve, kill_here, self._telemetry.delivering
        )
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
        if self._serving is not None:  # after the takes: each hands its delivery over
            self._serving.close()
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
        from persistence import InboxItem

        item = InboxItem(
            inbox_id=uuid.uuid4().hex,
            kind="send",
            child_id=child_id,
            sender_runtime=self._runtime.id,
            parent_session=parent_session,
            message=[block.model_dump(mode="json") for block in message],
            source={**source.model_dump(mode="json"), **self._telemetry.carrier()},
        )
        sent: SendResult | None = None
        try:
            with self._posted(item, holder) as posted:
                reply = self._finder.outcome(item, holder, posted)
            if reply is None:
                sent = self._finder.decide_without(item.inbox_id, child_id, holder)
            else:
                sent = answer_of(reply, child_id, holder)
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
        from persistence import InboxItem

        holder = task.runtime_id or ""
        item = InboxItem(
            inbox_id=uuid.uuid4().hex,
            kind="kill",
            child_id=task.child_id or "",
            sender_runtime=self._runtime.id,
            parent_session=task.owner_session,
            message=[],
            source={"task_id": task.id, "reason": reason, **self._telemetry.carrier()},
        )
        with self._posted(item, holder) as posted:
            try:
                reply = self._finder.outcome(item, holder, posted)
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
    def _posted(self, item: InboxItem, holder: str) -> Iterator[Posted]:
        """Post ``item`` to ``holder`` and wait for its answer while the block runs;
        forget the row after it."""
        inbox_id = item.inbox_id
        posted = Posted(threading.Event())
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
            # A row given up stays: it refuses the holder's late take (see `Inbox.forget`).
            self._inbox.forget(inbox_ids, keep_abandoned=True)
        except SubagentControlError as exc:  # a leftover row harms nothing
            log.warning("%d forwarded messages: not forgotten (%s)", len(inbox_ids), exc.message)

    # -- the listener's side -------------------------------------------------------------

    def _take_heard(self, inbox_id: str) -> dict[str, Any] | None:
        """The answer to ``inbox_id`` heard in a notification, taken once (`AnswerFinder`)."""
        with self._lock:
            return self._answers.pop(inbox_id, None)

    def _on_reply(self, inbox_id: str, answer: dict[str, Any] | None) -> None:
        with self._lock:
            woken = self._waiting.get(inbox_id)
            if woken is not None and answer is not None:
                self._answers[inbox_id] = answer
        if woken is not None:
            woken.set()
