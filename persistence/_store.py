"""`SqlStore`: child headers and append-only transcripts in SQLite or PostgreSQL."""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from contextlib import AbstractContextManager
from types import TracebackType
from typing import Any, TypeVar

from sqlalchemy import Select, select

from controlplane.contract import (
    ChildMeta,
    ErrorCode,
    LoadedSession,
    MessageSource,
    NewEvent,
    SessionEvent,
    SubagentControlError,
    TaskSnapshot,
    seconds_problem,
    utcnow,
)
from persistence._appends import Appends, not_found
from persistence._approvals import ApprovalBook
from persistence._backend import LOCK_TIMEOUT_S, STATEMENT_TIMEOUT_S, ConnectionSettings
from persistence._claims import Claims, IsDead, Recoverable, Recovered
from persistence._codec import (
    SteeringRecord,
    check_child_id,
    construct,
    decode_events,
    gc_paused,
    prepare_events,
    prepare_meta,
)
from persistence._database import Database
from persistence._deadlines import abandon_waits, abandoning, call_deadline, cut_waits_begun_before
from persistence._id_prefix import KEPT_SINCE, prefix_query
from persistence._inbox import Inbox
from persistence._ledger import TaskLedger
from persistence._listening import refresh_listeners
from persistence._migrations import check_schema, ensure_schema
from persistence._overview import StoreOverview
from persistence._port import StorePort, next_batch
from persistence._queue import AdmissionQueue
from persistence._retry import Retrier, RetryListener, RetryPolicy
from persistence._schema import (
    NEWEST_TASK_SINCE,
    RECOVERIES_SINCE,
    SCHEMA_VERSION,
    SEGMENTS_SINCE,
    SPEND_SINCE,
    child_meta,
    children_table,
    utc_time,
)
from persistence._sessions import end_sessions_of, name_sessions
from persistence._spend import SpendLedger
from persistence._takeable import Takeable
from persistence._task_sql import Fence, Settlement, TxStep
from persistence._transcripts import TranscriptCache

__all__ = ["SqlStore"]

T = TypeVar("T")


