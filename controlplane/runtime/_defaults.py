"""The defaults of `SubagentControl`'s options that its wings also use.

Kept in a module with no imports, so the facade's signature can name them without loading
the wings (the recovery, the budgets), which it builds only when a control plane is built.
"""

from __future__ import annotations

from typing import Final

__all__ = [
    "DEFAULT_MAX_RECOVERIES",
    "DEFAULT_MAX_TOOL_ROUNDS",
    "DEFAULT_NOTICE_AT",
    "PROVIDER_WAIT_S",
]

DEFAULT_MAX_RECOVERIES: Final = 3
"""How many times one Task's turn is recovered, by default, before the next death of its
runtime ends it ``interrupted`` (``max_recoveries=`` of `SubagentControl`)."""
PROVIDER_WAIT_S: Final = 600.0
"""How long past its dead runtime's end (its close, else its last heartbeat) a running
Task whose provider no live runtime has waits for one to open, by default
(``provider_wait_s=`` of `SubagentControl`), before a runtime without it settles it
``interrupted``, naming the provider."""
DEFAULT_NOTICE_AT: Final = 0.8
"""The fraction of a budget's limit whose first crossing sends the parent a notice, by
default (``budget_notice_at=`` of `SubagentControl`)."""
DEFAULT_MAX_TOOL_ROUNDS: Final = 50
"""The most tool rounds a turn may run, by default (``max_tool_rounds=`` of
`SubagentControl`)."""
