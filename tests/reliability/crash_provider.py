"""The provider of the crash test, shared by the child process and the test itself.

Every activation writes ``HELD`` tagged events before its run is published: the control plane
holds them and writes them in one batch with the turn's frame, so a torn batch would show as a
turn missing some of them. After publication a ``loop`` child appends ``assistant/message``
events one after another until it is cancelled (or its process is killed), and a ``cycle``
child writes a few and completes. In ``finish`` mode (the test's own process, after the crash)
every run completes at once.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

from controlplane import (
    CancelSignal,
    EventKind,
    ResumeRequest,
    StartRequest,
    SubagentResult,
    TextBlock,
)
from controlplane.contract import TranscriptWriter
from tests.reliability.runs import SettlingRun, SymmetricProvider

__all__ = ["HELD", "NAME", "CrashProvider", "batch_key"]

NAME = "crashy"
HELD = 40

Mode = Literal["crash", "finish"]


def batch_key(child_id: str, turn: int) -> str:
    """The tag of the held events of one turn."""
    return f"{child_id}:{turn}"


class CrashRun(SettlingRun):
    """One activation: loops, cycles or finishes (see the module docstring)."""

    def __init__(
        self,
        child_id: str,
        behaviour: str,
        transcript: TranscriptWriter,
        signal: CancelSignal,
        progress: Callable[[str], None],
    ) -> None:
        super().__init__(child_id)
        self._behaviour = behaviour
        self._transcript = transcript
        self._signal = signal
        self._progress = progress

    def result(self) -> SubagentResult:
        """Append until cancelled (``loop``), a few times (``cycle``), or not at all."""
        step = 0
        try:
            while not self._signal.aborted:
                if self._behaviour == "finish" or (self._behaviour == "cycle" and step >= 5):
                    break
                self._transcript.append(EventKind.ASSISTANT_MESSAGE, {"text": f"step {step}"})
                step += 1
                self._progress(self.child_id)
        finally:
            self._settle()
        if self._signal.aborted:
            return SubagentResult(stop_reason="aborted")
        return SubagentResult(stop_reason="completed", output=[TextBlock(text=f"{step} steps")])

    def dispose(self) -> None:
        """Nothing runs outside `result`, so the run is quiescent once it returned."""
        self._settle()


class CrashProvider(SymmetricProvider[CrashRun]):
    """See the module docstring; ``progress(child_id)`` is called after each loop append."""

    def __init__(self, mode: Mode, progress: Callable[[str], None] | None = None) -> None:
        super().__init__(NAME)
        self._mode = mode
        self._progress = progress or (lambda _child: None)

    def _begin(self, request: StartRequest | ResumeRequest, signal: CancelSignal) -> CrashRun:
        """Write the held events, return the run."""
        key = batch_key(request.child_id, request.transcript.turn)
        for index in range(HELD):
            request.transcript.append(
                EventKind.ASSISTANT_MESSAGE, {"text": "held", "batch": key, "i": index}
            )
        inputs: dict[str, Any] = request.descriptor.inputs or {}
        behaviour = "finish" if self._mode == "finish" else str(inputs.get("behaviour", "loop"))
        return CrashRun(request.child_id, behaviour, request.transcript, signal, self._progress)
