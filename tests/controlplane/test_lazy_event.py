"""`LazyEvent`: an Event's semantics, with no Event made until a wait has to block — so a
live child's set-once flags (its cancel signal, its Task's release, its transcript's
publication) cost a slot each, not a Condition, a lock and a deque."""

from __future__ import annotations

import gc
import threading

from actors._inbox import ActivationInbox
from controlplane import AgentHandle, SubagentControl
from controlplane.contract import CancelSignal, LazyEvent
from tests.fakes import FakeProvider
from tests.support import WAIT_S, running_child, text


def test_set_wait_clear_as_an_event() -> None:
    flag = LazyEvent()
    assert not flag.is_set()
    assert flag.wait(0) is False
    flag.set()
    assert flag.is_set()
    assert flag.wait() is True
    flag.clear()
    assert not flag.is_set()
    assert flag.wait(0.001) is False  # blocks again until the next set


def test_a_blocked_waiter_is_woken_by_set() -> None:
    flag = LazyEvent()
    waiting = threading.Event()
    woke: list[bool] = []

    def wait() -> None:
        waiting.set()
        woke.append(flag.wait(WAIT_S))

    waiter = threading.Thread(target=wait)
    waiter.start()
    assert waiting.wait(WAIT_S)
    flag.set()
    waiter.join(WAIT_S)
    assert woke == [True]


def test_no_event_is_made_unless_a_wait_blocks() -> None:
    flag = LazyEvent()
    flag.set()
    flag.wait()
    flag.clear()
    assert flag._event is None
    flag.wait(0)  # would block: now there is one
    assert flag._event is not None


def test_a_signal_aborted_wakes_its_sleeper() -> None:
    signal = CancelSignal()
    slept: list[bool] = []
    sleeper = threading.Thread(target=lambda: slept.append(signal.wait(WAIT_S)))
    sleeper.start()
    signal.abort("stop")
    sleeper.join(WAIT_S)
    assert slept == [True]
    assert signal.aborted
    assert signal.wait(0)


def test_a_running_child_holds_no_event(
    control: SubagentControl, parent: AgentHandle, provider: FakeProvider
) -> None:
    """The flags a running child's Task and cancel signal hold make no Event while
    nothing waits on them unset, and its activation's inbox, steered by one sender at a
    time (each drains its own), no Condition."""
    gate = threading.Event()
    try:
        child_id, task_id, _plan = running_child(control, parent, provider, gate)
        for word in ("one", "two"):
            assert control.send_message(parent, child_id, text(word)).route == "steered"
        task = control._tasks._live[task_id]
        flags = [task.released, task.resting, task.signal._event]
        assert all(isinstance(flag, LazyEvent) and flag._event is None for flag in flags)
        gc.collect()  # what earlier tests left in reference cycles
        inboxes = [o for o in gc.get_objects() if isinstance(o, ActivationInbox)]
        assert [inbox._child_id for inbox in inboxes] == [child_id]
        assert inboxes[0]._changed is None
    finally:
        gate.set()
