"""How the ``subagent-control`` command ends: its exit statuses, and the exception its
subcommands raise to end with one (`controlplane.cli.main` turns it into the status and a
message on stderr)."""

from __future__ import annotations

from typing import Final

from controlplane.contract import ErrorCode, SubagentControlError

__all__ = [
    "EXIT_ERROR_REPLY",
    "EXIT_FAILURE",
    "EXIT_NOT_FOUND",
    "EXIT_OK",
    "EXIT_UNREACHABLE",
    "EXIT_USAGE",
    "CommandExit",
    "status_of",
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


_BY_CODE: Final = {
    ErrorCode.CHILD_NOT_FOUND: EXIT_NOT_FOUND,
    ErrorCode.REQUEST_NOT_FOUND: EXIT_NOT_FOUND,
    ErrorCode.TASK_NOT_FOUND: EXIT_NOT_FOUND,
    ErrorCode.STORE_NOT_FOUND: EXIT_NOT_FOUND,
    ErrorCode.INVALID_INPUT: EXIT_USAGE,
    ErrorCode.STORE_UNAVAILABLE: EXIT_UNREACHABLE,
    ErrorCode.PERSISTENCE_UNAVAILABLE: EXIT_UNREACHABLE,
    ErrorCode.TIMEOUT: EXIT_UNREACHABLE,
}


def status_of(error: SubagentControlError) -> int:
    """The exit status for an error the control plane or the store raised.

    A store that cannot open because its database driver is not installed reads
    ``STORE_UNAVAILABLE``, but nothing is unreachable: the command was run without the
    extra it needs, a usage problem that installing the extra mends.
    """
    if _caused_by_import(error):
        return EXIT_USAGE
    return _BY_CODE.get(error.code, EXIT_FAILURE)


def _caused_by_import(error: BaseException) -> bool:
    """Whether ``error`` was raised ``from`` an `ImportError` (the store's translation of
    a missing driver), directly or down its chain of causes."""
    seen: set[int] = set()
    cause: BaseException | None = error
    while cause is not None and id(cause) not in seen:  # bounded: a cycle ends it
        if isinstance(cause, ImportError):
            return True
        seen.add(id(cause))
        cause = cause.__cause__
    return False
