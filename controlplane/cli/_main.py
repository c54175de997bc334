"""The ``subagent-control`` command: the live actor tree, offline views of the store, a
person's verbs, and the protocol servers.

``tree`` and ``top`` ask a running process over its admin socket; ``children``,
``transcript``, ``tasks`` and ``runtimes`` read the store directly and never start an actor
(they import only ``persistence`` and the contract, and only when they run); ``answer``
writes one answer. ``send`` and ``kill`` open a runtime for the length of the command
(`controlplane.cli._act`). ``mcp`` and ``a2a`` run a control plane: they serve it over MCP
or A2A (`controlplane.fronts`), and load it only when they run. Every ``--db`` defaults to
``$SUBAGENT_CONTROL_DB``.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys
from collections.abc import Callable, Sequence
from typing import IO, Any, Final

from controlplane.cli._arguments import SEE_EPILOG, positive_float, positive_int
from controlplane.cli._exit_status import (
    EXIT_OK,
    EXIT_USAGE,
    CommandExit,
    status_of,
)
from controlplane.cli._serve_commands import add_a2a, add_console, add_mcp
from controlplane.contract import SubagentControlError
from controlplane.fronts import add_db_argument

__all__ = ["main"]

_EPILOG: Final = """\
exit status:
  0  success
  1  any other failure reported by the control plane or the store (its [CODE] is
     printed), e.g. OWNERSHIP_CONFLICT for a turn running in another process on SQLite
  2  usage error, including a malformed --db URL, a missing optional extra or
     database driver (the message names what to install), an id prefix that fits
     more than one id (the first 10 are listed), and a --setup that fails or raises
  3  not found: an unknown child, Task or request (an id, or a prefix of 4+ characters
     that fits none), a SQLite store file, a database, or a store in it, that does not
     exist
  4  unreachable: no socket at --socket, connection refused or timed out, permission
     denied, or the database server cannot be reached
  5  the admin socket answered with an error, or with something that is not a tree
"""


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line and return its exit status (see ``--help`` for the codes)."""
    parser = _parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # argparse exits on --help (0) and on usage errors (2)
        return exc.code if isinstance(exc.code, int) else EXIT_USAGE
    _configure_logging(verbose=getattr(args, "verbose", False))
    try:
        args.run(args, sys.stdout)
    except CommandExit as exc:
        _complain(exc.message)
        return exc.status
    except SubagentControlError as exc:
        _complain(str(exc))
        return status_of(exc)
    except BrokenPipeError:
        # `subagent-control transcript … | head` closed the pipe: not an error.
        _silence_stdout()
        return EXIT_OK
    return EXIT_OK


