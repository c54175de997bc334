"""Forwarding between runtimes on PostgreSQL: the inbox rows and the LISTEN connection
(routing across runtimes).

A runtime sending to a child that another live runtime runs notifies that runtime with the
message in the notification; the target takes it by writing its inbox row as ``taken``
(insert-if-absent: the row's key is the message's id), so a message whose sender gave up
first (it wrote the row as ``abandoned``) can never be delivered late. A message too long
for a notification (PostgreSQL's 8000 bytes) is written as a ``pending`` row first, and the
notification only names it; taking it is then compare-and-set (``pending`` → ``taken``).
The target writes its answer in one transaction: for a message it steered, the transaction
that writes the steering record (`Inbox.insert_answering`, in the record's own statement,
or `Inbox.answer_steered` after a batch of records; both run by `SqlStore.append`), so the
record and its answer commit together or not at all; for a refusal or a kill, one of its
own (`Inbox.answer`). Notifications about answers only wake the sender up: every decision
reads the row, so a lost notification costs time, never a message (a lost message is taken
back, not delivered).

No write transaction notifies. PostgreSQL serializes the commits of every transaction
that notifies, cluster-wide, under one lock held through the commit's WAL flush, so a
``pg_notify`` in a write makes every forwarding runtime queue behind every other one's
flush. A wake-up is sent after its write commits, as a statement of its own (`Inbox.wake`)
that writes nothing and so waits for no flush.

Each other operation is one statement, its own transaction (the store's PostgreSQL
connections are in autocommit). Forgetting rows and posting a long message commit without
waiting for the WAL flush (``synchronous_commit`` off for that transaction): a database
crash that loses one leaves the row in an earlier state, which every reader handles (a
post lost is never taken, so never delivered). A take and a refusal must survive a crash
of the database server that the runtimes outlive, and wait for their flush: a take is
followed by a delivery into the run, an effect outside the database (a take lost with the
server would let the sender take the message back, ``NOT_DELIVERED``, while the run has
it), and a refusal lost would leave its sender waiting on a ``taken`` row for as long as
the target lives. The steering record (and the answer written with it) is committed with
a normal commit by the target's transcript. Giving a message up (`Inbox.take_back`,
`Inbox.abandon`) is rare and decides a ``NOT_DELIVERED``: it waits for its flush as usual.

Each runtime listens on one channel derived from its id, on a connection of its own, in
one thread (`Listener`); what it hears is handed to a callback that must not block.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from controlplane.contract import ErrorCode, SubagentControlError
from persistence._inbox_sql import CHANNEL_HEX, CHANNEL_PREFIX, InboxStatements
from persistence._listening import Listening

if TYPE_CHECKING:
    from sqlalchemy.engine.interfaces import DBAPICursor

    from persistence._database import Database
    from persistence._port import StorePort

__all__ = ["Inbox", "InboxItem", "Listener", "WakeUp", "channel_of", "steered_answer"]

log = logging.getLogger(__name__)


MESSAGE = "m"
"""Notification kind: a message waits in the inbox for the listening runtime."""
REPLY = "r"
"""Notification kind: the answer to a message the listening runtime forwarded is in."""

WakeUp = tuple[str, str]
"""A notification to send once its transaction has committed: (channel, payload)."""


def channel_of(runtime_id: str) -> str:
    """The NOTIFY channel of a runtime: short (PostgreSQL allows 63 bytes) and a plain
    identifier whatever the runtime id holds (a host name may have dots or capitals)."""
    return CHANNEL_PREFIX + hashlib.sha256(runtime_id.encode()).hexdigest()[:CHANNEL_HEX]


def steered_answer(task_id: str) -> dict[str, Any]:
    """The answer to a forwarded message the target steered into its Task ``task_id``, as
    the forwarding (`controlplane.runtime.routing._forwarding`) writes and reads every answer."""
    return {"route": "steered", "task_id": task_id}


@dataclass(frozen=True, slots=True)
class InboxItem:
    """A forwarded message, as its target took it."""

    inbox_id: str
    kind: str
    """``send`` (a message to steer with) or ``kill`` (``source`` names the Task)."""
    child_id: str
    sender_runtime: str
    parent_session: str
    message: list[dict[str, Any]]
    source: dict[str, Any]

    def carried(self) -> str:
        """The item as the JSON a notification carries (its id travels beside it)."""
        return json.dumps(
            [self.kind, self.child_id, self.sender_runtime, self.parent_session,
             self.message, self.source]
        )  # fmt: skip

    @classmethod
    def from_carried(cls, inbox_id: str, text: str) -> InboxItem:
        """The item a notification carried (`carried`)."""
        kind, child_id, sender, parent_session, message, source = json.loads(text)
        return cls(inbox_id, kind, child_id, sender, parent_session, message, source)


class Inbox:
    """The store's inbox operations (PostgreSQL only); each is one short transaction."""

    def __init__(self, port: StorePort) -> None:
        self._s = port
        sql = port.sql.inbox
        assert sql is not None  # the inbox is PostgreSQL's, and so are its statements
        self._sql: InboxStatements = sql

    def post(self, item: InboxItem, *, target: str) -> bool:
        """Send ``item`` to ``target``: in the notification alone when it fits (nothing
        is written; the target writes the row as it takes it), else as a ``pending`` row
        and a notification naming it. Whether a row was written."""
        notice = _notice(item, written=False)
        written = len(notice) >= _PAYLOAD_LIMIT

        def op(_attempt: int) -> None:
            with self._s.db.cursor(write=False) as cursor:  # each statement: autocommit
                if not written:
                    cursor.execute(self._sql.notify, (channel_of(target), notice))
                    return
                cursor.execute(
                    self._sql.post,
                    (item.inbox_id, item.kind, item.child_id, target, item.sender_runtime,
                     item.parent_session, json.dumps(item.message), json.dumps(item.source)),
                )  # fmt: skip
                if cursor.fetchone() is not None:  # written now (committed): wake it
                    cursor.execute(
                        self._sql.notify, (channel_of(target), _notice(item, written=True))
                    )

        self._s.run(f"forward a message to runtime {target}", op)
        return written

    def notify_again(self, item: InboxItem, *, target: str, written: bool) -> None:
        """Notify ``target`` of a posted ``item`` once more, as `post` did (its listener
        may have missed that: it listens again only after a pause when its connection
        drops, e.g. with a server restart). Taking it stays once: the take is
        compare-and-set, and the target takes a message it was notified of twice once."""
        notice = _notice(item, written=written)

        def op(_attempt: int) -> None:
            with self._s.db.cursor(write=False) as cursor:  # writes nothing: autocommit
                cursor.execute(self._sql.notify, (channel_of(target), notice))

        self._s.run(f"forward a message to runtime {target} again", op)

    def take(
        self, inbox_id: str, runtime_id: str, carried: InboxItem | None = None
    ) -> InboxItem | None:
        """Take a message addressed to ``runtime_id`` — the one the notification
        ``carried``, or else its ``pending`` row; None if its sender gave it up, or it was
        taken already."""

        def op(attempt: int) -> tuple[Any, ...] | None:
            # A retry also finds it 'taken': our first attempt may have committed, unheard
            # (one notification per message, so nobody else takes it twice).
            with self._s.db.cursor(write=False) as cursor:  # one statement: autocommit
                if carried is None:
                    states = ("pending", "taken") if attempt > 1 else ("pending", "pending")
                    cursor.execute(self._sql.take, (inbox_id, runtime_id, *states))
                else:
                    cursor.execute(
                        self._sql.take_carried_again if attempt > 1 else self._sql.take_carried,
                        (inbox_id, carried.kind, carried.child_id, runtime_id,
                         carried.sender_runtime, carried.parent_session,
                         json.dumps(carried.message), json.dumps(carried.source)),
                    )  # fmt: skip
                row = cursor.fetchone()
            return None if row is None else tuple(row)

        row = self._s.run(f"take forwarded message {inbox_id}", op)
        if row is None:
            return None
        if carried is not None:
            return carried
        kind, child_id, sender, parent_session, message, source = row
        return InboxItem(
            inbox_id=inbox_id,
            kind=kind,
            child_id=child_id,
            sender_runtime=sender,
            parent_session=parent_session,
            message=json.loads(message),
            source=json.loads(source),
        )

    def answer(self, inbox_id: str, reply: dict[str, Any]) -> bool:
        """Record the answer to a taken message and notify its sender, in one
        transaction; False if the sender no longer waits for it (it decided without), or
        the message has another answer already: a steering record whose commit went
        unheard answered it ``steered``, and that answer is the truth, never replaced."""
        text = json.dumps(reply)
        payload = _reply_payload(inbox_id, text)

        def op(_attempt: int) -> bool:
            with self._s.db.cursor(write=False) as cursor:  # each statement: autocommit
                cursor.execute(self._sql.answer, (text, inbox_id, text))
                row = cursor.fetchone()
                if row is not None:  # committed: wake its sender
                    cursor.execute(self._sql.notify, (channel_of(row[0]), payload))
                return row is not None

        return self._s.run(f"answer forwarded message {inbox_id}", op)

    def answer_steered(
        self, cursor: DBAPICursor, steered: Sequence[tuple[str, str]]
    ) -> list[WakeUp]:
        """Inside the caller's transaction — the append that writes the steering records
        of forwarded messages — answer each (inbox id, Task id) `steered_answer`: the
        answer and the record commit together or not at all. Returns the wake-ups of
        their senders, for `wake` once that transaction has committed.

        A message its sender gave up meanwhile (its target looked dead: the row is
        ``abandoned``) keeps its row as it is, as `answer` would: the sender decides from
        the transcript once the target can no longer write, and finds the record or not.

        Raises:
            SubagentControlError: ``NOT_DELIVERED`` if a message was answered otherwise
                first (its holder could not deliver it: `answer`), or its row is gone (its
                sender decided and forgot it): its record must not be written, and the
                caller's transaction, rolled back, writes nothing.
        """
        wakeups: list[WakeUp] = []
        for inbox_id, task_id in steered:
            text, payload = _steered_params(inbox_id, task_id)
            cursor.execute(self._sql.answer_steered, (text, inbox_id))
            fetched = cursor.fetchone()
            if fetched is None:
                _refuse_unless_abandoned(cursor, self._sql.state, inbox_id)
            _answered(wakeups, inbox_id, None if fetched is None else fetched[0], payload)
        return wakeups

    def insert_answering(
        self, cursor: DBAPICursor, row: Sequence[object], steered: tuple[str, str]
    ) -> list[WakeUp]:
        """`answer_steered` of one message, folded into the statement that inserts its
        steering record (one event's INSERT, with its parameters ``row``): a forwarded
        steer's record then costs the holder no round trip more than a local steer's.

        Raises:
            SubagentControlError: ``NOT_DELIVERED``, as `answer_steered` does.
        """
        inbox_id, task_id = steered
        text, payload = _steered_params(inbox_id, task_id)
        cursor.execute(self._sql.inserting, (text, inbox_id, *row))
        fetched = cursor.fetchone()
        sender = None if fetched is None else fetched[0]
        if sender is None:  # the row was not ``taken``: the record stands only if abandoned
            _refuse_unless_abandoned(cursor, self._sql.state, inbox_id)
        wakeups: list[WakeUp] = []
        _answered(wakeups, inbox_id, sender, payload)
        return wakeups

    def wake(self, wakeups: Sequence[WakeUp]) -> None:
        """Send the wake-ups of answers whose transaction has committed, in one statement
        that writes nothing (no lock shared with other runtimes' commits, no flush).

        Best effort: a wake-up lost to a failing store costs its sender a poll, never a
        message (it reads the row), so a failure here is logged, not raised.
        """
        if not wakeups:
            return
        channels = [channel for channel, _payload in wakeups]
        payloads = [payload for _channel, payload in wakeups]
        try:
            with self._s.db.cursor(write=False) as cursor:
                cursor.execute(self._sql.wake, (channels, payloads))
        except self._s.db.errors as exc:
            log.info("could not wake %d sender(s) of answers: %s", len(wakeups), exc)

    def take_back(self, item: InboxItem, *, target: str) -> bool:
        """Give a message up if its target has not taken it (its row is absent or
        ``pending``): written ``abandoned``, it can never be taken. Whether this call did
        (False: it was taken first)."""

        def op(_attempt: int) -> bool:
            with self._s.db.cursor(write=False) as cursor:  # one statement: autocommit
                cursor.execute(
                    self._sql.take_back,
                    (item.inbox_id, item.kind, item.child_id, target, item.sender_runtime,
                     item.parent_session, json.dumps(item.message), json.dumps(item.source)),
                )  # fmt: skip
                return cursor.fetchone() is not None

        return self._s.run(f"take back forwarded message {item.inbox_id}", op)

    def abandon(self, inbox_id: str, *, state: str) -> bool:
        """Give a message up if it is still in ``state`` (``taken``: its target is dead);
        whether this call did."""

        def op(_attempt: int) -> bool:
            with self._s.db.cursor(write=False) as cursor:  # one statement: autocommit
                cursor.execute(self._sql.abandon, (inbox_id, state))
                return cursor.rowcount == 1

        return self._s.run(f"abandon forwarded message {inbox_id}", op)

    def state_of(self, inbox_id: str) -> tuple[str | None, dict[str, Any] | None]:
        """The message's state and answer (None, None while it has no row: before a
        notified message is taken, and once it is forgotten)."""

        def op(_attempt: int) -> tuple[str | None, dict[str, Any] | None]:
            with self._s.db.cursor(write=False) as cursor:
                cursor.execute(self._sql.state, (inbox_id,))
                row = cursor.fetchone()
            if row is None:
                return None, None
            return row[0], None if row[1] is None else json.loads(row[1])

        return self._s.run(f"read forwarded message {inbox_id}", op)

    def forget(self, inbox_ids: list[str], *, keep_abandoned: bool = False) -> None:
        """Delete the rows of messages whose senders have their outcomes.

        ``keep_abandoned``: the sender's forgetting keeps the rows it gave up (taken back,
        or abandoned on a dead holder): such a row is what refuses a late take, and a
        notification or a take that sat in a partition reaches the holder long after its
        sender was told ``NOT_DELIVERED``. The holder deletes it once its take was refused
        (or the expiry once the holder is gone)."""
        statement = self._sql.forget_decided if keep_abandoned else self._sql.forget

        def op(_attempt: int) -> None:
            with self._s.db.cursor(write=False) as cursor:  # one statement: autocommit
                cursor.execute(statement, (inbox_ids,))

        self._s.run(f"forget {len(inbox_ids)} forwarded message(s)", op)

    def expire(self, gone: list[str]) -> int:
        """Delete the rows whose senders are dead for good (``gone``, or no longer in the
        store): nobody waits for their outcome. An ``abandoned`` row stays while its target
        may still take the message its notification carried: the row is what refuses that
        late take, and its sender was told ``NOT_DELIVERED``. How many went."""

        def op(_attempt: int) -> int:
            with self._s.db.cursor(write=False) as cursor:  # one statement: autocommit
                cursor.execute(self._sql.expire, (gone, gone))
                return int(cursor.rowcount)

        return self._s.run(f"expire the inbox rows of {len(gone)} dead runtime(s)", op)

    def holder_of(self, child_id: str) -> str | None:
        """The runtime whose claim the child carries now (None: unclaimed or unknown)."""

        def op(_attempt: int) -> str | None:
            with self._s.db.cursor(write=False) as cursor:
                cursor.execute(self._s.sql.children.holder, (child_id,))
                row = cursor.fetchone()
            return None if row is None else row[0]

        return self._s.run(f"read the claim of child {child_id}", op)

    def listen(
        self,
        runtime_id: str,
        *,
        on_message: Callable[[str, InboxItem | None], None],
        on_reply: Callable[[str, dict[str, Any] | None], None],
    ) -> Listener:
        """Start listening on ``runtime_id``'s channel. For each notification, on the
        listener's thread, ``on_message(inbox_id, carried)`` (a message waits to be
        taken: the one the notification carried, None if it is in its ``pending`` row) or
        ``on_reply(inbox_id, answer)`` (an answer is in; None if it did not fit into the
        notification); neither may block."""
        return Listener(self._s.db, channel_of(runtime_id), on_message, on_reply)


