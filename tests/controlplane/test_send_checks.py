"""A send's checks take the usual arguments (ASCII ids and text, the contract's own models)
on a short path, and everything else on the full one: what either refuses, the send
refuses with ``INVALID_INPUT`` before anything is delivered; the message they build
without pydantic checking it again is the one the constructor builds."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from actors import SendMessage
from controlplane import (
    AgentHandle,
    ErrorCode,
    EventKind,
    MessageSource,
    SubagentControl,
    TaskStatus,
    TextBlock,
)
from controlplane.runtime._validate import check_child_id, check_source, message_blocks
from tests.fakes import FakeProvider
from tests.support import carrying, events, raises, running_child, settle, text


@pytest.mark.parametrize(
    "child_id",
    ["x" * 201, "nul\x00id", "surrogate\ud800", "", 7],
    ids=["too-long", "nul", "surrogate", "empty", "int"],
)
def test_a_child_id_the_short_path_does_not_vouch_for_is_refused(child_id: Any) -> None:
    with raises(ErrorCode.INVALID_INPUT):
        check_child_id(child_id)


@pytest.mark.parametrize("child_id", ["c-1", "x" * 200, "café-✓"], ids=["short", "max", "utf8"])
def test_a_usable_child_id_passes_either_path(child_id: str) -> None:
    assert check_child_id(child_id) is child_id


def _block_with(value: Any) -> TextBlock:
    return TextBlock.model_construct(type="text", text=value)


@pytest.mark.parametrize(
    "message",
    [
        [_block_with("lone \ud800")],
        (TextBlock(text="ok"), _block_with("\udfff")),
        [_block_with(42)],
        [TextBlock(text="ok"), {"type": "image"}],
    ],
    ids=["surrogate", "surrogate-second-block", "text-not-str", "foreign-block"],
)
def test_a_message_the_short_path_does_not_vouch_for_is_refused(message: Any) -> None:
    with raises(ErrorCode.INVALID_INPUT):
        message_blocks(message)


def test_a_message_of_text_blocks_passes_as_a_tuple_of_the_same_blocks() -> None:
    blocks = [TextBlock(text="ascii"), TextBlock(text="naïve ✓"), TextBlock(text="nul \x00")]

    assert message_blocks(blocks) == tuple(blocks)
    assert message_blocks(tuple(blocks[:1])) == tuple(blocks[:1])
    assert message_blocks([]) == ()


@pytest.mark.parametrize(
    "source",
    [
        MessageSource(kind="nul\x00kind"),
        MessageSource(kind="coordinator", sender_session_id="nul\x00sender"),
        MessageSource.model_construct(kind="lone \ud800", sender_session_id=None),
        MessageSource.model_construct(kind="coordinator", sender_session_id="\udfff"),
        MessageSource.model_construct(kind=5, sender_session_id=None),
        {"kind": "coordinator"},
    ],
    ids=["nul-kind", "nul-sender", "surrogate-kind", "surrogate-sender", "kind-not-str", "dict"],
)
def test_a_source_the_short_path_does_not_vouch_for_is_refused(source: Any) -> None:
    with raises(ErrorCode.INVALID_INPUT):
        check_source(source)


def test_a_usable_source_passes_either_path() -> None:
    for source in (
        MessageSource(kind="coordinator"),
        MessageSource(kind="human", sender_session_id="parent-1"),
        MessageSource(kind="human", sender_session_id="naïve"),
    ):
        assert check_source(source) is source


def test_a_checked_send_is_the_model_the_constructor_builds(
    control: SubagentControl, parent: AgentHandle
) -> None:
    blocks = (TextBlock(text="hello"),)
    source = MessageSource(kind="coordinator", sender_session_id=parent.session_id)

    built = SendMessage.checked(parent, blocks, source)
    validated = SendMessage(parent=parent, message=blocks, source=source, origin=None)

    assert built == validated
    assert built.model_fields_set == validated.model_fields_set
    assert repr(built) == repr(validated)


@pytest.mark.parametrize(
    ("message", "source"),
    [
        ([_block_with("lone \ud800")], None),
        ([TextBlock(text="fine")], MessageSource(kind="nul\x00kind")),
        (
            [TextBlock(text="fine")],
            MessageSource.model_construct(kind="human", sender_session_id="\ud800"),
        ),
    ],
    ids=["surrogate-text", "nul-source-kind", "surrogate-sender"],
)
def test_a_steer_the_store_could_not_keep_is_refused_before_the_run_has_it(
    control: SubagentControl,
    parent: AgentHandle,
    provider: FakeProvider,
    message: Any,
    source: MessageSource | None,
) -> None:
    release = threading.Event()
    child_id, task_id, _ = running_child(control, parent, provider, release)

    with raises(ErrorCode.INVALID_INPUT):
        control.send_message(parent, child_id, message, source)

    assert provider.steers == []
    control.send_message(parent, child_id, text("then a good one"))
    release.set()
    assert settle(control, task_id, parent).status is TaskStatus.COMPLETED
    kinds = [e.kind for e in events(control, child_id)]
    assert kinds.count(EventKind.STEERING_MESSAGE) == 1
    assert len(carrying(events(control, child_id), "then a good one")) == 1
