"""The fault harness itself: the private server crashes and comes back with what it had
committed, the proxy holds, releases and resets, and the lock probe catches a second
holder. Every other store-fault test relies on these."""

from __future__ import annotations

import contextlib
import socket
import threading
from pathlib import Path

import pytest

from tests.reliability.pg_fault import LockProbe, PostgresServer, TcpProxy

_QUIET_S = 0.3  # how long a held proxy must pass nothing (a negative: bounded, not a sync)


def _connect(url: str, **options: object) -> object:
    import psycopg

    from tests.persistence.conftest import libpq_url

    return psycopg.connect(libpq_url(url), autocommit=True, **options)


@pytest.mark.postgres
@pytest.mark.slow  # measured: 4 s under load (--durations)
def test_a_crash_keeps_what_was_committed_and_cuts_every_connection(
    pg_server: PostgresServer,
) -> None:
    import psycopg

    url = pg_server.new_database()
    with _connect(url) as conn:  # type: ignore[attr-defined]
        conn.execute("CREATE TABLE kept (n int)")
        conn.execute("INSERT INTO kept VALUES (1)")
        pg_server.crash()
        assert not pg_server.is_up()
        with pytest.raises(psycopg.OperationalError):
            conn.execute("SELECT 1")
    pg_server.start()
    with _connect(url) as conn:  # type: ignore[attr-defined]
        assert conn.execute("SELECT n FROM kept").fetchall() == [(1,)]


@pytest.mark.postgres
def test_a_restart_is_down_then_up(pg_server: PostgresServer) -> None:
    pg_server.restart(0.1)
    assert pg_server.is_up()


def _echo_server() -> tuple[socket.socket, list[bytes], threading.Event]:
    server = socket.create_server(("127.0.0.1", 0))
    received: list[bytes] = []
    got = threading.Event()

    def serve() -> None:
        conn, _ = server.accept()
        # A proxy's reset ends its connection with a RST, which this side reads as an error:
        # the end of the echo, not a failure of the test's thread.
        with conn, contextlib.suppress(ConnectionResetError, BrokenPipeError):
            while data := conn.recv(1024):
                received.append(data)
                got.set()
                conn.sendall(data)

    threading.Thread(target=serve, daemon=True).start()
    return server, received, got


def test_a_held_proxy_passes_nothing_until_released_then_everything_in_order() -> None:
    server, received, got = _echo_server()
    with server, TcpProxy(server.getsockname()[1]) as proxy:
        client = socket.create_connection(("127.0.0.1", proxy.port), timeout=5)
        with client:
            proxy.hold()
            client.sendall(b"one")
            client.sendall(b"two")
            assert not got.wait(_QUIET_S)
            proxy.release()
            echoed = b""
            while len(echoed) < 6:
                echoed += client.recv(1024)
            assert echoed == b"onetwo"
            assert b"".join(received) == b"onetwo"


def _send_and_receive(client: socket.socket) -> bytes:
    client.sendall(b"y")
    return client.recv(1)


def test_a_reset_ends_every_connection_with_a_reset() -> None:
    server, _received, _got = _echo_server()
    with server, TcpProxy(server.getsockname()[1]) as proxy:
        client = socket.create_connection(("127.0.0.1", proxy.port), timeout=5)
        with client:
            client.sendall(b"x")
            assert client.recv(1) == b"x"
            proxy.reset()
            with pytest.raises((ConnectionResetError, BrokenPipeError)):
                _send_and_receive(client)


@pytest.mark.postgres
def test_a_held_proxy_holds_a_query_that_the_release_lets_finish(
    pg_server: PostgresServer,
) -> None:
    url = pg_server.new_database()
    with TcpProxy(pg_server.port) as proxy, _connect(proxy.url(url)) as conn:  # type: ignore[attr-defined]
        proxy.hold()
        done = threading.Event()
        answer: list[object] = []

        def query() -> None:
            answer.append(conn.execute("SELECT 41 + 1").fetchone())
            done.set()

        thread = threading.Thread(target=query, daemon=True)
        thread.start()
        assert not done.wait(_QUIET_S)
        proxy.release()
        assert done.wait(10)
        assert answer == [(42,)]


def test_the_lock_probe_records_a_second_holder(tmp_path: Path) -> None:
    probe = LockProbe(tmp_path)
    assert probe.enter("child-1", "first")
    assert not LockProbe(tmp_path).enter("child-1", "second")
    assert probe.violations() == ["child-1 entered by second while held"]
    probe.exit("child-1")
    assert LockProbe(tmp_path).enter("child-1", "third")
    assert len(probe.violations()) == 1