def _parser() -> argparse.ArgumentParser:
    formatter = argparse.RawDescriptionHelpFormatter
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "-v",
        "--verbose",
        action="store_true",
        # SUPPRESS: a subcommand's default must not undo a -v given before the subcommand.
        default=argparse.SUPPRESS,
        help="also log what the store and the socket client do (retries, …) on stderr",
    )
    parser = argparse.ArgumentParser(
        prog="subagent-control",
        description="Inspect, steer and serve durable subagents: a live process's actor\n"
        "tree (tree, top); a store's children, Tasks and transcripts; a person's message,\n"
        "kill and approval answer; the MCP and A2A servers. Every command is listed\n"
        "below (COMMAND --help tells more); each --db defaults to $SUBAGENT_CONTROL_DB.",
        epilog=_EPILOG,
        formatter_class=formatter,
        parents=[common],
    )
    parser.add_argument("--version", action=_Version)
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    tree = commands.add_parser(
        "tree",
        help="print the live actor tree of a process serving an admin socket",
        description="Ask a running process for its actor tree over the admin socket it "
        "serves (control.serve_admin(PATH)).",
        epilog=SEE_EPILOG,
        formatter_class=formatter,
        parents=[common],
    )
    tree.add_argument("--socket", required=True, metavar="PATH", help="the admin socket")
    tree.add_argument("--json", action="store_true", help="print the ActorTree as JSON")
    tree.add_argument(
        "--timeout",
        type=positive_float,
        default=5.0,
        metavar="SECONDS",
        help="give up after this long, connect to the reply's last byte (default: %(default)s)",
    )
    tree.set_defaults(run=_command("_tree", "run_tree"))

    top = commands.add_parser(
        "top",
        help="watch the live children of a process serving an admin socket",
        description="A live view of a running process's children, one line each (state, "
        "Task, age, held messages, mailbox), refreshed in place; q quits. Rows fit the "
        "terminal: ids shrink to a unique prefix (which every id argument accepts), the "
        "parent session is clipped; --wide shows them whole. When stdout is not a "
        "terminal, prints --iterations plain, uncut frames (default 1) and exits.",
        epilog=SEE_EPILOG,
        formatter_class=formatter,
        parents=[common],
    )
    top.add_argument("--socket", required=True, metavar="PATH", help="the admin socket")
    top.add_argument(
        "--interval",
        type=positive_float,
        default=1.0,
        metavar="SECONDS",
        help="refresh every this long (default: %(default)s)",
    )
    top.add_argument(
        "--iterations",
        type=positive_int,
        metavar="N",
        help="stop after N frames (default: until q on a terminal, else 1)",
    )
    top.add_argument(
        "--timeout",
        type=positive_float,
        default=5.0,
        metavar="SECONDS",
        help="give up on one request after this long (default: %(default)s)",
    )
    top.add_argument(
        "--wide",
        action="store_true",
        help="whole ids and session names, even past the terminal's width",
    )
    top.set_defaults(run=_command("_tree", "run_top"))

    def offline(name: str, help: str, description: str, run: Callable[..., None]) -> Any:
        view = commands.add_parser(
            name,
            help=help,
            description=f"{description} Reads the store only; starts nothing.",
            epilog=SEE_EPILOG,
            formatter_class=formatter,
            parents=[common],
        )
        add_db_argument(view)
        view.add_argument("--json", action="store_true", help="print one JSON object per line")
        view.set_defaults(run=run)
        return view

    children = offline(
        "children",
        "list the children in a store",
        "List the durable children in a store, oldest first.",
        _command("_store", "run_children"),
    )
    children.add_argument("--parent", metavar="ID", help="only the children of this session")
    tasks = offline(
        "tasks",
        "list the Tasks in a store",
        "List the Tasks kept in a store (every runtime's, newest first).",
        _command("_store", "run_tasks"),
    )
    tasks.add_argument("--owner", metavar="SESSION", help="only the Tasks of this session")
    tasks.add_argument(
        "--watch",
        action="store_true",
        help="list them again every --interval (in place on a terminal); Ctrl-C quits",
    )
    _add_refresh(tasks, "list")
    offline(
        "runtimes",
        "list the runtimes that share a store",
        "List every runtime (open SubagentControl) the store knows, oldest first, with "
        "whether it is alive and how many Tasks it runs.",
        _command("_store", "run_runtimes"),
    )

    transcript = commands.add_parser(
        "transcript",
        help="print the transcript of one child",
        description="Print every event of one child, oldest first. Reads the store only; "
        "starts nothing.",
        epilog=SEE_EPILOG,
        formatter_class=formatter,
        parents=[common],
    )
    transcript.add_argument(
        "child", metavar="CHILD", help="the child id, or a unique prefix of it (4+ characters)"
    )
    add_db_argument(transcript)
    transcript.add_argument("--json", action="store_true", help="print one event per line")
    transcript.add_argument(
        "--follow",
        "-f",
        action="store_true",
        help="then print each new event as it is written, until Ctrl-C",
    )
    transcript.add_argument(
        "--interval",
        type=positive_float,
        default=0.5,
        metavar="SECONDS",
        help="with --follow, look for new events this often (default: %(default)s)",
    )
    transcript.set_defaults(run=_command("_store", "run_transcript"))
    _add_answer(commands, formatter, common)
    _add_acts(commands, formatter, common)
    add_mcp(commands, formatter, common)
    add_a2a(commands, formatter, common)
    add_console(commands, formatter, common)
    completion = commands.add_parser(
        "completion",
        help="print a shell completion script (bash or zsh)",
        description="Print a completion script for bash or zsh; load it with "
        "'source <(subagent-control completion bash)' (in ~/.bashrc or ~/.zshrc).",
        epilog=SEE_EPILOG,
        formatter_class=formatter,
        parents=[common],
    )
    completion.add_argument("shell", choices=("bash", "zsh"), help="the shell")
    completion.set_defaults(run=lambda args, out: _completion(parser, args.shell, out))
    return parser


def _add_refresh(parser: argparse.ArgumentParser, what: str) -> None:
    parser.add_argument(
        "--interval",
        type=positive_float,
        default=1.0,
        metavar="SECONDS",
        help=f"with --watch, {what} again this often (default: %(default)s)",
    )
    parser.add_argument(
        "--iterations",
        type=positive_int,
        metavar="N",
        help="with --watch, stop after N frames (default: until Ctrl-C on a terminal, else 1)",
    )


