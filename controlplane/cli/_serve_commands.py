"""The subcommands that serve a control plane: ``console`` (a web page for a person),
``a2a`` and ``mcp`` (the protocol fronts). Each one's parser is built with the others',
but what it serves (`controlplane.fronts`, a web server, an SDK) is imported only when it
runs, and a missing optional extra is a usage error naming it. Apart from the parser
(`controlplane.cli._main`) because these three share that way of loading what they serve
and nothing else does.
"""

from __future__ import annotations

import argparse
import importlib
from typing import Any, Final, TextIO

from controlplane.cli._arguments import SEE_EPILOG, positive_int
from controlplane.cli._exit_status import EXIT_USAGE, CommandExit
from controlplane.fronts import add_db_argument

__all__ = ["add_a2a", "add_console", "add_mcp"]


_A2A_PACKAGES: Final = frozenset({"a2a", "uvicorn", "starlette", "sse_starlette", "google"})
"""What the ``a2a`` extra brings: a missing one is reported as the extra to install."""


_CONSOLE_PACKAGES: Final = frozenset({"uvicorn", "starlette", "anyio", "h11"})
"""What the ``console`` extra brings: a missing one is reported as the extra to install."""


def add_console(commands: Any, formatter: type[argparse.HelpFormatter], common: Any) -> None:
    from controlplane.fronts import add_provider_arguments

    console = commands.add_parser(
        "console",
        help="serve a web page where a person watches and answers every child",
        description="Serve the console on HOST:PORT: every child grouped under 'Needs you', "
        "'Working' and 'Completed', each child's transcript as it grows, its approval "
        "requests (Allow/Deny), Kill, and a Message box that sends as a person; the runtimes "
        "and queues; the same as JSON under /api/. Reads the store, so any process on it "
        "may serve it. Says on stderr which providers it serves (they run the turns a "
        "message resumes here), prints http://HOST:PORT/ once listening; serves until "
        "SIGINT or SIGTERM; -v logs one line per request. Loopback by default; any other "
        "address requires a token. Needs the 'console' extra.",
        epilog=SEE_EPILOG,
        formatter_class=formatter,
        parents=[common],
    )
    add_db_argument(console)
    console.add_argument(
        "--http",
        default="127.0.0.1:8765",
        metavar="HOST:PORT",
        help="where to listen (default: %(default)s; port 0: any)",
    )
    console.add_argument(
        "--token",
        metavar="T",
        help="the token a browser shows (open /?token=T once) or a script sends as a bearer "
        "token; else $SUBAGENT_CONTROL_TOKEN; generated into a 0600 file when the address "
        "is not loopback",
    )
    # The providers as every front takes them: they run the turns a message resumes here.
    add_provider_arguments(console, openai=True)
    console.set_defaults(run=_run_console)


def _run_console(args: argparse.Namespace, out: Any) -> None:
    # Imported here: the other commands load neither the runtime nor the web server.
    from controlplane.fronts import FrontOptions

    options = FrontOptions(
        db=args.db,
        parent="",  # the console acts as each child's own parent session
        setup=args.setup,
        openai_model=args.openai_model,
        openai_base_url=args.openai_base_url,
        openai_api_key_env=args.openai_api_key_env,
        demo=args.demo,
    )
    serve_console = _from_extra("controlplane.fronts._console", "serve_console", "console",
                                _CONSOLE_PACKAGES)  # fmt: skip
    try:
        serve_console(options, http=args.http, token=args.token, out=out)
    except ImportError as exc:  # --openai-model without the openai extra: it names it
        raise CommandExit(EXIT_USAGE, str(exc)) from None
    except KeyboardInterrupt:
        pass  # Ctrl-C ends a server: not an error


def add_a2a(commands: Any, formatter: type[argparse.HelpFormatter], common: Any) -> None:
    from controlplane.fronts import MAX_BODY_BYTES, add_front_arguments

    a2a = commands.add_parser(
        "a2a",
        help="serve the control plane to A2A clients (HTTP JSON-RPC)",
        description="Serve A2A on HOST:PORT: a context is a child, a task one of its Tasks; "
        "a message to a working task steers it. Prints 'ready URL' once listening; serves "
        "until SIGINT or SIGTERM. Loopback by default; any other address requires a bearer "
        "token. Needs the 'a2a' extra.",
        epilog=SEE_EPILOG,
        formatter_class=formatter,
        parents=[common],
    )
    add_front_arguments(a2a, default_parent="a2a")
    a2a.add_argument(
        "--http", required=True, metavar="HOST:PORT", help="where to listen (port 0: any)"
    )
    a2a.add_argument(
        "--max-body",
        type=positive_int,
        default=MAX_BODY_BYTES,
        metavar="BYTES",
        help="refuse larger request bodies with 413 (default: %(default)s)",
    )
    a2a.set_defaults(run=_run_a2a)


def _run_a2a(args: argparse.Namespace, out: Any) -> None:
    # Imported here: the other commands load neither the runtime nor the A2A SDK.
    from controlplane.fronts import FrontOptions

    serve_a2a = _from_extra("controlplane.fronts._a2a", "serve_a2a", "a2a", _A2A_PACKAGES)
    serve_a2a(
        FrontOptions.from_args(args),
        http=args.http,
        token=args.token,
        max_body=args.max_body,
        out=out,
    )


def add_mcp(commands: Any, formatter: type[argparse.HelpFormatter], common: Any) -> None:
    # The front is imported only when the command runs: the other commands never load
    # the facade, and the `mcp` extra may be missing.
    from controlplane.fronts import add_front_arguments

    mcp = commands.add_parser(
        "mcp",
        help="serve the subagent tools over MCP (stdio, or streamable HTTP)",
        description="Serve the subagent tools (subagent, send_message, task_output, ...) "
        "as an MCP server whose clients act as one parent session. stdio by default; "
        "--http serves streamable HTTP at HOST:PORT/mcp (loopback by default; any other "
        "address requires a bearer token). Needs the mcp extra: "
        "pip install 'subagent-control[mcp]'.",
        epilog=SEE_EPILOG,
        formatter_class=formatter,
        parents=[common],
    )
    add_front_arguments(mcp, default_parent="mcp")
    transport = mcp.add_mutually_exclusive_group()
    transport.add_argument(
        "--stdio", action="store_true", help="serve one client over stdin/stdout (the default)"
    )
    transport.add_argument(
        "--http", metavar="HOST:PORT", help="serve streamable HTTP at http://HOST:PORT/mcp"
    )
    mcp.set_defaults(run=_run_mcp)


def _run_mcp(args: argparse.Namespace, out: TextIO) -> None:
    from controlplane.fronts import FrontOptions, serve_mcp

    try:
        serve_mcp(FrontOptions.from_args(args), http=args.http, token=args.token, out=out)
    except ImportError as exc:
        raise CommandExit(EXIT_USAGE, str(exc)) from None
    except KeyboardInterrupt:
        pass  # Ctrl-C ends a server: not an error


def _from_extra(module: str, name: str, extra: str, packages: frozenset[str]) -> Any:
    """``module.name``, imported only now (the other commands load neither the runtime nor
    a web server); a missing package of the optional ``extra`` is a usage error naming it."""
    try:
        return getattr(importlib.import_module(module), name)
    except ImportError as exc:
        if (exc.name or "").split(".")[0] not in packages:
            raise
        raise CommandExit(
            EXIT_USAGE,
            f"the {extra} command needs the optional {exc.name!r} package: "
            f"pip install 'subagent-control[{extra}]'",
        ) from exc