_PAYLOAD_LIMIT = 7000  # PostgreSQL's is 8000 bytes; JSON text here is mostly ASCII


def _notice(item: InboxItem, *, written: bool) -> str:
    """The notification of a posted message: it carries the message, or names its row."""
    if written:
        return f"{MESSAGE}:{item.inbox_id}"
    return f"{MESSAGE}:{item.inbox_id}:{item.carried()}"


def _steered_params(inbox_id: str, task_id: str) -> tuple[str, str]:
    """The reply text of a steered message, and its wake-up's payload."""
    text = json.dumps(steered_answer(task_id))
    return text, _reply_payload(inbox_id, text)


def _refuse_unless_abandoned(cursor: DBAPICursor, state_sql: str, inbox_id: str) -> None:
    """Inside a steering record's transaction, whose answer found its row no longer
    ``taken``: the record may still be written if its sender gave the message up
    (``abandoned``: it decides from the transcript); answered otherwise, or gone, the
    message was not delivered, and its record must never be.

    Exactly once or not delivered: the holder answers a message it cannot deliver
    ``NOT_DELIVERED`` (`Inbox.answer`) while a write of its record may still be on its way
    (abandoned at fencing, its bytes held by the network). The row decides which came
    first: the answer's UPDATE and this transaction's wait for each other's row lock.
    """
    cursor.execute(state_sql, (inbox_id,))
    row = cursor.fetchone()
    if row is not None and row[0] == "abandoned":
        return
    state = "gone (its sender decided and forgot it)" if row is None else f"answered {row[1]}"
    raise SubagentControlError(
        ErrorCode.NOT_DELIVERED,
        f"forwarded message {inbox_id} is {state}: its steering record is not written; "
        "the message was not delivered",
    )


