"""What every protocol front does before it serves: open the control plane from ``--db``
(or ``$SUBAGENT_CONTROL_DB``), register providers (``--setup MODULE:FUNCTION``,
``--openai-model`` or the built-in ``--demo``), say on stderr which provider children
start on (or that none is served), and register the parent session its clients act as.

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

from controlplane.contract import ErrorCode, SubagentControlError
from controlplane.fronts._security import TOKEN_ENV

if TYPE_CHECKING:
    from controlplane.contract import AgentHandle
    from controlplane.runtime._facade import SubagentControl

__all__ = [
    "DB_ENV",
    "DEFAULT_PROVIDER",
    "FrontOptions",
    "Opened",
    "add_db_argument",
    "add_front_arguments",
    "default_provider",
    "load_setup",
    "open_front",
]

DB_ENV: Final = "SUBAGENT_CONTROL_DB"
"""The store URL every command takes when it is given no ``--db``."""
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
        openai_api_key_env: The environment variable that holds the API key for
            ``openai_model`` (None: the SDK's own, ``OPENAI_API_KEY``).
        provider: The provider children are started with (None: `default_provider`).
        demo: Register the built-in demo provider (`controlplane.fronts._demo`).
    """

    db: str
    parent: str
    setup: str | None = None
    openai_model: str | None = None
    openai_base_url: str | None = None
    provider: str | None = None
    openai_api_key_env: str | None = None
    demo: bool = False

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
            openai_api_key_env=args.openai_api_key_env,
            demo=args.demo,
        )


@dataclass(frozen=True, slots=True)
class Opened:
    """An open control plane, the registered parent its clients act as, and the provider."""

    control: SubagentControl
    parent: AgentHandle
    provider: str


def add_db_argument(parser: argparse.ArgumentParser) -> None:
    """Add ``--db URL``, required unless `DB_ENV` is set (read when the parser is made)."""
    from_env = os.environ.get(DB_ENV) or None
    parser.add_argument(
        "--db",
        required=from_env is None,
        default=from_env,
        metavar="URL",
        help="the store URL, e.g. sqlite:///state.db or postgresql://user@host:5432/db "
        f"(default: ${DB_ENV}{', set' if from_env else ''})",
    )


def add_front_arguments(parser: argparse.ArgumentParser, *, default_parent: str) -> None:
    """Add ``--db``, ``--parent``, ``--setup``, ``--demo``, ``--openai-model``,
    ``--openai-base-url``, ``--openai-api-key-env``, ``--provider`` and ``--token`` to a
    front's subcommand."""
    add_db_argument(parser)
    parser.add_argument(
        "--parent",
        default=default_parent,
        metavar="SESSION",
        help="the parent session clients act as; every server on the same store with the "
        "same --parent answers for its children and Tasks (default: %(default)s)",
    )
    add_provider_arguments(parser, openai=True)
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


def add_provider_arguments(parser: argparse.ArgumentParser, *, openai: bool = False) -> None:
    """Add ``--setup`` and ``--demo`` (and, with ``openai``, ``--openai-model``,
    ``--openai-base-url`` and ``--openai-api-key-env``): the providers a command's runtime
    has."""
    parser.add_argument(
        "--setup",
        metavar="MODULE:FUNCTION",
        help="call FUNCTION(control) from MODULE first, to register providers",
    )
    parser.add_argument(
        "--demo",
        action="store_true",
        help="register the built-in demo provider ('demo': a scripted model that calls a "
        "word_count tool, then answers), to try things without a model server",
    )
    if not openai:
        return
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
        "--openai-api-key-env",
        metavar="NAME",
        help="read the API key for --openai-model from this environment variable "
        "(default: OPENAI_API_KEY; a key is never given on the command line)",
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
    """Open the control plane, register its providers and the parent session, and say on
    stderr which provider children start on (or that none is served).

    Nothing is left open when a step fails: the control plane is closed before the error
    propagates.

    Raises:
        SubagentControlError: a bad ``--setup`` or one that raised, more than one of
            ``--setup``, ``--openai-model`` and ``--demo``, a store that cannot be opened,
            or a parent already live in this process.
        ImportError: ``--openai-model`` without the ``openai`` extra.
    """
    control = open_runtime(options, **control_options)
    try:
        parent = control.agents.register(options.parent)
    except BaseException:  # KeyboardInterrupt too: close, then let it end the command
        control.close()
        raise
    opened = Opened(
        control=control, parent=parent, provider=options.provider or default_provider(control)
    )
    _announce(opened)
    return opened


def open_runtime(options: FrontOptions, **control_options: Any) -> SubagentControl:
    """Open the control plane on ``options.db`` with the providers ``options`` name.

    Raises:
        SubagentControlError: as `open_front` (the parent aside).
        ImportError: ``--openai-model`` without the ``openai`` extra.
    """
    from controlplane.runtime._facade import SubagentControl

    given = [flag for flag, on in (("--setup", options.setup), ("--openai-model",
             options.openai_model), ("--demo", options.demo)) if on]  # fmt: skip
    if len(given) > 1:
        many = "both" if len(given) == 2 else "several"
        raise SubagentControlError(
            ErrorCode.INVALID_INPUT, f"give one of {', '.join(given)}, not {many}"
        )
    # Resolved before the store opens: a typo must not leave a runtime behind.
    setup = load_setup(options.setup) if options.setup else None
    control = SubagentControl.open(options.db, **control_options)
    try:
        if setup is not None:
            _run_setup(setup, options.setup or "", control)
        elif options.openai_model:
            _register_openai(control, options)
        elif options.demo:
            from controlplane.fronts._demo import register_demo

            register_demo(control)
    except BaseException:  # KeyboardInterrupt too: close, then let it end the command
        control.close()
        raise
    return control


def _run_setup(setup: Callable[[SubagentControl], object], spec: str, control: Any) -> None:
    """Call the ``--setup`` function; what it raises is a coded error naming it."""
    try:
        setup(control)
    except SubagentControlError:
        raise
    except Exception as exc:  # the user's code: any failure is reported, not a traceback
        raise SubagentControlError(
            ErrorCode.INVALID_INPUT,
            f"--setup {spec} raised {type(exc).__name__}: {exc}; fix it and start again",
        ) from exc


def _announce(opened: Opened) -> None:
    """One line on stderr (stdout may be the protocol): the provider children start on,
    or that none is served, so the first start does not have to tell."""
    names = opened.control.providers.names()
    if not names:
        message = (
            "serving no provider: every start fails UNKNOWN_PROVIDER (the Tasks and children "
            "of the store are still served); give --demo to try it, or --setup "
            "MODULE:FUNCTION or --openai-model NAME"
        )
    elif opened.provider not in names:
        message = (
            f"children start on provider {opened.provider!r}, which is not registered "
            f"(registered: {', '.join(names)}): every start fails UNKNOWN_PROVIDER; "
            "give --provider NAME"
        )
    else:
        message = f"children start on provider {opened.provider!r}"
    print(f"subagent-control: {message}", file=sys.stderr, flush=True)


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
    api_key = None
    if options.openai_api_key_env:
        api_key = os.environ.get(options.openai_api_key_env)
        if not api_key:
            raise SubagentControlError(
                ErrorCode.INVALID_INPUT,
                f"--openai-api-key-env {options.openai_api_key_env}: that environment "
                "variable is not set or empty",
            )
    model = OpenAIChatModel(options.openai_model, base_url=options.openai_base_url, api_key=api_key)
    name = options.provider or DEFAULT_PROVIDER
    control.providers.register(InProcessProvider(model, name=name))
