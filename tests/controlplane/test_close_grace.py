"""SPEC §9 "Handover on close": `close()` stops taking work at once, lets running turns go
on for at most ``close_timeout_s``, then hands the rest over. A turn that ends within the
grace completes in the closing runtime (not recovered elsewhere); new work is refused
meanwhile."""

from __future__ import annotations

import threading

import pytest

from controlplane import (
    CancelSignal,
    ContinuableStartSpec,
    ErrorCode,
    InProcessProvider,
    SubagentControl,
    SubagentControlError,
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
