"""Opening an engine for a store URL, and what differs between SQLite and PostgreSQL."""

from __future__ import annotations

import math
import weakref
from dataclasses import dataclass
from typing import Any, Final

from sqlalchemy import URL, Connection, Engine, create_engine, event, make_url
from sqlalchemy import exc as sa_exc
from sqlalchemy.pool import ConnectionPoolEntry, StaticPool

from controlplane.contract import ErrorCode, SubagentControlError
from persistence._deadlines import (
    SILENCE_GRACE_S,
    DeadlinePool,
    bounded_connection_class,
    connect_bounded,
)

__all__ = [
    "LOCK_TIMEOUT_S",
    "SESSION_NAMES",
    "STATEMENT_TIMEOUT_S",
    "WRITE_OPTION",
    "Backend",
    "ConnectionSettings",
    "open_engine",
]

SESSION_NAMES: weakref.WeakKeyDictionary[Engine, str] = weakref.WeakKeyDictionary()
"""The ``application_name`` each PostgreSQL engine's new connections give the server in
their startup packet (`persistence._sessions.name_sessions` sets it; none: the URL's)."""

WRITE_OPTION: Final = "subagent_write"
"""Execution option marking an engine whose transactions write (SQLite: BEGIN IMMEDIATE)."""

PG_NETWORK_BOUNDS: Final[dict[str, int]] = {
    # Each bound is far under the default lease (10 s), so a store call on a dead network
    # fails, and the retry policy reconnects, well before the runtime's lease could lapse.
    # (The lease watchdog does not wait for them: it fences the runtime on its own clock.)
    "connect_timeout": 3,  # seconds to connect (libpq reads under 2 as 2)
    # A peer that stopped answering is found in 2 + 3 x 1 = 5 s of silence on an idle
    # connection ...
    "keepalives": 1,
    "keepalives_idle": 2,
    "keepalives_interval": 1,
    "keepalives_count": 3,
    # ... and sent bytes left unacknowledged for 5 s drop a busy one (Linux).
    "tcp_user_timeout": 5000,
}
"""The libpq connection parameters that bound a PostgreSQL connection on a dead network
(a URL that sets one keeps its own)."""
LOCK_TIMEOUT_S: Final = 5.0
"""The default bound of a lock wait: far above any append's hold of a child's lock."""
STATEMENT_TIMEOUT_S: Final = 30.0
_IDLE_IN_TRANSACTION_FLOOR_S: Final = 1.0
"""The default bound of a statement: far above a 10,000-event load."""


@dataclass(frozen=True, kw_only=True, slots=True)
class ConnectionSettings:
    """What every connection of a store is set up with (see `SqlStore` for each).

    Attributes:
        lock_timeout_s: The longest a statement waits for a lock (PostgreSQL
            ``lock_timeout``; SQLite's busy timeout).
        statement_timeout_s: The longest a statement runs (PostgreSQL
            ``statement_timeout``; SQLite has no such bound).
        durable_os_crash: SQLite ``synchronous=FULL`` instead of ``NORMAL``.
    """

    lock_timeout_s: float
    statement_timeout_s: float
    durable_os_crash: bool


@dataclass(frozen=True, slots=True)
class Backend:
    """What the store must know about its database.

    Attributes:
        name: ``sqlite`` or ``postgresql``.
        begin_write: The statement that opens a write transaction.
        serialize_writes: Whether this process should let one writer at a time in
            (SQLite: one file lock; queueing on a Lock beats the busy handler's sleeps).
        single_connection: Whether every operation shares one connection (in-memory SQLite).
        text_times: Whether timestamps are stored as text (SQLite).
    """

    name: str
    begin_write: str
    serialize_writes: bool
    single_connection: bool
    text_times: bool


