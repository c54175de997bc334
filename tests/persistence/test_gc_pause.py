"""A load pauses the garbage collector and always restores it as it was."""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator

import pytest

from persistence._codec import gc_paused


@pytest.fixture(autouse=True)
def _collector_enabled_again() -> Iterator[None]:
    yield
    gc.enable()


def test_a_pause_disables_the_collector_and_restores_it() -> None:
    gc.enable()
    with gc_paused():
        assert not gc.isenabled()
    assert gc.isenabled()


def test_nested_pauses_restore_the_collector_only_when_the_last_one_ends() -> None:
    gc.enable()
    with gc_paused():
        with gc_paused():
            assert not gc.isenabled()
        assert not gc.isenabled()
    assert gc.isenabled()


def test_a_pause_never_enables_a_collector_the_application_had_disabled() -> None:
    gc.disable()
    with gc_paused():
        assert not gc.isenabled()
    assert not gc.isenabled()


def test_overlapping_pauses_from_two_threads_restore_the_collector_once_both_end() -> None:
    gc.enable()
    inside, leave = threading.Event(), threading.Event()

    def other() -> None:
        with gc_paused():
            inside.set()
            assert leave.wait(5)

    thread = threading.Thread(target=other)
    thread.start()
    assert inside.wait(5)
    with gc_paused():
        pass
    assert not gc.isenabled()  # the other thread's pause is still open
    leave.set()
    thread.join(5)
    assert gc.isenabled()


def test_a_pause_restores_the_collector_when_the_decode_raises() -> None:
    gc.enable()
    with pytest.raises(ValueError, match="boom"), gc_paused():
        raise ValueError("boom")
    assert gc.isenabled()
