"""The deadlines reaper (`persistence._deadlines`) is woken only to watch a wait that ends
sooner than it sleeps: every PostgreSQL statement is watched, and waking the reaper's
thread for each one cost a cross-thread hand-off per round trip."""

from __future__ import annotations

import socket
import threading
import time

import pytest

from persistence._deadlines import (
    _Reaper,
    abandoning,
    bounded_connection_class,
    connect_bounded,
)


def test_waits_with_the_same_bound_never_wake_the_reaper() -> None:
    reaper = _Reaper()
    for _ in range(50):  # one statement after another, as a connection runs them
        assert reaper.done(reaper.watch(fd=-1, bound=30.0)) is False
    assert reaper.wakes == 0


def test_a_wait_with_a_shorter_bound_wakes_the_reaper_and_is_cut_in_time() -> None:
    reaper = _Reaper()
    long = reaper.watch(fd=-1, bound=30.0)
    ours, peer = socket.socketpair()
    try:
        ours.settimeout(10.0)  # a hang fails the test instead of blocking it
        short = reaper.watch(fd=ours.fileno(), bound=0.05)
        assert reaper.wakes == 1
        assert ours.recv(1) == b""  # returns once the reaper shut the socket down
        assert reaper.done(short) is True
    finally:
        ours.close()
        peer.close()
        reaper.done(long)


def test_a_connection_attempt_to_a_silent_server_is_given_up_once_abandoned() -> None:
    # A fenced activation's store call that was connecting (its connection closed by an
    # earlier silence) waited out libpq's connect timeout, 2 s at least, whatever
    # `abandon_waits` did: no socket is watched until the connection is made. The fenced
    # activation stayed alive past the quarter lease it has to stop in, and the recovery
    # stress run's lock probe saw another runtime's activation of its child begin.
    pytest.importorskip("psycopg")
    silent = socket.create_server(("127.0.0.1", 0))  # takes the handshake, never answers
    port = silent.getsockname()[1]
    given_up = threading.Event()
    failed: list[BaseException] = []

    def connect() -> None:
        with abandoning(given_up.is_set):
            try:
                connection = connect_bounded(
                    bounded_connection_class(30.0),
                    (),
                    {"host": "127.0.0.1", "port": port, "user": "u", "dbname": "d",
                     "connect_timeout": 10},
                )  # fmt: skip
                connection.close()
            except BaseException as exc:
                failed.append(exc)

    try:
        attempt = threading.Thread(target=connect, daemon=True)
        began = time.monotonic()
        attempt.start()
        time.sleep(0.3)  # the attempt is under way (a schedule, not a synchronisation)
        given_up.set()
        attempt.join(10.0)
        took = time.monotonic() - began
    finally:
        silent.close()
    assert not attempt.is_alive()
    assert failed, "connected to a server that never answers"
    assert took < 1.5, f"the abandoned attempt went on for {took:.2f}s"  # before: 10 s
    assert "abandoned" in str(failed[0])
