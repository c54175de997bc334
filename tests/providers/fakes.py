"""Fakes and builders for driving the built-in providers directly (without the facade)."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from controlplane import (
    AgentHandle,
    CancelSignal,
    ChildTool,
    Descriptor,
    InProcessProvider,
    MessageSource,
    ModelSelector,
    ResumeRequest,
    SessionEvent,
    StartRequest,
    SubagentRun,
    TextBlock,
)
from controlplane.contract import AgentRegistry, text_of
from controlplane.models import ModelAdapter

PARENT_MODEL = ModelSelector(provider="parent-provider", model="parent-model")
USER = MessageSource(kind="user")
COORDINATOR = MessageSource(kind="coordinator", sender_session_id="parent-1")
HUMAN = MessageSource(kind="human")
UNREPORTED = {"usage": {"model_calls": 1}, "usage_reported": False}
"""The usage an ``assistant/message`` records for a model call that reported none."""
ONE_TOOL_CALL = {"usage": {"tool_calls": 1}}
"""The usage a ``tool/result`` records."""


@dataclass(frozen=True)
class Written:
    """One event written through the fake transcript writer."""

    kind: str
    data: Any
    source: MessageSource | None


class FakeTranscript:
    """An in-memory `TranscriptWriter` that orders writes the way the control plane does.

    `deliver` steers a run like the control plane: `run.steer` under the writer's lock, then
    the ``steering/message`` record, so the provider's lock order is exercised for real.
    """

    def __init__(self, *, turn: int = 1, fail_with: Exception | None = None) -> None:
        self._turn = turn
        self._fail_with = fail_with
        self._cond = threading.Condition()
        self._written: list[Written] = []

    @property
    def turn(self) -> int:
        return self._turn

    def append(
        self, kind: str, data: Any, *, source: MessageSource | None = None, last: bool = False
    ) -> None:
        with self._cond:
            if self._fail_with is not None:
                raise self._fail_with
            self._written.append(Written(kind, data, source))
            self._cond.notify_all()

    def deliver(self, run: SubagentRun, text: str, source: MessageSource = COORDINATOR) -> None:
        """Steer ``text`` into ``run`` and record it, as the control plane's send does."""
        assert run.steer is not None
        message = [TextBlock(text=text)]
        with self._cond:
            run.steer(message, source)
            self._written.append(Written("steering/message", {"text": text_of(message)}, source))
            self._cond.notify_all()

    @property
    def written(self) -> list[Written]:
        with self._cond:
            return list(self._written)

    def texts(self, kind: str) -> list[str]:
        return [w.data["text"] for w in self.written if w.kind == kind]


class Parent:
    """A registry with one live parent agent, the way the facade sets one up."""

    def __init__(
        self,
        *,
        model: ModelSelector | None = PARENT_MODEL,
        depth: int = 0,
        registry: AgentRegistry | None = None,
    ) -> None:
        self.registry = registry or AgentRegistry()
        self.handle: AgentHandle = self.registry.register("parent-1", model=model, depth=depth)


def new_child_id() -> str:
    return str(uuid.uuid4())


def descriptor(provider: str = "inprocess", **fields: Any) -> Descriptor:
    return Descriptor.build(provider=provider, **fields)


def start_request(
    parent: Parent,
    transcript: FakeTranscript,
    *,
    prompt: str = "do the thing",
    child_id: str | None = None,
    desc: Descriptor | None = None,
    seed: Sequence[SessionEvent] = (),
    source: MessageSource = USER,
) -> StartRequest:
    return StartRequest(
        child_id=child_id or new_child_id(),
        **_request_fields(parent, transcript, prompt, desc, seed, source),
    )


def resume_request(
    parent: Parent,
    transcript: FakeTranscript,
    *,
    child_id: str,
    events: Sequence[SessionEvent],
    prompt: str = "continue",
    desc: Descriptor | None = None,
    seed: Sequence[SessionEvent] = (),
    source: MessageSource = COORDINATOR,
) -> ResumeRequest:
    return ResumeRequest(
        child_id=child_id,
        events=list(events),
        **_request_fields(parent, transcript, prompt, desc, seed, source),
    )


def _request_fields(
    parent: Parent,
    transcript: FakeTranscript,
    prompt: str,
    desc: Descriptor | None,
    seed: Sequence[SessionEvent],
    source: MessageSource,
) -> dict[str, Any]:
    """What a start and a resume request for a child of ``parent`` have in common."""
    return {
        "prompt": [TextBlock(text=prompt)],
        "source": source,
        "parent": parent.handle,
        "descriptor": desc or descriptor(),
        "depth": parent.handle.depth + 1,
        "transcript": transcript,
        "seed": list(seed),
    }


def events(*specs: tuple[str, Any] | tuple[str, Any, MessageSource | None]) -> list[SessionEvent]:
    """Stored events from ``(kind, data[, source])`` specs: seq from 1, all in turn 1."""
    out = []
    for seq, spec in enumerate(specs, start=1):
        kind, data = spec[0], spec[1]
        source = spec[2] if len(spec) > 2 else None
        out.append(
            SessionEvent(
                seq=seq,
                turn=1,
                kind=kind,
                data=data,
                source=source,
                created_at=datetime.now(UTC),
            )
        )
    return out


class Runs:
    """Every run a test launched, disposed at teardown so no loop thread outlives a test."""

    def __init__(self) -> None:
        self._runs: list[SubagentRun] = []

    def add(self, run: SubagentRun) -> SubagentRun:
        self._runs.append(run)
        return run

    def start(
        self,
        model: ModelAdapter,
        transcript: FakeTranscript | None = None,
        signal: CancelSignal | None = None,
        *,
        tools: Sequence[ChildTool] = (),
        **fields: Any,
    ) -> SubagentRun:
        """Start a child of a fresh `Parent` on ``InProcessProvider(model, tools=tools)`` and
        keep its run.

        ``fields`` go to `start_request` (``prompt``, ``desc``, ...).
        """
        request = start_request(Parent(), transcript or FakeTranscript(), **fields)
        provider = InProcessProvider(model, tools=tools)
        return self.add(provider.start(request, signal or CancelSignal()))

    def dispose_all(self) -> None:
        # Every run is disposed even when one fails: a run left gated keeps a non-daemon
        # thread alive and would hang the test process at exit.
        errors: list[Exception] = []
        for run in self._runs:
            try:
                run.dispose()
            except Exception as exc:
                errors.append(exc)
        if errors:
            raise errors[0]


def aborted_signal(reason: str = "killed by test") -> CancelSignal:
    signal = CancelSignal()
    signal.abort(reason)
    return signal
