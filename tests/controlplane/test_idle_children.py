"""An idle child costs no thread: its supervisor, kept for its next message, gives its worker
back to the pool once its mailbox is empty — after its turn, and after being offered (and
declining) retirement — and its finished activation is not kept alive by anything."""

from __future__ import annotations

import gc
import threading
import weakref
from typing import Any

import pytest

from actors.activation import ActivationActor
from actors.messages import PassivateIfIdle
from controlplane import AgentHandle, SubagentControl, TaskStatus
from tests.support import WAIT_S, eventually, idle_child, settle, text

_LOOPS = ("ChildSupervisor-", "ActivationActor-")


def _busy_loops() -> list[str]:
    """Threads running a supervisor's or an activation's loop right now."""
    return [t.name for t in threading.enumerate() if t.name.startswith(_LOOPS)]


def _held_threads() -> int:
    """Threads other than idle pool workers (at most `LoopPool.max_idle`, shared by all)."""
    return sum(not t.name.startswith("actor-pool-idle") for t in threading.enumerate())


def test_idle_children_keep_their_supervisors_but_hold_no_thread(
    control: SubagentControl, parent: AgentHandle
) -> None:
    first = [idle_child(control, parent) for _ in range(2)]
    eventually(lambda: not _busy_loops(), "every loop gave its worker back")
    with_two = _held_threads()

    more = [idle_child(control, parent) for _ in range(10)]

    eventually(lambda: not _busy_loops(), "every loop gave its worker back")
    assert _held_threads() <= with_two
    # Still routed: the next message needs no new supervisor (a warm resume).
    assert all(control._routes.get(child_id) is not None for child_id in first + more)


def test_an_idle_supervisor_offered_retirement_too_early_holds_no_thread_and_resumes(
    control: SubagentControl, parent: AgentHandle
) -> None:
    child_id = idle_child(control, parent)
    route = control._routes.get(child_id)
    assert route is not None

    # The passivator's offer, declined (not idle long enough): handled, then parked again.
    route.supervisor.ref.ask(PassivateIfIdle(idle_for_s=3600.0), timeout=WAIT_S)
    eventually(lambda: not _busy_loops(), "the supervisor gave its worker back")
    assert control._routes.get(child_id) is route

    result = control.send_message(parent, child_id, text("carry on"))
    assert result.route == "started"
    assert settle(control, result.task_id, parent).status is TaskStatus.COMPLETED
    assert control._routes.get(child_id) is route  # the same supervisor, resumed
    eventually(lambda: not _busy_loops(), "the supervisor gave its worker back")


def test_a_finished_activation_is_not_kept_alive(
    control: SubagentControl, parent: AgentHandle, monkeypatch: pytest.MonkeyPatch
) -> None:
    started: list[weakref.ref[ActivationActor]] = []
    real_init = ActivationActor.__init__

    def init(self: ActivationActor, *args: Any, **kwargs: Any) -> None:
        real_init(self, *args, **kwargs)
        started.append(weakref.ref(self))

    monkeypatch.setattr(ActivationActor, "__init__", init)
    child_id = idle_child(control, parent)
    result = control.send_message(parent, child_id, text("one more"))
    settle(control, result.task_id, parent)
    eventually(lambda: not _busy_loops(), "every loop gave its worker back")

    assert len(started) == 2  # the first turn's and the resumed one's

    def all_gone() -> bool:
        gc.collect()
        return all(ref() is None for ref in started)

    eventually(all_gone, "both finished activations were collected")