def _add_acts(commands: Any, formatter: type[argparse.HelpFormatter], common: Any) -> None:
    from controlplane.fronts import add_provider_arguments

    send = commands.add_parser(
        "send",
        help="send a child a message, as a person (it steers or resumes the child)",
        description="Send TEXT to CHILD as a person (MessageSource kind 'human'), under the "
        "child's parent session. Prints 'steered task ID' when its running turn took it "
        "(in any process on PostgreSQL; on SQLite a turn running in another process "
        "refuses OWNERSHIP_CONFLICT, naming it), or 'started task ID' when the idle child "
        "resumed. With the child's provider (--setup or --demo) a resumed turn runs in this "
        "command, which waits for it to settle; without it the message is durable all the "
        "same, and the turn waits (queued) for a runtime with the provider, which runs it.",
        epilog=SEE_EPILOG,
        formatter_class=formatter,
        parents=[common],
    )
    send.add_argument(
        "child", metavar="CHILD", help="the child id, or a unique prefix of it (4+ characters)"
    )
    send.add_argument("text", metavar="TEXT", help="the message")
    add_db_argument(send)
    add_provider_arguments(send)
    send.add_argument(
        "--as", dest="who", metavar="NAME", help="who sends (default: cli:<your user name>)"
    )
    _add_timeout(send, "for a turn started here to settle", 600.0)
    send.set_defaults(run=_command("_act", "run_send"))

    kill = commands.add_parser(
        "kill",
        help="kill a running Task, in whichever process runs it",
        description="Kill TASK as its owner session and wait until it reads settled. A Task "
        "running in another live process is killed there on PostgreSQL; on SQLite that "
        "refuses OWNERSHIP_CONFLICT, naming the process. A dead runtime's Task reads "
        "interrupted.",
        epilog=SEE_EPILOG,
        formatter_class=formatter,
        parents=[common],
    )
    kill.add_argument(
        "task", metavar="TASK", help="the Task id, or a unique prefix of it (4+ characters)"
    )
    add_db_argument(kill)
    kill.set_defaults(setup=None, demo=False)
    _add_timeout(kill, "for the Task to settle", 30.0)
    kill.set_defaults(run=_command("_act", "run_kill"))


def _add_timeout(parser: argparse.ArgumentParser, what: str, default: float) -> None:
    parser.add_argument(
        "--timeout",
        type=positive_float,
        default=default,
        metavar="SECONDS",
        help=f"wait at most this long {what} (default: %(default)s)",
    )


def _add_answer(commands: Any, formatter: type[argparse.HelpFormatter], common: Any) -> None:
    answer = commands.add_parser(
        "answer",
        help="answer a child's approval request, as a person",
        description="Allow or deny the tool call a child waits to run (its Task reads "
        "input_required; 'tasks --db' shows it with request=ID). The run waiting for it "
        "takes the answer; a parked Task is continued by a live runtime that has its "
        "child's provider. Writes the answer only.",
        epilog=SEE_EPILOG,
        formatter_class=formatter,
        parents=[common],
    )
    answer.add_argument(
        "request",
        metavar="REQUEST",
        help="the approval request's id, or the id of the Task that waits on it (or a unique "
        "prefix of either, 4+ characters); 'tasks' shows each waiting Task's request=ID",
    )
    add_db_argument(answer)
    verdict = answer.add_mutually_exclusive_group(required=True)
    verdict.add_argument("--allow", dest="allow", action="store_true", help="run the tool")
    verdict.add_argument("--deny", dest="allow", action="store_false", help="refuse it")
    answer.add_argument("--note", help="why, for the child's model to read")
    answer.add_argument(
        "--as", dest="who", metavar="NAME", help="who answers (default: cli:<your user name>)"
    )
    answer.set_defaults(run=_command("_answer", "run_answer"))


def _command(module: str, name: str) -> Callable[[argparse.Namespace, IO[str]], None]:
    """The command ``controlplane.cli.<module>.<name>``, imported when it runs: building
    the parser (and ``--help``) loads none of the commands' modules, nor what they import
    (the store, pydantic, the admin socket's client)."""

    def run(args: argparse.Namespace, out: IO[str]) -> None:
        command: Callable[[argparse.Namespace, IO[str]], None]
        command = getattr(importlib.import_module(f"controlplane.cli.{module}"), name)
        command(args, out)

    return run


def _completion(parser: argparse.ArgumentParser, shell: str, out: IO[str]) -> None:
    from controlplane.cli._completion import run_completion

    run_completion(parser, shell, out)


class _Version(argparse.Action):
    """``--version``: the installed version, looked up only when asked for (reading the
    package metadata costs more than building the whole parser)."""

    def __init__(self, option_strings: Sequence[str], dest: str) -> None:
        super().__init__(
            option_strings,
            dest,
            nargs=0,
            default=argparse.SUPPRESS,
            help="show program's version number and exit",  # argparse's own wording
        )

    def __call__(self, parser: argparse.ArgumentParser, *_: object) -> None:
        sys.stdout.write(f"{parser.prog} {_version()}\n")
        parser.exit()


def _version() -> str:
    import importlib.metadata

    try:
        return importlib.metadata.version("subagent-control")
    except importlib.metadata.PackageNotFoundError:  # run from a checkout, not installed
        return "unknown"


def _configure_logging(*, verbose: bool) -> None:
    root = logging.getLogger()
    if verbose:
        logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")
    elif not root.handlers:
        # Without a handler, Python prints every library warning (each store retry) on
        # stderr; the outcome is reported once, as the command's own message.
        root.addHandler(logging.NullHandler())


def _complain(message: str) -> None:
    print(f"subagent-control: {message}", file=sys.stderr)


def _silence_stdout() -> None:
    # Python flushes stdout at exit and would report the broken pipe again.
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)


if __name__ == "__main__":
    sys.exit(main())
