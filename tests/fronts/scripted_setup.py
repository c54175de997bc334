"""``--setup`` functions for the MCP front's tests: deterministic in-process providers.

- ``echo``: an `InProcessProvider` on an echoing `ScriptedModel` (``echo: <last message>``).
- ``slow``: the same, each model call taking `SLOW_S` (a kill ends it at once), so a test
  sees a Task that is still working, and cancels or crashes under it.
"""

from __future__ import annotations

from typing import Final

from controlplane import InProcessProvider, ScriptedModel, SubagentControl

SLOW_S: Final = 30.0


def echo(control: SubagentControl) -> None:
    """Children answer ``echo: <the last message>`` at once."""
    control.providers.register(InProcessProvider(ScriptedModel(echo=True)))


def slow(control: SubagentControl) -> None:
    """Children answer after `SLOW_S` seconds, unless killed first."""
    control.providers.register(InProcessProvider(ScriptedModel(echo=True, delay_s=SLOW_S)))


def failing(control: SubagentControl) -> None:
    """Every model call fails: the Task fails with the model's words."""
    control.providers.register(
        InProcessProvider(ScriptedModel([RuntimeError("the model is down")]))
    )


def few_descriptors(control: SubagentControl) -> None:
    """`echo`, in a process allowed only `DESCRIPTORS` open files (a front that held a
    connection per slow client ran out of them long before the usual 1,024)."""
    import resource

    echo(control)
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (DESCRIPTORS, hard))


DESCRIPTORS = 256
