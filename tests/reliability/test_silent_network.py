"""SPEC §9 "Lease safety": every store call has a client-side deadline, so a silent network
(connections open, no byte passing) fails a call instead of hanging its thread, and a
client gone silent inside a transaction does not keep its locks.

The silence is real: a `pg_fault.TcpProxy` between the store and a private server holds
every byte both ways while its kernel still acknowledges them, which TCP keepalives and
``tcp_user_timeout`` take for a live peer. Before the deadlines, a read on a held
connection waited as long as the partition lasted, and a transaction left open by a held
client kept the child's row lock from every other runtime.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import pytest

from controlplane import ErrorCode, NewEvent, SubagentControlError
from persistence import RetryPolicy, SqlStore
from tests.persistence.conftest import new_child
from tests.reliability.pg_fault import PostgresServer, TcpProxy
from tests.support import in_thread

pytestmark = [pytest.mark.postgres, pytest.mark.slow]

HANG_S = 30.0
"""How long a test lets a call run before it calls it hung (the proxy is released then)."""


def note(n: int) -> NewEvent:
    return NewEvent(kind="note", turn=1, data={"n": n})


def test_a_read_on_a_silent_connection_fails_within_its_deadline(
    pg_server: PostgresServer, tcp_proxy_factory: Callable[[int], TcpProxy]
) -> None:
    url = pg_server.new_database()
    proxy = tcp_proxy_factory(pg_server.port)
    # A statement timeout of 1 s bounds every wait at 3 s (1 s + the 2 s grace).
    with SqlStore(
        proxy.url(url), statement_timeout_s=1.0, retry=RetryPolicy(max_total_s=1.0)
    ) as store:
        meta = new_child(store)
        proxy.hold()
        try:
            began = time.monotonic()
            bounded = in_thread(lambda: _refused(lambda: store.load(meta.child_id)))
            assert bounded.result(timeout=HANG_S) is ErrorCode.STORE_UNAVAILABLE
            # The wait (3 s), then connects refused by the held proxy within the 1 s
            # budget (connect_timeout 3 s each): never the partition's length.
            assert time.monotonic() - began < 3.0 + 1.0 + 3.0 + 1.0

            began = time.monotonic()
            with store.deadline(0.5):  # a tighter bound for this thread's calls
                assert _refused(lambda: store.load(meta.child_id)) is ErrorCode.STORE_UNAVAILABLE
            # The pool is empty now: a connect, cut to libpq's 2 s floor, and no retry.
            assert time.monotonic() - began < 2.0 + 1.0
        finally:
            proxy.release()
        # The store recovers once the network passes bytes again.
        assert store.load(meta.child_id).events == []


def test_a_transaction_left_open_by_a_silent_client_gives_its_locks_up(
    pg_server: PostgresServer, tcp_proxy_factory: Callable[[int], TcpProxy]
) -> None:
    url = pg_server.new_database()
    proxy = tcp_proxy_factory(pg_server.port)
    with (
        SqlStore(proxy.url(url), lock_timeout_s=1.0) as held,
        SqlStore(url, lock_timeout_s=1.0, retry=RetryPolicy(max_total_s=10.0)) as other,
    ):
        meta = new_child(held)
        locked, finish = threading.Event(), threading.Event()

        def hold_the_childs_lock() -> None:
            # A write of the held client, stopped between its statements (a runtime cut
            # off mid-append): the child's row lock is taken, the transaction open.
            lock_child = held._db.sql.children.lock_child
            assert lock_child is not None
            with held._db.cursor(write=True) as cursor:
                cursor.execute(lock_child, (meta.child_id,))
                locked.set()
                finish.wait(HANG_S)

        holder = in_thread(hold_the_childs_lock)
        assert locked.wait(HANG_S)
        proxy.hold()
        try:
            began = time.monotonic()
            appended = in_thread(lambda: other.append(meta.child_id, [note(1)]))
            assert [e.seq for e in appended.result(timeout=HANG_S)] == [1]
            # The server ended the idle transaction after the lock timeout (1 s); the
            # append's lock waits and retries took the rest.
            assert time.monotonic() - began < 1.0 + 5.0
        finally:
            finish.set()
            proxy.release()
        with pytest.raises(held._db.errors, match="idle-in-transaction"):
            holder.result(timeout=HANG_S)  # the server ended its session: its commit fails
    with SqlStore(url) as store:
        assert [e.data for e in store.load(meta.child_id).events] == [{"n": 1}]


def _refused(call: Callable[[], object]) -> ErrorCode | None:
    try:
        call()
    except SubagentControlError as exc:
        return exc.code
    return None
