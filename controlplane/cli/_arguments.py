"""What every subcommand's parser shares: the argument types that refuse a value at parse
time, and the epilog that points at ``--help``'s exit statuses. A module of its own so the
parser (`controlplane.cli._main`) and the servers' subcommands
(`controlplane.cli._serve_commands`) take them from one place, importing one way.
"""

from __future__ import annotations

import argparse
from typing import Final

__all__ = ["SEE_EPILOG", "positive_float", "positive_int"]


SEE_EPILOG: Final = "exit status: see subagent-control --help"


def positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be positive: {text!r}")
    return value


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1: {text!r}")
    return value
