"""How the ``subagent-control`` command ends: its exit statuses, and the exception its
subcommands raise to end with one (`controlplane.cli.main` turns it into the status and a
message on stderr)."""

from __future__ import annotations

from typing import Final

__all__ = [
    "EXIT_ERROR_REPLY",
    "EXIT_FAILURE",
    "EXIT_NOT_FOUND",
    "EXIT_OK",
    "EXIT_UNREACHABLE",
    "EXIT_USAGE",
    "CommandExit",
]

EXIT_OK: Final = 0
EXIT_FAILURE: Final = 1
EXIT_USAGE: Final = 2
EXIT_NOT_FOUND: Final = 3
EXIT_UNREACHABLE: Final = 4
EXIT_ERROR_REPLY: Final = 5


class CommandExit(Exception):
    """Ends the command with a message on stderr and an exit status; never leaves `main`."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
