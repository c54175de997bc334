"""The deadlines reaper (`persistence._deadlines`) is woken only to watch a wait that ends
sooner than it sleeps: every PostgreSQL statement is watched, and waking the reaper's
thread for each one cost a cross-thread hand-off per round trip."""

from __future__ import annotations

import socket

from persistence._deadlines import _Reaper


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
