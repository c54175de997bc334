"""What every protocol front does before it serves: open the control plane from ``--db``,
register providers (``--setup MODULE:FUNCTION`` or ``--openai-model``), choose the one
children start on, and register the parent session its clients act as.

Front-agnostic on purpose: the MCP front and the A2A front share these flags and this
order, so a deployment configured for one serves the other the same way.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

from controlplane.contract import AgentHandle, ErrorCode, SubagentControlError
from controlplane.fronts._security import TOKEN_ENV

if TYPE_CHECKING:
    from controlplane._facade import SubagentControl

__all__ = [
    "DEFAULT_PROVIDER",
    "FrontOptions",
    "Opened",
    "add_front_arguments",
    "default_provider",
    "load_setup",
    "open_front",
]

DEFAULT_PROVIDER: Final = "inprocess"
"""The provider children start on when ``--provider`` names none and several (or none) are
registered."""


@dataclass(frozen=True, slots=True)
class FrontOptions:
    """How a front opens its control plane.

    Attributes:
        db: The store URL.
        parent: The session id the front's clients act as.
        setup: ``MODULE:FUNCTION`` called with the open control plane, or None.
        openai_model: Register an `InProcessProvider` on `OpenAIChatModel` with this model.
        openai_base_url: The Chat Completions server for ``openai_model``.
        provider: The provider children are started with (None: `default_provider`).
    """

    db: str
    parent: str
    setup: str | None = None
    openai_model: str | None = None
    openai_base_url: str | None = None
    provider: str | None = None

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> FrontOptions:
        """The options `add_front_arguments` parsed."""
        return cls(
            db=args.db,
            parent=args.parent,
            setup=args.setup,
            openai_model=args.openai_model,
            openai_base_url=args.openai_base_url,
            provider=args.provider,
        )


@dataclass(frozen=True, slots=True)
class Opened:
    """An open control plane, the registered parent its clients act as, and the provider."""

    control: SubagentControl
    parent: AgentHandle
    provider: str


def add_front_arguments(parser: argparse.ArgumentParser, *, default_parent: str) -> None:
    """Add ``--db``, ``--parent``, ``--setup``, ``--openai-model``, ``--openai-base-url``,
    ``--provider`` and ``--token`` to a front's subcommand."""
    parser.add_argument(
        "--db",
        required=True,
        metavar="URL",
        help="the store URL, e.g. sqlite:///state.db or postgresql+psycopg://user@host:5432/db",
    )
    parser.add_argument(
        "--parent",
        default=default_parent,
        metavar="SESSION",
        help="the parent session clients act as; every server on the same store with the "
        "same --parent answers for its children and Tasks (default: %(default)s)",
    )
    parser.add_argument(
        "--setup",
        metavar="MODULE:FUNCTION",
        help="call FUNCTION(control) from MODULE before serving, to register providers",
    )
    parser.add_argument(
        "--openai-model",
        metavar="NAME",
        help="register an in-process provider on this Chat Completions model instead",
    )
    parser.add_argument(
        "--openai-base-url",
        metavar="URL",
        help="the Chat Completions server for --openai-model (default: OpenAI's)",
    )
    parser.add_argument(
        "--provider",
        metavar="NAME",
        help="the provider children are started with (default: the only one registered, "
        f"else {DEFAULT_PROVIDER})",
    )
    parser.add_argument(
        "--token",
        metavar="TOKEN",
        help=f"the bearer token HTTP clients must send (default: ${TOKEN_ENV}; a "
        "non-loopback bind without one gets a generated token in a new 0600 file in the "
        "temporary directory, whose path is printed)",
    )


def load_setup(spec: str) -> Callable[[SubagentControl], object]:
    """The function ``MODULE:FUNCTION`` names (the working directory is searched too).

    Raises:
        SubagentControlError: ``INVALID_INPUT`` when ``spec`` is malformed, the module does
            not import, or it has no such callable.
    """
    module_name, sep, function_name = spec.partition(":")
    if not sep or not module_name or not function_name:
        raise SubagentControlError(
            ErrorCode.INVALID_INPUT, f"--setup must read MODULE:FUNCTION, not {spec!r}"
        )
    # As uvicorn's MODULE:APP does: a module in the working directory is found, also when
    # the command runs as a console script (whose sys.path does not hold the directory).
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise SubagentControlError(
            ErrorCode.INVALID_INPUT, f"--setup: cannot import {module_name!r}: {exc}"
        ) from exc
    function: Any = getattr(module, function_name, None)
    if not callable(function):
        raise SubagentControlError(
            ErrorCode.INVALID_INPUT, f"--setup: {module_name!r} has no function {function_name!r}"
        )
    return function  # type: ignore[no-any-return]


def open_front(options: FrontOptions, **control_options: Any) -> Opened:
    """Open the control plane, register its providers and the parent session.

    Nothing is left open when a step fails: the control plane is closed before the error
    propagates.

    Raises:
        SubagentControlError: a bad ``--setup``, both ``--setup`` and ``--openai-model``,
            a store that cannot be opened, or a parent already live in this process.
        ImportError: ``--openai-model`` without the ``openai`` extra.
    """
    from controlplane._facade import SubagentControl

    if options.setup and options.openai_model:
        raise SubagentControlError(
            ErrorCode.INVALID_INPUT, "give --setup or --openai-model, not both"
        )
    # Resolved before the store opens: a typo must not leave a runtime behind.
    setup = load_setup(options.setup) if options.setup else None
    control = SubagentControl.open(options.db, **control_options)
    try:
        if setup is not None:
            setup(control)
        elif options.openai_model:
            _register_openai(control, options)
        parent = control.agents.register(options.parent)
    except BaseException:  # KeyboardInterrupt too: close, then let it end the command
        control.close()
        raise
    return Opened(
        control=control, parent=parent, provider=options.provider or default_provider(control)
    )


def default_provider(control: SubagentControl) -> str:
    """The provider children start on when none is named: the only one registered, else
    `DEFAULT_PROVIDER` (a start then fails ``UNKNOWN_PROVIDER`` if it is not registered;
    the front still serves the session's Tasks)."""
    names = control.providers.names()
    return names[0] if len(names) == 1 else DEFAULT_PROVIDER


def _register_openai(control: SubagentControl, options: FrontOptions) -> None:
    from controlplane.models import OpenAIChatModel
    from controlplane.providers import InProcessProvider

    assert options.openai_model is not None
    model = OpenAIChatModel(options.openai_model, base_url=options.openai_base_url)
    name = options.provider or DEFAULT_PROVIDER
    control.providers.register(InProcessProvider(model, name=name))
