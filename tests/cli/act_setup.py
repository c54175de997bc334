"""``--setup`` functions for the CLI tests: the providers a ``send`` resumes a child with."""

from __future__ import annotations

from controlplane import InProcessProvider, ScriptedModel, SubagentControl


def register(control: SubagentControl) -> None:
    """The ``idle`` provider of ``act_holder.py``, answering ``resumed by the cli``."""
    model = ScriptedModel(["resumed by the cli"])
    control.providers.register(InProcessProvider(model, name="idle"))


def explode(control: SubagentControl) -> None:
    """A setup that fails as user code does."""
    raise RuntimeError("no API key in this shell")
