"""The provider of the crash test, shared by the child process and the test itself.

Every activation writes ``HELD`` tagged events before its run is published: the control plane
holds them and writes them in one batch with the turn's frame, so a torn batch would show as a
turn missing some of them. After publication a ``loop`` child appends ``assistant/message``
events one after another until it is cancelled (or its process is killed), and a ``cycle``
child writes a few and completes. In ``finish`` mode (the test's own process, after the crash)
every run completes at once.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any, Literal

from controlplane import (
    CancelSignal,
    ErrorCode,
    EventKind,
    MessageSource,
    ResumeRequest,
    StartRequest,
    SubagentControlError,
    SubagentResult,
    TextBlock,
    TranscriptWriter,
)

__all__ = ["HELD", "NAME", "CrashProvider", "batch_key"]

NAME = "crashy"
HELD = 40

Mode = Literal["crash", "finish"]


def batch_key(child_id: str, turn: int) -> str:
    """The tag of the held events of one turn."""
    return f"{child_id}:{turn}"


class CrashRun:
    """One activation: loops, cycles or finishes (see the module docstring)."""

    def __init__(
        self,
        child_id: str,
        behaviour: str,
        transcript: TranscriptWriter,
        signal: CancelSignal,
        progress: Callable[[str], None],
    ) -> None:
        self.child_id = child_id
        self.local_agent = None
        self.steer: Callable[[Sequence[TextBlock], MessageSource], None] | None = self._steer
        self._behaviour = behaviour
        self._transcript = transcript
        self._signal = signal
        self._progress = progress
        self._lock = threading.Lock()
        self._settled = False

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
            with self._lock:
                self._settled = True
        if self._signal.aborted:
            return SubagentResult(stop_reason="aborted")
        return SubagentResult(stop_reason="completed", output=[TextBlock(text=f"{step} steps")])

    def dispose(self) -> None:
        """Nothing runs outside `result`, so the run is quiescent once it returned."""
        with self._lock:
            self._settled = True

    def _steer(self, message: Sequence[TextBlock], source: MessageSource) -> None:
        with self._lock:
            if self._settled:
                raise SubagentControlError(
                    ErrorCode.NOT_DELIVERED, "the turn has settled", child_id=self.child_id
                )


class CrashProvider:
    """See the module docstring; ``progress(child_id)`` is called after each loop append."""

    def __init__(self, mode: Mode, progress: Callable[[str], None] | None = None) -> None:
        self._mode = mode
        self._progress = progress or (lambda _child: None)

    @property
    def name(self) -> str:
        """The registry key."""
        return NAME

    def start(self, request: StartRequest, signal: CancelSignal) -> CrashRun:
        """Write the held events, return the run."""
        return self._begin(request, signal)

    def resume(self, request: ResumeRequest, signal: CancelSignal) -> CrashRun:
        """As `start`."""
        return self._begin(request, signal)

    def _begin(self, request: StartRequest | ResumeRequest, signal: CancelSignal) -> CrashRun:
        key = batch_key(request.child_id, request.transcript.turn)
        for index in range(HELD):
            request.transcript.append(
                EventKind.ASSISTANT_MESSAGE, {"text": "held", "batch": key, "i": index}
            )
        inputs: dict[str, Any] = request.descriptor.inputs or {}
        behaviour = "finish" if self._mode == "finish" else str(inputs.get("behaviour", "loop"))
        return CrashRun(request.child_id, behaviour, request.transcript, signal, self._progress)
