"""A store pauses the garbage collector while it decodes a load only when asked to
(``pause_gc_on_load=True``): the collector is process-wide, and the store is a library in
someone else's process. A pause always restores the collector as it was."""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator
from typing import Any

import pytest

import persistence._store
from persistence import SqlStore
from persistence._codec import decode_events, gc_paused
from tests.persistence.conftest import message, new_child


@pytest.fixture(autouse=True)
def _collector_enabled_again() -> Iterator[None]:
    yield
    gc.enable()


def collector_during_decode(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """Whether the collector was enabled during each decode of a load, as it happens."""
    seen: list[bool] = []

    def decode(cursor: Any, after: int = 0) -> Any:
        seen.append(gc.isenabled())
        return decode_events(cursor, after)

    monkeypatch.setattr(persistence._store, "decode_events", decode)
    return seen


def test_a_load_leaves_the_collector_alone_by_default(
    store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    gc.enable()
    seen = collector_during_decode(monkeypatch)
    with SqlStore(store_url) as store:
        meta = new_child(store)
        store.append(meta.child_id, [message(n) for n in range(100)])
        assert len(store.load(meta.child_id).events) == 100
    assert seen == [True]
    assert gc.isenabled()


def test_a_store_asked_to_pauses_the_collector_during_the_decode_and_restores_it(
    store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    gc.enable()
    seen = collector_during_decode(monkeypatch)
    with SqlStore(store_url, pause_gc_on_load=True) as store:
        meta = new_child(store)
        store.append(meta.child_id, [message(n) for n in range(100)])
        assert len(store.load(meta.child_id).events) == 100
    assert seen == [False]
    assert gc.isenabled()


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