def open_engine(url: str, settings: ConnectionSettings) -> tuple[Engine, Backend]:
    """An engine and its backend description for a store URL.

    ``sqlite:///path`` (file, WAL), ``sqlite://`` or ``sqlite:///:memory:`` (one shared
    in-memory connection), ``postgresql+psycopg://…`` (``postgresql://`` and
    ``postgres://`` mean psycopg too).
    Every connection gets ``settings``, except where the URL sets the same thing itself
    (SQLite ``?timeout=``, PostgreSQL ``options=-c lock_timeout=…``): the URL wins.

    Raises:
        SubagentControlError: ``INVALID_INPUT`` for a URL that is not a string, cannot be
            parsed or names an unsupported database; ``STORE_UNAVAILABLE`` when the
            database driver is not installed.
    """
    parsed = _parse(url)
    backend_name = parsed.get_backend_name()
    try:
        if backend_name == "sqlite":
            return _sqlite(parsed, settings)
        if backend_name == "postgresql":
            return _postgresql(parsed, settings)
    except ImportError as exc:
        raise SubagentControlError(
            ErrorCode.STORE_UNAVAILABLE,
            f"the driver for {parsed.drivername!r} is not installed ({exc}); "
            "for PostgreSQL install subagent-control[postgres]",
        ) from exc
    except (sa_exc.ArgumentError, sa_exc.NoSuchModuleError, ValueError) as exc:
        # ValueError: a query argument of the wrong form (``?timeout=soon``).
        raise _bad_url(parsed, str(exc)) from exc
    raise _bad_url(parsed, "only sqlite:// and postgresql+psycopg:// stores are supported")


def _parse(url: object) -> URL:
    if not isinstance(url, str):
        raise SubagentControlError(
            ErrorCode.INVALID_INPUT, f"the store URL must be a string, not {type(url).__name__}"
        )
    if url.startswith("postgres://"):
        # Heroku's, libpq's and most hosts' spelling; SQLAlchemy knows only "postgresql".
        url = "postgresql" + url.removeprefix("postgres")
    try:
        return make_url(url)
    except (sa_exc.ArgumentError, ValueError) as exc:
        raise SubagentControlError(
            ErrorCode.INVALID_INPUT,
            f"cannot parse the store URL {url!r}; use sqlite:///path/to/state.db or "
            "postgresql+psycopg://user@host/db",
        ) from exc


def _bad_url(url: URL, why: str) -> SubagentControlError:
    shown = url.render_as_string(hide_password=True)
    return SubagentControlError(ErrorCode.INVALID_INPUT, f"unusable store URL {shown!r}: {why}")


def _sqlite(url: URL, settings: ConnectionSettings) -> tuple[Engine, Backend]:
    if url.get_driver_name() != "pysqlite":
        raise _bad_url(url, "the SQLite store uses the standard sqlite3 driver (sqlite://)")
    in_memory = url.database in (None, "", ":memory:")
    connect_args: dict[str, Any] = {}
    options: dict[str, Any] = {}
    if "timeout" not in url.query:
        # sqlite3's busy timeout, in seconds: how long a statement waits for another
        # process's lock before it fails (transiently: the retry policy takes over).
        connect_args["timeout"] = _milliseconds(settings.lock_timeout_s) / 1000
    if in_memory:
        # One connection, so every thread sees the same database; the store serializes
        # every operation on it (see Backend.single_connection).
        connect_args["check_same_thread"] = False
        options["poolclass"] = StaticPool
    engine = create_engine(url, connect_args=connect_args, **options)
    synchronous = (
        "PRAGMA synchronous=FULL" if settings.durable_os_crash else "PRAGMA synchronous=NORMAL"
    )

    @event.listens_for(engine, "connect")
    def configure(dbapi_connection: Any, _record: ConnectionPoolEntry) -> None:
        # The sqlite3 module's own transaction handling would BEGIN lazily and DEFERRED;
        # the store emits BEGIN itself (the SQLAlchemy pysqlite recipe), IMMEDIATE for
        # writes, so a writer takes the lock up front instead of failing to upgrade later.
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        try:
            if not in_memory:
                cursor.execute("PRAGMA journal_mode=WAL")
            # NORMAL in WAL mode: a commit survives a crash of the process, but an OS
            # crash or a power loss can drop the last commits. FULL syncs the WAL on
            # every commit, so a commit survives those too, at the cost of an fsync.
            cursor.execute(synchronous)
            cursor.execute("PRAGMA foreign_keys=ON")
        finally:
            cursor.close()

    _install_begin(engine, write_begin="BEGIN IMMEDIATE")
    return engine, Backend(
        name="sqlite",
        begin_write="BEGIN IMMEDIATE",
        serialize_writes=True,
        single_connection=in_memory,
        text_times=True,
    )


