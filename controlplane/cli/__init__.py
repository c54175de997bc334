"""The ``subagent-control`` command (`main`): the live actor tree of a running process,
and offline views of the store.

A front end: it imports the contract, the store (only when a command runs) and the admin
socket's wire protocol (`controlplane._admin`), never the facade or the actors, and nothing
below imports it. ``python -m controlplane.cli`` runs it too.
"""

from controlplane.cli._main import main

__all__ = ["main"]
