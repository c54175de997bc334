"""The activation record's phases (actors._record): one transition function on the
supervisor's thread; a recovered or handed-over activation is a phase of the record, not a
flag elsewhere, and its view says which."""

from __future__ import annotations

from actors._inbox import ActivationInbox
from actors._record import Activation, ActivationSlot
from actors.messages import ActivationPlan
from controlplane import CancelSignal, MessageSource, TextBlock
from controlplane.contract import NO_TRACE, AgentHandle, AgentRegistry
from controlplane.telemetry import Telemetry


def _activation(recovery: int = 0) -> Activation:
    signal = CancelSignal()
    plan = ActivationPlan(
        kind="continued" if recovery else "resumed",
        task_id="t1",
        child_id="c1",
        parent=AgentHandle(AgentRegistry(), "p", model=None, depth=0),
        prompt=(TextBlock(text="x"),),
        source=MessageSource(kind="coordinator", sender_session_id="p"),
        signal=signal,
        label="x",
        recovery=recovery,
    )
    inbox = ActivationInbox(
        "c1", "t1", signal=signal, trace=NO_TRACE, telemetry=Telemetry("test-runtime")
    )
    return Activation(plan=plan, inbox=inbox, agent_mark=0, slot=ActivationSlot())


def test_an_activation_moves_forward_only_and_its_view_says_where() -> None:
    record = _activation(recovery=2)
    assert record.publish_view().phase == "admitted"
    assert record.publish_view().recovery == 2
    assert not record.advance("handed_over")  # not from admitted: it never ran here
    assert record.advance("published")
    assert not record.advance("admitted")
    assert record.advance("settling")
    assert record.settling
    assert record.advance("handed_over")
    assert not record.advance("ended")  # final
    view = record.publish_view()
    assert (view.phase, view.settling) == ("handed_over", True)


def test_an_activation_that_fails_before_publication_ends_from_admitted() -> None:
    record = _activation()
    assert record.advance("ended")
    assert not record.advance("published")
    assert record.publish_view().phase == "ended"
