"""`CancelSignal`: the first reason wins, and a fence marks it `fenced` even after a kill.

A killed activation whose write waited on a silent network was never abandoned when its
runtime fenced itself (the kill's abort came first, and the fence's was refused), so it
outlived the fence while another runtime took its child over (the kernel-fault stress
run's double activations; `tests/reliability/test_fenced_kill.py`).
"""

from __future__ import annotations

from controlplane import CancelSignal, ErrorCode


def test_a_fence_after_a_kill_keeps_the_kills_reason_and_marks_the_signal_fenced() -> None:
    signal = CancelSignal()
    fenced: list[str] = []
    signal.add_fence_callback(fenced.append)
    assert signal.abort("killed by parent")
    assert not signal.fenced
    assert fenced == []

    assert not signal.abort("lease lost", cause=ErrorCode.FENCED)  # the kill's reason wins
    assert (signal.reason, signal.cause) == ("killed by parent", None)
    assert signal.fenced
    assert len(fenced) == 1  # the fence callback ran, once
    signal.abort("lease lost again", cause=ErrorCode.FENCED)
    assert len(fenced) == 1


def test_a_fence_callback_added_after_the_fence_runs_at_once_and_a_kill_runs_none() -> None:
    signal = CancelSignal()
    late: list[str] = []
    signal.abort("lease lost", cause=ErrorCode.FENCED)
    assert signal.fenced
    assert signal.cause is ErrorCode.FENCED
    signal.add_fence_callback(late.append)
    assert late == ["lease lost"]

    killed = CancelSignal()
    never: list[str] = []
    killed.add_fence_callback(never.append)
    killed.abort("killed by parent")
    killed.abort("closing", cause=ErrorCode.CLOSED)
    assert not killed.fenced
    assert never == []