def _answered(wakeups: list[WakeUp], inbox_id: str, sender: str | None, payload: str) -> None:
    """Add the wake-up of an answered message's sender (None: nobody waits for it)."""
    if sender is None:
        log.warning("forwarded message %s: answered after its sender left", inbox_id)
    else:
        wakeups.append((channel_of(sender), payload))


def _reply_payload(inbox_id: str, text: str) -> str:
    """The notification of an answer: it rides along when it fits (saving the sender a
    read); the row holds it either way."""
    return f"{REPLY}:{inbox_id}" + (f":{text}" if len(text) < _PAYLOAD_LIMIT else "")


class Listener:
    """One thread with its own connection, listening on one channel (`Listening`: a
    notification missed while it reconnects only delays its waiter)."""

    def __init__(
        self,
        db: Database,
        channel: str,
        on_message: Callable[[str, InboxItem | None], None],
        on_reply: Callable[[str, dict[str, Any] | None], None],
    ) -> None:
        self._on_message = on_message
        self._on_reply = on_reply
        self.listening = Listening(db, channel, self._heard, name=f"{channel}-listener")

    def wait_ready(self, timeout_s: float) -> bool:
        """Wait until it listens (a message posted before that would go unheard)."""
        return self.listening.ready.wait(timeout_s)

    def close(self) -> None:
        """Stop listening and wait for the thread (at most one poll interval)."""
        self.listening.close()

    def _heard(self, payload: str) -> None:
        kind, _, rest = payload.partition(":")
        inbox_id, _, body = rest.partition(":")
        if kind == MESSAGE:
            self._on_message(inbox_id, InboxItem.from_carried(inbox_id, body) if body else None)
        elif kind == REPLY:
            self._on_reply(inbox_id, json.loads(body) if body else None)
