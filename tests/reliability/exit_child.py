"""The exit test's child process: a script that opens a control plane, starts a child, and
ends with the child mid-turn, never calling ``close()``.

Usage: ``python tests/reliability/exit_child.py URL MODE``

It prints ``MID <child_id> <task_id>`` once the child's model call runs and its run is
published, then, by MODE:
``return`` returns from ``main``; ``pipe`` prints lines until its reader goes and the
``BrokenPipeError`` kills it (a demo piped to ``head``); ``stuck`` returns from ``main``
while the model call ignores the kill (the exit's bound is all that ends it).

Both waits are needed. The provider starts its loop, so the model is called, before the
control plane publishes the run; a kill landing in between (the close at exit, when ``main``
returns at once) rightly leaves no child (SPEC §5 start 4), and the next process, which
resumes the child, would get ``CHILD_NOT_FOUND``. Published alone is not enough either: the
model must be in its call, so that it is the call that ignores the kill.
"""

from __future__ import annotations

import sys
import threading
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from controlplane import (
    CancelSignal,
    ContinuableStartSpec,
    InProcessProvider,
    ScriptedModel,
    SubagentControl,
    TextBlock,
)
from controlplane.models import (
    ModelReply,
    ModelRequest,
)
from tests.support import wait_published

PARENT = "exit-parent"
PIPE_LINES = 1_000_000


class DeafModel:
    """A model call that never returns and ignores its signal."""

    def __init__(self) -> None:
        self.calls = 0
        self.called = threading.Event()

    def complete(self, request: ModelRequest, signal: CancelSignal) -> ModelReply:
        self.called.set()
        threading.Event().wait()
        raise AssertionError("unreachable")


def main(url: str, mode: str) -> None:
    control = SubagentControl.open(url)
    gated = ScriptedModel(["never released"], gated=True)
    deaf = DeafModel()
    control.providers.register(InProcessProvider(deaf if mode == "stuck" else gated))
    parent = control.agents.register(PARENT)
    started = control.start_continuable(
        ContinuableStartSpec(
            provider="inprocess", label="exit", prompt=[TextBlock(text="go")], parent=parent
        )
    )
    assert deaf.called.wait(10.0) if mode == "stuck" else gated.wait_for_calls(1, 10.0)
    wait_published(control, started.child_id)
    print(f"MID {started.child_id} {started.task_id}", flush=True)
    if mode == "pipe":
        for n in range(PIPE_LINES):  # until the reader goes: BrokenPipeError
            print(f"line {n}", flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:3])
