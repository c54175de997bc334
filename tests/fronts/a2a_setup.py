"""The ``--setup`` of the A2A front in tests: an `InProcessProvider` on a `ScriptedModel`.

``setup`` echoes at once. ``gated`` makes every model call wait for a line on stdin
(``release``), so a test keeps a turn running while it steers it: the child's loop takes
each steering message before its next model call, and ends once a reply finds nothing
queued. One model serves every child of the process.
"""

from __future__ import annotations

import sys
import threading

from controlplane import InProcessProvider, ScriptedModel, SubagentControl


def setup(control: SubagentControl) -> None:
    """Children answer ``echo: <their last message>`` at once."""
    control.providers.register(InProcessProvider(ScriptedModel(echo=True)))


def gated(control: SubagentControl) -> None:
    """Children's model calls each wait for a ``release`` line on stdin (EOF: all go)."""
    model = ScriptedModel(echo=True, gated=True)
    control.providers.register(InProcessProvider(model))

    def releases() -> None:
        for line in sys.stdin:
            if line.strip() == "release":
                model.release()
        model.release(1_000_000)  # stdin closed: never hold a turn past the test

    threading.Thread(target=releases, name="a2a-setup-releases", daemon=True).start()


def few_descriptors(control: SubagentControl) -> None:
    """`setup`, in a process allowed only 256 open files (`scripted_setup.few_descriptors`)."""
    import resource

    from tests.fronts.scripted_setup import DESCRIPTORS

    setup(control)
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (DESCRIPTORS, hard))