def _postgresql(url: URL, settings: ConnectionSettings) -> tuple[Engine, Backend]:
    if url.drivername == "postgresql":
        url = url.set(drivername="postgresql+psycopg")
    elif url.drivername != "postgresql+psycopg":
        raise _bad_url(url, "the PostgreSQL store uses psycopg 3 (postgresql+psycopg://)")
    connect_args: dict[str, Any] = {"options": _pg_options(url, settings)}
    connect_args.update(
        {name: value for name, value in PG_NETWORK_BOUNDS.items() if name not in url.query}
    )
    # Driver-level autocommit: reads of append-only rows need no transaction (saving the
    # BEGIN and COMMIT round trips), and every write transaction is opened explicitly.
    # The pool's wait for a free connection ends with the call's deadline or abandonment,
    # and a lease renewal never waits for one (_deadlines.DeadlinePool).
    engine = create_engine(
        url, isolation_level="AUTOCOMMIT", connect_args=connect_args, poolclass=DeadlinePool
    )
    # A silent network that still acknowledges bytes (a proxy holding them) escapes the
    # TCP bounds: every wait for the server is bounded on the client too (_deadlines).
    # Its waits are this engine's: the store's `network_back` cuts only its own.
    bounded = bounded_connection_class(settings.statement_timeout_s + SILENCE_GRACE_S, scope=engine)

    @event.listens_for(engine, "do_connect")
    def connect(_dialect: Any, _record: Any, cargs: Any, cparams: Any) -> Any:
        name = SESSION_NAMES.get(engine)
        if name is not None:
            cparams = {**cparams, "application_name": name}
        return connect_bounded(bounded, cargs, cparams)

    _install_begin(engine, write_begin="BEGIN")
    return engine, Backend(
        name="postgresql",
        begin_write="BEGIN",
        serialize_writes=False,
        single_connection=False,
        text_times=False,
    )


def _pg_options(url: URL, settings: ConnectionSettings) -> str:
    """The libpq ``options`` that bound every statement of every connection, followed by
    the URL's own (a later ``-c`` wins, so the URL's settings override these).

    Without a bound, an append waiting for the child's row lock held by a stuck
    transaction would wait forever, and the retry policy, which starts counting at the
    first error, would never get a say. Past ``lock_timeout`` the wait fails with
    SQLSTATE 55P03, past ``statement_timeout`` with 57014; both are transient. Set at
    connect time, they cost nothing per statement.

    ``idle_in_transaction_session_timeout`` (the lock timeout too) is the same bound seen
    from the other side: a client that went silent inside a write transaction (partitioned,
    paused) would keep its row locks, the child's among them, for as long as the server
    believes the connection alive, and no other runtime could take the child over. A
    transaction idle for longer than anyone waits for its locks is ended by the server
    (never sooner than `_IDLE_IN_TRANSACTION_FLOOR_S`: a tiny lock timeout must not end
    the store's own transactions between two statements).
    """
    bounds = (
        f"-c lock_timeout={_milliseconds(settings.lock_timeout_s)} "
        f"-c statement_timeout={_milliseconds(settings.statement_timeout_s)} "
        "-c idle_in_transaction_session_timeout="
        f"{_milliseconds(max(settings.lock_timeout_s, _IDLE_IN_TRANSACTION_FLOOR_S))}"
    )
    given = url.query.get("options", ())
    # Last, so that it wins: timestamptz values arrive in UTC, with no conversion per row.
    # In the startup packet rather than a SET after connecting, a round trip fewer on a
    # new connection (the renewal that rides an outage through connects at the heal).
    return " ".join([bounds, *([given] if isinstance(given, str) else given), "-c TimeZone=UTC"])


def _milliseconds(seconds: float) -> int:
    # Both databases count whole milliseconds, and PostgreSQL reads 0 as "no bound": a
    # positive bound never rounds down to it.
    return max(1, math.ceil(seconds * 1000))


def _install_begin(engine: Engine, *, write_begin: str) -> None:
    """Let SQLAlchemy-managed transactions (connections, schema setup) BEGIN explicitly.

    The driver runs in autocommit mode on both backends, so without this hook a connection
    would run each statement in its own transaction.
    """

    @event.listens_for(engine, "begin")
    def begin(conn: Connection) -> None:
        write = bool(conn.get_execution_options().get(WRITE_OPTION, False))
        conn.exec_driver_sql(write_begin if write else "BEGIN")
