"""SPEC §9 "Handover on close": `close()` stops taking work at once, lets running turns go
on for at most ``close_timeout_s``, then hands the rest over. A turn that ends within the
grace completes in the closing runtime (not recovered elsewhere); new work is refused
meanwhile. A close that lands between a resume's ``started`` and its run's publication
hands the Task over too (a kill there still kills)."""

from __future__ import annotations

import threading

import pytest

from controlplane import (
    CancelSignal,
    ContinuableStartSpec,
    ErrorCode,
    EventKind,
    InProcessProvider,
    LoadedSession,
    ResumeRequest,
    ScriptedModel,
    SubagentControl,
    SubagentControlError,
    SubagentRun,
    TaskStatus,
    TextBlock,
)
from controlplane.models import ModelReply, ModelRequest
from persistence import SqlStore
from tests.support import WAIT_S, eventually, in_thread


class HeldModel:
    """A model whose first call waits until released (bounded), then answers."""

    def __init__(self) -> None:
        self.entered = threading.Event()
        self.release = threading.Event()

    def complete(self, request: ModelRequest, signal: CancelSignal) -> ModelReply:
        del request
        self.entered.set()
        assert self.release.wait(WAIT_S), "never released"
        signal.raise_if_aborted()
        return ModelReply(text="finished here")


def _spec(parent: object, text: str) -> ContinuableStartSpec:
    return ContinuableStartSpec(
        provider="inprocess", label="l", prompt=[TextBlock(text=text)], parent=parent
    )


def test_a_turn_that_ends_within_close_timeout_s_completes_in_the_closing_runtime(
    sqlite_url: str,
) -> None:
    model = HeldModel()
    control = SubagentControl.open(sqlite_url, close_timeout_s=WAIT_S)
    closing = None
    try:
        control.providers.register(InProcessProvider(model))
        parent = control.agents.register("p")
        started = control.start_continuable(_spec(parent, "go"))
        assert model.entered.wait(WAIT_S)
        closing = in_thread(control.close)

        def refused() -> bool:
            try:
                control.start_continuable(_spec(parent, "more"))
            except SubagentControlError as exc:
                return exc.code is ErrorCode.CLOSED
            pytest.fail("close() still took new work")

        eventually(refused, "close() refuses new work")
        assert not closing.done()  # it lets the running turn go on
        model.release.set()
        closing.result(WAIT_S)
    finally:
        model.release.set()
        if closing is None:
            control.close()
    with SqlStore(sqlite_url) as store:
        done = store.ledger.get(started.task_id)
    assert done is not None
    assert done.status is TaskStatus.COMPLETED, done.outcome
    assert done.outcome is not None
    assert done.outcome.output == "finished here"
    assert done.recoveries == 0
    assert done.runtime_id == control.runtime_id


class GatedResume(InProcessProvider):
    """Its resume is held until the runtime's close aborts the turn's signal: close lands
    between the resume's ``started`` answer and its run's publication. ``starts``: whether
    the run starts first (the provider returns it) or the start sees the abort and raises."""

    def __init__(self, model: object, *, starts: bool) -> None:
        super().__init__(model)  # type: ignore[arg-type]
        self.starts = starts
        self.entered = threading.Event()

    def resume(self, request: ResumeRequest, signal: CancelSignal) -> SubagentRun:
        run = super().resume(request, signal) if self.starts else None
        self.entered.set()
        assert signal.wait(WAIT_S), "close() never stopped the turn"
        return run if run is not None else super().resume(request, signal)


class FirstTurnThenHeld:
    """Answers the first turn; a later call waits for its signal (the close), bounded."""

    def __init__(self) -> None:
        self.calls = 0

    def complete(self, request: ModelRequest, signal: CancelSignal) -> ModelReply:
        del request
        self.calls += 1
        if self.calls > 1:
            signal.wait(WAIT_S)
            signal.raise_if_aborted()
        return ModelReply(text="first turn done")


