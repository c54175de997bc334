"""SPEC §5 send_message 3: a kill that lands while the resume loads the child wins.

The resume's message is written with its claim (SPEC §9: durable before ``started``), so
the window is held open at the load itself: the store's ``load`` waits on an event the
test sets after its kill. The Task settles ``killed``, the provider is never called, and
the message stays in its turn, closed by the kill.
"""

from __future__ import annotations

import threading

from controlplane import SubagentControl, TaskStatus
from controlplane.contract import LoadedSession
from persistence import SqlStore
from tests.fakes import FakeProvider
from tests.support import WAIT_S, idle_child, in_thread, inbound, settle, text


class HeldLoads(SqlStore):
    """A store whose loads wait, once held, until released."""

    def __init__(self, url: str) -> None:
        super().__init__(url)
        self.hold = False
        self.waiting = threading.Event()
        self.released = threading.Event()

    def load(self, child_id: str) -> LoadedSession:
        if self.hold:
            self.waiting.set()
            assert self.released.wait(WAIT_S), "the test never released the load"
        return super().load(child_id)


def test_a_kill_during_the_load_settles_killed_without_calling_the_provider(
    url: str, provider: FakeProvider
) -> None:
    store = HeldLoads(url)
    control = SubagentControl(store)
    try:
        control.providers.register(provider)
        parent = control.agents.register("parent-1")
        child_id = idle_child(control, parent)
        store.hold = True

        sending = in_thread(lambda: control.send_message(parent, child_id, text("go on")))
        sent = sending.result(WAIT_S)  # `started` comes back before the load
        assert sent.route == "started"
        assert store.waiting.wait(WAIT_S), "the resume never loaded the child"
        control.tasks.kill(sent.task_id, requester=parent)
        store.released.set()

        snapshot = settle(control, sent.task_id, parent)
        assert snapshot.status is TaskStatus.KILLED
        assert provider.resumes == []
        store.hold = False
        stored = store.load(child_id).events
        (message,) = inbound(stored, "go on")
        assert stored[-1].kind == "turn/end"
        assert stored[-1].turn == message.turn
        assert stored[-1].data["status"] == "killed"
    finally:
        store.released.set()
        control.close(timeout_s=10.0)
