"""A resume folds the newest supported descriptor of the child's own events and numbers its
turn after the highest one, whether its store's load notes them while decoding (a
`SqlStore`) or hands back a plain list, which the activation walks."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from controlplane import (
    AgentHandle,
    ChildMeta,
    Descriptor,
    EventKind,
    LoadedSession,
    NewEvent,
    SubagentControl,
    TaskStatus,
)
from persistence import SqlStore
from tests.fakes import FakeProvider
from tests.support import PARENT_MODEL, settle, text


class _PlainListStore(SqlStore):
    """A real store whose loads hand the events back as a plain list."""

    def load(self, child_id: str) -> Any:
        loaded = super().load(child_id)
        return LoadedSession(meta=loaded.meta, events=list(loaded.events))


@pytest.fixture(params=[SqlStore, _PlainListStore], ids=["store-notes", "plain-list"])
def control(request: pytest.FixtureRequest, sqlite_url: str) -> Iterator[SubagentControl]:
    control = SubagentControl(request.param(sqlite_url))
    yield control
    control.close(timeout_s=10.0)


def _descriptor(persona: str, *, version: int = 1) -> dict[str, Any]:
    data = Descriptor(provider="fake", persona=persona).to_event_data()
    return {**data, "version": version}


def _stored_child(store: SqlStore) -> str:
    """A forked child whose seed holds a descriptor it must not take, whose turn 1 holds its
    own, whose turn 2 a newer one, whose turn 4 an unsupported one — written out of turn
    order, so its highest turn is not its last event's."""
    child_id = str(uuid.uuid4())
    seed = [NewEvent(kind=EventKind.DESCRIPTOR, turn=0, data=_descriptor("the parent's"))]
    meta = ChildMeta(child_id=child_id, parent_session="parent-1", depth=1, seed_length=1)
    store.create_child(meta, seed)
    for turn, persona, version in ((1, "first", 1), (4, "future", 2), (2, "second", 1)):
        store.append(
            child_id,
            [
                NewEvent(kind=EventKind.TURN_START, turn=turn, data={}),
                NewEvent(
                    kind=EventKind.DESCRIPTOR, turn=turn, data=_descriptor(persona, version=version)
                ),
                NewEvent(kind=EventKind.TURN_END, turn=turn, data={}),
            ],
        )
    return child_id


def test_a_resume_takes_the_newest_own_supported_descriptor_and_the_next_turn(
    control: SubagentControl,
) -> None:
    provider = FakeProvider()
    control.providers.register(provider)
    parent: AgentHandle = control.agents.register("parent-1", model=PARENT_MODEL)
    assert control.store is not None
    child_id = _stored_child(control.store)

    sent = control.send_message(parent, child_id, text("go on"))

    assert settle(control, sent.task_id, parent).status is TaskStatus.COMPLETED
    (request,) = provider.resumes
    assert request.descriptor.persona == "second"
    assert [e.kind for e in request.seed] == [EventKind.DESCRIPTOR]
    starts = [e for e in control.store.load(child_id).events if e.kind == EventKind.TURN_START]
    assert starts[-1].turn == 5