def _gate_the_load(monkeypatch: pytest.MonkeyPatch, store: SqlStore) -> threading.Event:
    """Hold the store's next load (the resume's) until `close` aborts a turn's signal: the
    close then lands after the load, before the provider is called. Returns the event set
    once the load is held."""
    entered, closed = threading.Event(), threading.Event()
    abort, load = CancelSignal.abort, store.load

    def abort_noting_close(
        signal: CancelSignal, reason: str, *, cause: ErrorCode | None = None
    ) -> bool:
        if cause is ErrorCode.CLOSED:
            closed.set()
        return abort(signal, reason, cause=cause)

    def held_load(child_id: str) -> LoadedSession:
        monkeypatch.setattr(store, "load", load)  # this one load only
        entered.set()
        assert closed.wait(WAIT_S), "close() never stopped the turn"
        return load(child_id)

    monkeypatch.setattr(CancelSignal, "abort", abort_noting_close)
    monkeypatch.setattr(store, "load", held_load)
    return entered


@pytest.mark.parametrize("window", ["load", "run-started", "start-refused"])
def test_a_close_between_a_resumes_started_and_its_publication_hands_the_task_over(
    store_url: str, window: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = FirstTurnThenHeld()
    gated = GatedResume(model, starts=window == "run-started")
    provider = InProcessProvider(model) if window == "load" else gated
    with SubagentControl.open(store_url) as closing:
        closing.providers.register(provider)
        parent = closing.agents.register("p")
        first = closing.start_continuable(_spec(parent, "do it"))
        assert closing.tasks.wait(first.task_id, timeout=WAIT_S, requester=parent).status is (
            TaskStatus.COMPLETED
        )
        assert closing.store is not None
        entered = _gate_the_load(monkeypatch, closing.store) if window == "load" else gated.entered
        sent = closing.send_message(parent, first.child_id, [TextBlock(text="go on")])
        assert sent.route == "started"
        assert entered.wait(WAIT_S)
    # Handed over: the Task is still running in the store, its turn open for another runtime.
    with SqlStore(store_url) as store:
        left = store.ledger.get(sent.task_id)
    assert left is not None
    assert left.status is TaskStatus.RUNNING, left.outcome
    with SubagentControl.open(store_url, lease_ttl_s=3.0) as survivor:
        survivor.providers.register(InProcessProvider(ScriptedModel(["finished elsewhere"])))
        parent = survivor.agents.register("p")
        done = survivor.tasks.wait(sent.task_id, timeout=WAIT_S, requester=parent)
        assert survivor.store is not None
        events = survivor.store.load(first.child_id).events
    assert done.status is TaskStatus.COMPLETED, done.outcome
    assert done.outcome is not None
    assert done.outcome.output == "finished elsewhere"
    assert done.recoveries == 1
    assert done.runtime_id == survivor.runtime_id
    (opened,) = [
        e for e in events
        if e.kind == EventKind.TURN_START and e.data.get("task_id") == sent.task_id
    ]  # fmt: skip
    turn = [e for e in events if e.turn == opened.turn]
    kinds = [e.kind for e in turn]
    assert kinds.count(EventKind.TURN_END) == 1, kinds
    assert [e.data["text"] for e in turn if e.kind == EventKind.USER_MESSAGE] == ["go on"]


def test_a_kill_between_a_resumes_started_and_its_publication_still_kills(
    sqlite_url: str,
) -> None:
    provider = GatedResume(FirstTurnThenHeld(), starts=True)
    with SubagentControl.open(sqlite_url) as control:
        control.providers.register(provider)
        parent = control.agents.register("p")
        first = control.start_continuable(_spec(parent, "do it"))
        control.tasks.wait(first.task_id, timeout=WAIT_S, requester=parent)
        sent = control.send_message(parent, first.child_id, [TextBlock(text="go on")])
        assert provider.entered.wait(WAIT_S)
        control.tasks.kill(sent.task_id, requester=parent)
        done = control.tasks.wait(sent.task_id, timeout=WAIT_S, requester=parent)
    assert done.status is TaskStatus.KILLED, done.outcome
