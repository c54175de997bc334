"""Concurrent appends to one child never collide, reorder, duplicate or interleave a batch."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from controlplane import NewEvent
from persistence import SqlStore
from tests.persistence.conftest import new_child

THREADS = 8
APPENDS = 500


@pytest.mark.timeout(120)
@pytest.mark.slow  # measured: 24 s under load (--durations)
def test_eight_threads_appending_500_events_each_to_one_child_leave_a_gapless_sequence(
    store: SqlStore,
) -> None:
    meta = new_child(store)
    start = threading.Barrier(THREADS)

    def writer(thread: int) -> list[int]:
        start.wait(timeout=10)
        seqs = []
        for n in range(APPENDS):
            (stored,) = store.append(
                meta.child_id, [NewEvent(kind="k", turn=1, data={"t": thread, "n": n})]
            )
            seqs.append(stored.seq)
        return seqs

    with ThreadPoolExecutor(THREADS) as pool:
        returned = list(pool.map(writer, range(THREADS)))

    events = store.load(meta.child_id).events
    total = THREADS * APPENDS
    assert [e.seq for e in events] == list(range(1, total + 1))
    by_seq = {e.seq: (e.data["t"], e.data["n"]) for e in events}
    for thread, seqs in enumerate(returned):
        # What each append returned is where its event really is, in the thread's order.
        assert [by_seq[s] for s in seqs] == [(thread, n) for n in range(APPENDS)]
        assert seqs == sorted(seqs)
    assert len(set(by_seq.values())) == total


def test_concurrent_batches_each_land_contiguously(store: SqlStore) -> None:
    meta = new_child(store)
    start = threading.Barrier(4)

    def writer(thread: int) -> None:
        start.wait(timeout=10)
        for batch in range(25):
            store.append(
                meta.child_id,
                [NewEvent(kind="k", turn=1, data=[thread, batch, i]) for i in range(7)],
            )

    with ThreadPoolExecutor(4) as pool:
        list(pool.map(writer, range(4)))

    events = store.load(meta.child_id).events
    assert [e.seq for e in events] == list(range(1, 4 * 25 * 7 + 1))
    for start_index in range(0, len(events), 7):
        chunk = [e.data for e in events[start_index : start_index + 7]]
        thread, batch = chunk[0][0], chunk[0][1]
        assert chunk == [[thread, batch, i] for i in range(7)]


def test_appends_to_different_children_in_parallel_keep_each_sequence_separate(
    store: SqlStore,
) -> None:
    children = [new_child(store).child_id for _ in range(4)]

    def writer(child_id: str) -> None:
        for n in range(50):
            store.append(child_id, [NewEvent(kind="k", turn=1, data=n)])

    with ThreadPoolExecutor(4) as pool:
        list(pool.map(writer, children))

    for child_id in children:
        events = store.load(child_id).events
        assert [(e.seq, e.data) for e in events] == [(n + 1, n) for n in range(50)]