class SqlStore:
    """The durable store of child sessions: headers and append-only transcripts.

    SQLite is the embedded default (``sqlite:///state.db``: WAL, busy timeout, foreign
    keys); ``postgresql+psycopg://…`` serves shared deployments with no code change. The
    schema is created on open and carries a version. Each operation is one short
    transaction, retried on transient failures by one `RetryPolicy`; a retried write is
    never applied twice. One store may be shared by many threads.

    An append writes one row per event. The append that writes a ``turn/end`` also seals
    the child's open rows into segment rows (`persistence._schema.segments_table`), so a
    resume reads one row per finished turn; a sealed event reads back unchanged.

    Errors are always `SubagentControlError`: ``INVALID_INPUT`` (nothing written),
    ``CHILD_NOT_FOUND``, ``CHILD_EXISTS``, ``STORE_UNAVAILABLE`` (the database failed, or
    kept failing after the retries), ``CLOSED``.

    Test seam: ``_after_commit`` is None, or a callable run right after each `append` or
    `create_child` commits, inside the retried attempt. A test makes it raise a transient
    database error to act out a commit whose acknowledgement was lost.

    Args:
        url: A SQLAlchemy URL: ``sqlite:///path``, ``sqlite://`` (in memory, one
            connection) or ``postgresql+psycopg://user@host/db``.
        retry: How to retry transient failures; `RetryPolicy()` by default.
        read_only: Read the store as it is, for inspection: no table is created, an older
            store is not migrated, and `create_child` and `append` refuse with
            ``INVALID_INPUT``. A database without a store is ``STORE_NOT_FOUND``.
        lock_timeout_s: The longest any statement waits for a lock held by another
            connection (PostgreSQL ``lock_timeout``, e.g. an append behind a stuck
            transaction that holds the child's row; SQLite's busy timeout, behind another
            process's write). Past it the attempt fails transiently and `retry` decides,
            so an operation ends within about ``retry.max_total_s`` plus two bounds,
            ``STORE_UNAVAILABLE`` if the lock is still held. Default 5 s.
        statement_timeout_s: The longest any statement runs on PostgreSQL
            (``statement_timeout``), lock waits included; past it the attempt fails
            transiently, reads too. SQLite has no such bound: there a statement waits
            only for locks, bounded by ``lock_timeout_s``. Default 30 s.
            A URL that sets these itself (SQLite ``?timeout=``, PostgreSQL
            ``options=-c lock_timeout=…``) overrides them.
        durable_os_crash: SQLite only: ``PRAGMA synchronous=FULL`` on every connection,
            so a committed write, a steer's record included, survives an OS crash or a
            power loss, at the cost of an fsync of the WAL per commit. The default,
            ``synchronous=NORMAL`` in WAL mode, survives a crash of the process but may
            lose the last commits to an OS crash or a power loss. No effect on
            PostgreSQL, where a commit is durable once acknowledged unless the server
            is configured otherwise (``synchronous_commit=off``, ``fsync=off``).
        pause_gc_on_load: Turn Python's cyclic garbage collector off while `load` decodes
            a transcript (it is restored when the last overlapping load ends, and only if
            it was on). A long transcript allocates tens of thousands of containers, which
            would otherwise trigger collections that scan them again; but the collector
            is process-wide, so this also pauses it for the host's other threads while a
            load runs. Off by default.
    """

    def __init__(
        self,
        url: str,
        *,
        retry: RetryPolicy | None = None,
        read_only: bool = False,
        lock_timeout_s: float = LOCK_TIMEOUT_S,
        statement_timeout_s: float = STATEMENT_TIMEOUT_S,
        durable_os_crash: bool = False,
        pause_gc_on_load: bool = False,
    ) -> None:
        if retry is not None and not isinstance(retry, RetryPolicy):
            raise SubagentControlError(
                ErrorCode.INVALID_INPUT, f"retry must be a RetryPolicy, not {type(retry).__name__}"
            )
        _check_seconds("lock_timeout_s", lock_timeout_s)
        _check_seconds("statement_timeout_s", statement_timeout_s)
        _check_flag("durable_os_crash", durable_os_crash)
        _check_flag("pause_gc_on_load", pause_gc_on_load)
        settings = ConnectionSettings(
            lock_timeout_s=lock_timeout_s,
            statement_timeout_s=statement_timeout_s,
            durable_os_crash=durable_os_crash,
        )
        self._db = Database(url, settings)
        self._retry = retry or RetryPolicy()
        self._retrier = Retrier(self._retry, self._db.errors)
        self._closed = False
        self._read_only = read_only
        self._after_commit: Callable[[], None] | None = None
        self._pause_gc = pause_gc_on_load
        # What the last loads decoded: a load of a kept child reads only what came after.
        self._transcripts = TranscriptCache()
        self._version = SCHEMA_VERSION  # what `_open` leaves; `_check` reads the real one
        port = self._port = StorePort(
            self._db, run=self._run, committed=self._committed, read_only=read_only
        )
        self._appends = port.appends = Appends(port)
        self._claims = Claims(port)
        self.inbox = port.inbox = Inbox(port) if self._db.sql.dialect.notifies else None
        """Messages forwarded between runtimes (PostgreSQL; None on SQLite, which forwards none)."""
        self.ledger = port.ledger = TaskLedger(self._db, self._run, self._claims.settle)
        """The store's Tasks and runtimes."""
        self.spend = port.spend = SpendLedger(self._db, self._run)
        """What each child, its ancestors and its session spent, and their budgets:
        counted by `append` from the usage its events record."""
        self.queue = AdmissionQueue(port)
        """The durable FIFO queue of concurrency limits."""
        self.approvals = ApprovalBook(port)
        """Approval requests and their answers."""
        self.overview = StoreOverview(self._db, self._run)
        """Whole-store reads for a view of every child at once (the console)."""
        self.takeable = Takeable(port)
        """Wake-ups for Tasks a runtime with their provider can take."""
        try:
            self._run("open the store", self._check if read_only else self._open)
            if not read_only:  # read-only: no write ever takes the one connection open
                self._run("open the store", lambda _attempt: self._db.open_reader())
        except BaseException:
            self._db.close()
            raise

    @property
    def url(self) -> str:
        """The store's URL, password hidden (safe to log)."""
        return self._db.url

    @property
    def retry_budget_s(self) -> float:
        """How long an operation keeps retrying a failing database (the retry policy's
        ``max_total_s``): the longest outage it rides through."""
        return self._retry.max_total_s

    def on_retry(self, listener: RetryListener) -> None:
        """Call ``listener(action, failed_attempt, cause)`` before every retry of a transient
        failure from now on (the control plane counts and logs them); it must not raise."""
        self._retrier.add_listener(listener)

    def create_child(
        self,
        meta: ChildMeta,
        events: Iterable[NewEvent | Mapping[str, Any]] = (),
        *,
        claim: tuple[str, str] | None = None,
    ) -> list[SessionEvent]:
        """Write a child's header and its first events in one transaction.

        ``claim`` (runtime id, Task id) writes the child claimed by that runtime for its
        first turn, under fencing number 1.

        The control plane publishes a child this way (header, seed, turn-1 frame), so a
        child is never durable without them. ``meta.seed_length`` counts the leading
        ``events`` that are the seed.

        Returns:
            The stored events, ``seq`` from 1.

        Raises:
            SubagentControlError: ``CHILD_EXISTS`` when the child id is taken;
                ``INVALID_INPUT`` for a bad header or event (nothing written).
        """
        if self._read_only:
            raise _read_only("create a child")
        meta = prepare_meta(meta)
        pending = prepare_events(events)
        if meta.seed_length > len(pending):
            raise SubagentControlError(
                ErrorCode.INVALID_INPUT,
                f"seed_length is {meta.seed_length} but only {len(pending)} events were "
                "given; pass the seed events with the header",
                child_id=meta.child_id,
            )
        batch, created_at = next_batch(), utcnow()
        return self._run(
            f"create child {meta.child_id}",
            lambda attempt: self._appends.create(meta, pending, batch, created_at, attempt, claim),
        )

    def append(
        self,
        child_id: str,
        events: Iterable[NewEvent | Mapping[str, Any] | SteeringRecord],
        *,
        settle: Settlement | None = None,
        fence: Fence | None = None,
        answer_steered: Sequence[tuple[str, str]] = (),
        seconds: float = 0.0,
        also: TxStep | None = None,
    ) -> list[SessionEvent]:
        """Append a batch of events to a child's transcript, all or nothing.

        ``events`` are `NewEvent` values or mappings with ``kind``, ``turn``, ``data``
        and optional ``source``, or the records `persistence.steering_record` made (a
        steer's, checked and serialised where the steer was taken: written as they
        are). Concurrent appends to one child are serialized: ``seq`` stays gapless and
        each batch stays contiguous.

        ``settle`` writes a running Task's settlement in the same transaction (the turn's
        ``turn/end`` and its Task's outcome are never apart), and releases the claim.
        ``fence`` (runtime id, fencing number) makes the append conditional on the writer
        still holding the child's claim: otherwise it raises ``FENCED``, writing nothing.
        ``answer_steered`` lists (inbox id, Task id) of forwarded messages whose steering
        records these events are: each one's inbox row is answered ``steered``
        into that Task, and its sender notified, in the same transaction (for a single
        record, in the statement that inserts it: `persistence._inbox.Inbox`). PostgreSQL
        only: SQLite has no inbox, and refuses it with ``INVALID_INPUT``.

        The spend the events record (each one's ``data["usage"]``) and ``seconds`` (the
        wall-clock time of a turn, given with its ``turn/end``) are counted in the same
        transaction for the child and every scope above it (`SpendLedger`).

        ``also`` runs inside the same transaction, under the child's lock and after the
        claim check, with the transaction's cursor (an approval's row and its Task's
        status go with its event: `persistence._approvals`); what it raises undoes the
        whole append.

        Returns:
            The stored events, with their ``seq`` and ``created_at``.

        Raises:
            SubagentControlError: ``CHILD_NOT_FOUND``; ``INVALID_INPUT`` for a bad event
                (nothing written); ``STORE_UNAVAILABLE`` after the retries.
        """
        if self._read_only:
            raise _read_only(f"append to child {child_id!r}")
        child_id = check_child_id(child_id)
        pending = prepare_events(events)
        if seconds != 0:
            _check_seconds("seconds", seconds)
        if answer_steered and self.inbox is None:
            raise _unanswerable(child_id, "this store has no inbox (forwarding is PostgreSQL's)")
        if answer_steered and not pending:
            raise _unanswerable(child_id, "no steering record is written with the answers")
        if not pending:
            self._run(f"find child {child_id}", lambda _attempt: self._require(child_id))
            return []
        batch, created_at = next_batch(), utcnow()
        return self._run(
            f"append to child {child_id}",
            lambda attempt: self._appends.append(
                child_id,
                pending,
                batch,
                created_at,
                attempt,
                settle,
                fence,
                answer_steered,
                seconds,
                also,
            ),
        )

    def load(self, child_id: str) -> LoadedSession:
        """A child's header and whole transcript, oldest event first.

        Raises:
            SubagentControlError: ``CHILD_NOT_FOUND``; ``STORE_UNAVAILABLE``.
        """
        child_id = check_child_id(child_id)
        return self._run(f"load child {child_id}", lambda _attempt: self._load(child_id))

    def list_children(self, parent_session: str | None = None) -> list[ChildMeta]:
        """The headers of ``parent_session``'s children (all children for None), oldest
        first."""
        if parent_session is not None and not isinstance(parent_session, str):
            raise SubagentControlError(
                ErrorCode.INVALID_INPUT,
                f"parent_session must be a string or None, not {type(parent_session).__name__}",
            )
        c = children_table.c
        # The header's columns, not the row: a store older than some of the row's columns
        # (opened read-only, so not migrated) is read as it is.
        query = select(
            c.child_id, c.parent_session, c.depth, c.seed_length, c.created_at, c.label
        ).order_by(c.created_at, c.child_id)
        if parent_session is not None:
            query = query.where(c.parent_session == parent_session)
        return self._run("list children", lambda _attempt: self._list(query))

    def ids_with_prefix(self, kind: str, prefix: str, *, limit: int) -> list[str]:
        """The first ``limit`` ids of ``kind`` (``child``, ``task`` or ``request``) that
        start with ``prefix``, in key order: one read on the primary key's index (a short
        id typed by a person, `persistence._id_prefix`). A store too old to keep that kind
        has none.

        Raises:
            SubagentControlError: ``INVALID_INPUT`` for an unknown kind, an empty prefix or a
                limit outside 1..1000; ``STORE_UNAVAILABLE``.
        """
        query = prefix_query(kind, prefix, limit)
        if self._version < KEPT_SINCE[kind]:
            return []
        return self._run(f"find {kind} ids starting {prefix!r}", lambda _a: self._ids(query))

    def deadline(self, seconds: float) -> AbstractContextManager[None]:
        """Bound every store call this thread makes inside the block, retries included,
        to end within ``seconds`` (a silent network's waits are cut, on PostgreSQL)."""
        return call_deadline(seconds)

    def abandoning(self, abandoned: Callable[[], bool]) -> AbstractContextManager[None]:
        """Store calls this thread makes inside the block stop retrying once
        ``abandoned()`` is true, and `abandon_waits` ends the one waiting now."""
        return abandoning(abandoned)

    @staticmethod
    def abandon_waits(thread_ids: Collection[int]) -> None:
        """End at once the waits for the server of the threads ``thread_ids`` (PostgreSQL;
        the call fails, and inside `abandoning` is not retried)."""
        abandon_waits(thread_ids)

    def name_sessions(self, runtime_id: str) -> None:
        """Name every database session this store opens from now on after the runtime
        ``runtime_id`` (PostgreSQL), so that `end_sessions_of` can end them once the others
        judge it dead (`persistence._sessions`)."""
        name_sessions(self._db, runtime_id)

    def end_sessions_of(self, runtime_ids: Sequence[str]) -> int:
        """End every database session of the runtimes ``runtime_ids`` (named by
        `name_sessions`; PostgreSQL, this role's sessions): their locks are released, and
        no transaction they had open can commit. How many were ended.

        Raises:
            SubagentControlError: ``STORE_UNAVAILABLE``.
        """
        return self._run(
            "end the sessions of dead runtimes", lambda _a: end_sessions_of(self._db, runtime_ids)
        )

    def network_back(self, since: float) -> int:
        """The network was out and is back (a lease renewal sent at ``since``, on the
        monotonic clock, was answered): every listener on this store (PostgreSQL's
        notifications: forwarded messages and their answers, admission slots, takeable
        Tasks) listens again on a new connection, and every wait of this store's for the
        server begun before ``since`` is ended, its call retried on a new connection
        (another store of the process, on another network perhaps, keeps its waits). A
        connection that lived through the outage can hold notifications back, or sit in
        TCP's retransmission, for seconds after the network is back
        (`persistence._listening`).
        How many listeners there are."""
        listeners = refresh_listeners(self._db)
        cut_waits_begun_before(since, self._db.engine)
        return listeners

    def close(self) -> None:
        """Close every pooled connection; later calls raise ``CLOSED``. Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._db.close()

    def __enter__(self) -> SqlStore:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"SqlStore({self.url!r})"

    # -- one attempt of each operation ----------------------------------------------------

    def _open(self, _attempt: int) -> None:
        with self._db.connection(write=True) as conn:
            ensure_schema(conn)

    @property
    def keeps_tasks(self) -> bool:
        """Whether the store has Task and runtime rows (schema version 4 on): an older store
        opened read-only has none."""
        return self._version >= 4

    def _check(self, _attempt: int) -> None:
        with self._db.connection(write=False) as conn:
            version = check_schema(conn)
        self._version = version
        self._db.sql = self._db.sql.before(
            segments=version >= SEGMENTS_SINCE,
            spend=version >= SPEND_SINCE,
            recoveries=version >= RECOVERIES_SINCE,
        )
        if version < RECOVERIES_SINCE:
            self.ledger.without_recoveries()
        if version < SPEND_SINCE:
            self.ledger.without_spend()
        if version < NEWEST_TASK_SINCE:
            self.overview.read_older_store()

    def admit_claiming(
        self,
        task: TaskSnapshot,
        *,
        is_dead: IsDead,
        opening: Sequence[NewEvent] = (),
        recoverable: Recoverable | None = None,
    ) -> int | None:
        """Admit a resume's Task and claim its child for the Task's runtime, in one
        transaction, with ``opening`` (its turn's frame) written as the child's next turn
        (see `persistence._claims.Claims.admit_claiming`).

        Returns:
            The new fencing number.

        Raises:
            SubagentControlError: ``OWNERSHIP_CONFLICT`` naming the live runtime that holds
                the child; ``CHILD_NOT_FOUND`` for a child not in the store;
                `persistence._claims.TaskInRecovery` for a dead runtime's running Task that
                ``recoverable`` says this runtime carries on (nothing is written).
        """
        return self._claims.admit_claiming(
            task, is_dead=is_dead, opening=opening, recoverable=recoverable
        )

    def continue_parked(
        self, task_id: str, child_id: str, runtime_id: str, *, is_dead: IsDead
    ) -> int | None:
        """Claim a child for its Task that waits on an approval request, so that
        ``runtime_id`` continues it (see `persistence._claims.Claims.continue_parked`)."""
        if self._read_only:
            raise _read_only(f"continue task {task_id}")
        return self._claims.continue_parked(task_id, child_id, runtime_id, is_dead=is_dead)

    def release_waiting(self, task_id: str, child_id: str, runtime_id: str) -> bool:
        """Park the claim ``runtime_id`` holds for a Task that waits on an approval request
        its run no longer waits for here (see `persistence._claims.Claims.release_waiting`)."""
        if self._read_only:
            raise _read_only(f"park task {task_id}")
        return self._claims.release_waiting(task_id, child_id, runtime_id)

    def recover(
        self, task_id: str, child_id: str, runtime_id: str, *, is_dead: IsDead, limit: int
    ) -> Recovered:
        """Take a dead runtime's running Task over, so that ``runtime_id`` runs it on in
        its turn (see `persistence._claims.Claims.recover`)."""
        if self._read_only:
            raise _read_only(f"recover task {task_id}")
        return self._claims.recover(task_id, child_id, runtime_id, is_dead=is_dead, limit=limit)

    def await_provider(self, task_id: str, child_id: str, runtime_id: str, provider: str) -> bool:
        """Leave a resume's Task for a runtime with its child's provider: it reads
        ``queued`` naming it (see `persistence._claims.Claims.await_provider`); once that
        committed, the runtimes that watch are told (`Takeable.announce`)."""
        if self._read_only:
            raise _read_only(f"leave task {task_id}")
        left = self._claims.await_provider(task_id, child_id, runtime_id, provider)
        if left:
            self.takeable.announce()
        return left

    def take_waiting(self, task_id: str, child_id: str, runtime_id: str) -> int | None:
        """Take a Task that waits for a runtime with its provider; the fencing number (see
        `persistence._claims.Claims.take_waiting`)."""
        if self._read_only:
            raise _read_only(f"take task {task_id}")
        return self._claims.take_waiting(task_id, child_id, runtime_id)

    def steer_parked(
        self, task_id: str, child_id: str, data: dict[str, Any], source: MessageSource
    ) -> bool:
        """Write a ``steering/message`` into the open turn of a parked Task (see
        `persistence._claims.Claims.steer_parked`)."""
        if self._read_only:
            raise _read_only(f"steer task {task_id}")
        return self._claims.steer_parked(task_id, child_id, data, source)

    def settle_parked(self, settlement: Settlement, *, is_dead: IsDead) -> bool:
        """Settle a Task parked on an approval request, with its turn's end (see
        `persistence._claims.Claims.settle_parked`)."""
        if self._read_only:
            raise _read_only(f"settle task {settlement[0]}")
        return self._claims.settle_parked(settlement, is_dead=is_dead)

    def interrupt(self, task: TaskSnapshot, detail: str) -> bool:
        """Settle a dead runtime's running Task ``interrupted``, close its open turn and
        take its claim away, once (see `persistence._claims.Claims.interrupt`).

        Returns:
            Whether this call settled it.
        """
        return self._claims.interrupt(task, detail)

    def _require(self, child_id: str) -> None:
        with self._db.cursor(write=False) as cursor:
            cursor.execute(self._db.sql.children.exists, (child_id,))
            if cursor.fetchone() is None:
                raise not_found(child_id)

    def _load(self, child_id: str) -> LoadedSession:
        # One statement, so one snapshot: the header row first, then every event (or, for
        # a child this store decoded before, every event after the ones it kept).
        sql = self._db.sql.children
        kept = self._transcripts.get(child_id) if sql.load_after is not None else None
        with self._db.cursor(write=False) as cursor:
            if kept is None or sql.load_after is None:
                kept, after = None, 0
                cursor.execute(sql.load, (child_id,) * sql.load_binds)
            else:
                after = kept[-1].seq if kept else 0
                binds = (child_id, child_id, kept.sealed_upto, child_id, after)
                cursor.execute(sql.load_after, binds)
            header = cursor.fetchone()
            if header is None:
                raise not_found(child_id)
            if self._pause_gc:
                with gc_paused():
                    read = decode_events(cursor, after)
            else:
                read = decode_events(cursor, after)
        events = self._transcripts.keep(child_id, kept, read)
        _first, depth, parent_session, label, seed_length, created_at = header
        meta = construct(
            ChildMeta,
            {
                "child_id": child_id,
                "parent_session": parent_session,
                "depth": depth,
                "seed_length": int(seed_length),
                "created_at": utc_time(created_at),
                "label": label,
            },
        )
        return construct(LoadedSession, {"meta": meta, "events": events})

    def _ids(self, query: Select[str]) -> list[str]:
        with self._db.connection(write=False) as conn:
            return list(conn.scalars(query))

    def _list(self, query: Select[Any]) -> list[ChildMeta]:
        with self._db.connection(write=False) as conn:
            return [child_meta(row) for row in conn.execute(query)]

    # -- plumbing -----------------------------------------------------------------------

    def _run(self, action: str, operation: Callable[[int], T]) -> T:
        if self._closed:
            raise SubagentControlError(
                ErrorCode.CLOSED, f"cannot {action}: the store is closed; open a new SqlStore"
            )
        return self._retrier.run(action, operation)

    def _committed(self) -> None:
        if self._after_commit is not None:
            self._after_commit()


def _check_seconds(name: str, value: object) -> None:
    problem = seconds_problem(value)
    if problem is not None:
        raise SubagentControlError(ErrorCode.INVALID_INPUT, f"{name} {problem}")


def _check_flag(name: str, value: object) -> None:
    if not isinstance(value, bool):
        raise SubagentControlError(
            ErrorCode.INVALID_INPUT, f"{name} must be True or False, not {value!r}"
        )


def _read_only(action: str) -> SubagentControlError:
    return SubagentControlError(
        ErrorCode.INVALID_INPUT,
        f"cannot {action}: this store was opened read-only (for inspection); nothing was written",
    )


def _unanswerable(child_id: str, why: str) -> SubagentControlError:
    return SubagentControlError(
        ErrorCode.INVALID_INPUT,
        f"cannot answer forwarded messages in an append to child {child_id}: {why}; nothing "
        "was written",
        child_id=child_id,
    )
