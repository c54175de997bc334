"""The ``subagent-control`` command (`main`): the live actor tree of a running process,
offline views of the store, and the MCP front (``mcp``).

A front end: it imports the contract, the store (only when a command runs) and the admin
socket's wire protocol (`controlplane.runtime._admin`), never the facade or the actors but through
``mcp`` (`controlplane.fronts`, loaded only when it runs), and nothing below imports it.
``python -m controlplane.cli`` runs it too.
"""

from controlplane.cli._main import main

__all__ = ["main"]
