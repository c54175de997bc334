"""Local delivery's tries (`actors._delivery.deliver`): a send is passed on to the child's
next supervisor, and when the tries run out the error names why they did."""

from __future__ import annotations

from typing import Any, cast

import pytest

from actors import RoutingTable
from actors._delivery import deliver
from actors.messages import SendMessage
from controlplane import ErrorCode
from controlplane.contract import ParkedTask, SubagentControlError


class _Refusing:
    """A supervisor (and the root) that refuses every send as ``refusal`` says."""

    def __init__(self, refusal: type[Exception] | None) -> None:
        self.refusal = refusal
        self.sends = 0
        self.supervisor = self

    def send(self, _send: SendMessage) -> None:
        self.sends += 1
        if self.refusal is ParkedTask:
            raise ParkedTask(child_id="c1", task_id="t-parked")
        return None  # retired without handling it

    def get(self, _child_id: str) -> _Refusing:
        return self

    def route_send(self, _child_id: str, send: SendMessage) -> None:
        return self.send(send)


def _deliver(refusing: _Refusing) -> SubagentControlError:
    with pytest.raises(SubagentControlError) as caught:
        deliver(
            cast(RoutingTable, refusing),
            cast(Any, refusing),
            "c1",
            cast(SendMessage, None),
            check_open=lambda: None,
        )
    return caught.value


def test_tries_that_end_refused_by_a_parked_run_raise_that_refusal_not_a_retiring_one() -> None:
    refusing = _Refusing(ParkedTask)

    error = _deliver(refusing)

    assert isinstance(error, ParkedTask)
    assert error.code is ErrorCode.NOT_DELIVERED
    assert "approval" in str(error)
    assert "retiring" not in str(error)
    assert 1 < refusing.sends <= 16  # bounded


def test_tries_that_end_at_a_retiring_supervisor_say_it_kept_retiring() -> None:
    refusing = _Refusing(None)

    error = _deliver(refusing)

    assert error.code is ErrorCode.NOT_DELIVERED
    assert "kept retiring" in str(error)
