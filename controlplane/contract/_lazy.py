"""A package's public names loaded on first use (PEP 562's module ``__getattr__``).

`controlplane.contract` and `persistence` keep their import cheap this way: a command line
call or a bare ``import persistence`` builds no pydantic model and loads no SQLAlchemy until a
name that needs them is asked for.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Iterable, Mapping
from typing import Any

__all__ = ["loaded_on_first_use"]


def loaded_on_first_use(
    package: str, homes: Mapping[str, str], exported: Iterable[str]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The ``__getattr__`` and ``__dir__`` of ``package``: each name in ``homes`` is imported
    from ``package.<its home module>`` the first time it is asked for, then kept as an
    ordinary attribute of the package."""
    names = frozenset(exported)

    def attribute(name: str) -> Any:
        home = homes.get(name)
        if home is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(f"{package}.{home}"), name)
        setattr(sys.modules[package], name, value)  # once loaded, an ordinary attribute
        return value

    def listing() -> list[str]:
        return sorted(set(vars(sys.modules[package])) | names)

    return attribute, listing
