"""An asyncio front for the control plane: `AsyncSubagentControl` awaits every call that
blocks, holding no thread while a Task runs.

The public home of this name; it is implemented with the other fronts, in
`controlplane.fronts._aio`.
"""

from controlplane.fronts._aio import (
    AsyncSubagentControl,
)

__all__ = [
    "AsyncSubagentControl",
]
