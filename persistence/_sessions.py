"""A runtime's database sessions, named after it, and ended when the others judge it dead
(PostgreSQL; SQLite has no sessions of its own to end).

A runtime cut off from the server can leave a transaction open there holding the child's
row lock, and the server's own timers do not always end it: in a recovery stress run a
cut-off runtime's transaction kept a child's row lock for the whole 12 s cut, well past
``idle_in_transaction_session_timeout`` (so the server was not waiting between two of its
statements), until the cut healed and the server saw the connection closed. Until then
no other runtime could carry that child's Task on. Once the others judge the runtime dead
(its lease lapsed), the runtime that sweeps ends every session of it: its locks are
released, whatever the session was doing, and a transaction it had open can never commit
after a takeover.
Only the sweeping role's own sessions are ended (the server lets a role end those).
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING

from persistence._backend import SESSION_NAMES

if TYPE_CHECKING:
    from persistence._database import Database

__all__ = ["end_sessions_of", "name_sessions", "session_name"]

log = logging.getLogger(__name__)

_PREFIX = "subagent-control "


_LIMIT = 63
"""How many bytes of ``application_name`` the server keeps."""


def session_name(runtime_id: str) -> str:
    """The tag that ends the ``application_name`` of a runtime's sessions: short and plain
    whatever the runtime id holds."""
    return _PREFIX + hashlib.sha256(runtime_id.encode()).hexdigest()[:16]


def _application_name(given: str, tag: str) -> str:
    """The URL's own ``application_name`` (if any, shortened to fit), then the tag."""
    if not given:
        return tag
    room = _LIMIT - len(tag) - 1
    return f"{given.encode()[:room].decode(errors='ignore')} {tag}"


def name_sessions(db: Database, runtime_id: str) -> None:
    """Name every session ``db`` opens from now on after ``runtime_id`` (the URL's own
    ``application_name``, if it has one, followed by the runtime's tag), and close the idle
    ones opened before (the next use opens a named one)."""
    if not db.sql.dialect.named_sessions:
        return
    given = db.engine.url.query.get("application_name", "")
    name = _application_name(
        given if isinstance(given, str) else " ".join(given), session_name(runtime_id)
    )

    # In each new connection's startup packet (`_backend` connects with it): no round
    # trip of its own.
    SESSION_NAMES[db.engine] = name
    db.engine.pool.dispose()


def end_sessions_of(db: Database, runtime_ids: Sequence[str]) -> int:
    """End every session of the runtimes ``runtime_ids`` that this role may end; how many."""
    if not db.sql.dialect.named_sessions or not runtime_ids:
        return 0
    tags = [session_name(runtime_id) for runtime_id in runtime_ids]
    with db.cursor(write=False) as cursor:
        cursor.execute(
            "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) FROM pg_stat_activity"
            " WHERE datname = current_database() AND usename = current_user"
            " AND right(application_name, %s) = ANY(%s) AND pid <> pg_backend_pid()",
            (len(tags[0]), tags),
        )
        row = cursor.fetchone()
    ended = int(row[0]) if row is not None else 0
    if ended:
        log.warning("ended %d database session(s) of dead runtime(s) %s", ended, list(runtime_ids))
    return ended
