"""Optional extras: import one only when the class that needs it is used."""

from __future__ import annotations

import importlib
from types import ModuleType

__all__ = ["require_extra"]


def require_extra(module: str, *, extra: str, needed_by: str) -> ModuleType:
    """Import ``module``, or say which extra to install.

    Raises:
        ImportError: ``module`` is not installed; the message names the install command.
    """
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise ImportError(
            f"{needed_by} needs the optional {module!r} package: "
            f"pip install 'subagent-control[{extra}]'"
        ) from exc
