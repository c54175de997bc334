"""``--setup`` functions for the console in the tests: providers for the console process."""

from __future__ import annotations

from controlplane import InProcessProvider, ScriptedModel, SubagentControl


def echo(control: SubagentControl) -> None:
    """An ``inprocess`` provider whose model echoes each message."""
    control.providers.register(InProcessProvider(ScriptedModel(echo=True)))
