"""``--setup`` functions for the console in the tests: providers for the console process."""

from __future__ import annotations

from controlplane import InProcessProvider, ScriptedModel, SubagentControl


def echo(control: SubagentControl) -> None:
    """An ``inprocess`` provider whose model echoes each message."""
    control.providers.register(InProcessProvider(ScriptedModel(echo=True)))


def raising(control: SubagentControl) -> None:
    """A setup that fails, as a user's may."""
    raise RuntimeError("no model server configured")
