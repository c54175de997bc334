"""The ``subagent-control`` command: the live actor tree, and offline views of the store.

``tree`` and ``top`` ask a running process over its admin socket; ``children``,
``transcript``, ``tasks`` and ``runtimes`` read the store directly and never start an actor
(they import only ``persistence`` and the contract, and only when they run).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import socket
import stat
import sys
import threading
import time
from collections.abc import Callable, Sequence
from typing import IO, TYPE_CHECKING, Any, Final, TypeVar

from pydantic import BaseModel, ValidationError

from controlplane._admin import TREE_OP, encode_line
from controlplane._errors import ErrorCode, SubagentControlError
from controlplane._session import SessionEvent, utcnow
from controlplane._tree import ActorTree, escape_controls

if TYPE_CHECKING:
    from persistence import SqlStore

__all__ = [
    "EXIT_ERROR_REPLY",
    "EXIT_FAILURE",
    "EXIT_NOT_FOUND",
    "EXIT_OK",
    "EXIT_UNREACHABLE",
    "EXIT_USAGE",
    "main",
]

EXIT_OK: Final = 0
EXIT_FAILURE: Final = 1
EXIT_USAGE: Final = 2
EXIT_NOT_FOUND: Final = 3
EXIT_UNREACHABLE: Final = 4
EXIT_ERROR_REPLY: Final = 5

_EPILOG: Final = """\
exit status:
  0  success
  1  any other failure reported by the control plane or the store
  2  usage error, including a malformed --db URL
  3  not found: an unknown child, or a SQLite store file that does not exist
  4  unreachable: no socket at --socket, connection refused or timed out, permission
     denied, or the database server cannot be reached
  5  the admin socket answered with an error, or with something that is not a tree
"""

_MAX_REPLY_BYTES: Final = 256 * 1024 * 1024

_EXIT_BY_CODE: Final = {
    ErrorCode.CHILD_NOT_FOUND: EXIT_NOT_FOUND,
    ErrorCode.INVALID_INPUT: EXIT_USAGE,
    ErrorCode.STORE_UNAVAILABLE: EXIT_UNREACHABLE,
    ErrorCode.PERSISTENCE_UNAVAILABLE: EXIT_UNREACHABLE,
    ErrorCode.TIMEOUT: EXIT_UNREACHABLE,
}


class _Exit(Exception):
    """Ends the command with a message on stderr and an exit status; never leaves `main`."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


M = TypeVar("M", bound=BaseModel)


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
    except _Exit as exc:
        _complain(exc.message)
        return exc.status
    except SubagentControlError as exc:
        _complain(str(exc))
        return _EXIT_BY_CODE.get(exc.code, EXIT_FAILURE)
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
        description="Inspect a subagent-control runtime (tree) or its store (children, "
        "transcript).",
        epilog=_EPILOG,
        formatter_class=formatter,
        parents=[common],
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    tree = commands.add_parser(
        "tree",
        help="print the live actor tree of a process serving an admin socket",
        description="Ask a running process for its actor tree over the admin socket it "
        "serves (control.serve_admin(PATH)).",
        epilog=_EPILOG,
        formatter_class=formatter,
        parents=[common],
    )
    tree.add_argument("--socket", required=True, metavar="PATH", help="the admin socket")
    tree.add_argument("--json", action="store_true", help="print the ActorTree as JSON")
    tree.add_argument(
        "--timeout",
        type=_positive_float,
        default=5.0,
        metavar="SECONDS",
        help="give up after this long (default: %(default)s)",
    )
    tree.set_defaults(run=_run_tree)

    top = commands.add_parser(
        "top",
        help="watch the live children of a process serving an admin socket",
        description="A live view of a running process's children, one line each (state, "
        "Task, age, held messages, mailbox), refreshed in place; q quits. When stdout is "
        "not a terminal, prints --iterations plain frames (default 1) and exits.",
        epilog=_EPILOG,
        formatter_class=formatter,
        parents=[common],
    )
    top.add_argument("--socket", required=True, metavar="PATH", help="the admin socket")
    top.add_argument(
        "--interval",
        type=_positive_float,
        default=1.0,
        metavar="SECONDS",
        help="refresh every this long (default: %(default)s)",
    )
    top.add_argument(
        "--iterations",
        type=_positive_int,
        metavar="N",
        help="stop after N frames (default: until q on a terminal, else 1)",
    )
    top.add_argument(
        "--timeout",
        type=_positive_float,
        default=5.0,
        metavar="SECONDS",
        help="give up on one request after this long (default: %(default)s)",
    )
    top.set_defaults(run=_run_top)

    def offline(name: str, help: str, description: str, run: Callable[..., None]) -> Any:
        view = commands.add_parser(
            name,
            help=help,
            description=f"{description} Reads the store only; starts nothing.",
            epilog=_EPILOG,
            formatter_class=formatter,
            parents=[common],
        )
        _add_db(view)
        view.add_argument("--json", action="store_true", help="print one JSON object per line")
        view.set_defaults(run=run)
        return view

    children = offline(
        "children",
        "list the children in a store",
        "List the durable children in a store, oldest first.",
        _run_children,
    )
    children.add_argument("--parent", metavar="ID", help="only the children of this session")
    tasks = offline(
        "tasks",
        "list the Tasks in a store",
        "List the Tasks kept in a store (every runtime's, newest first).",
        _run_tasks,
    )
    tasks.add_argument("--owner", metavar="SESSION", help="only the Tasks of this session")
    offline(
        "runtimes",
        "list the runtimes that share a store",
        "List every runtime (open SubagentControl) the store knows, oldest first, with "
        "whether it is alive and how many Tasks it runs.",
        _run_runtimes,
    )

    transcript = commands.add_parser(
        "transcript",
        help="print the transcript of one child",
        description="Print every event of one child, oldest first. Reads the store only; "
        "starts nothing.",
        epilog=_EPILOG,
        formatter_class=formatter,
        parents=[common],
    )
    transcript.add_argument("child", metavar="CHILD", help="the child id")
    _add_db(transcript)
    transcript.add_argument("--json", action="store_true", help="print one event per line")
    transcript.set_defaults(run=_run_transcript)
    return parser


def _add_db(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--db",
        required=True,
        metavar="URL",
        help="the store URL, e.g. sqlite:///state.db or postgresql+psycopg://user@host:5432/db",
    )


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be positive: {text!r}")
    return value


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1: {text!r}")
    return value


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


# -- tree ------------------------------------------------------------------------------


def _run_tree(args: argparse.Namespace, out: IO[str]) -> None:
    tree = _request_tree(args.socket, timeout_s=args.timeout)
    if args.json:
        out.write(tree.model_dump_json(indent=2) + "\n")
    else:
        out.write(tree.render() + "\n")


def _run_top(args: argparse.Namespace, out: IO[str]) -> None:
    from controlplane._top import run_top

    run_top(
        lambda: _request_tree(args.socket, timeout_s=args.timeout),
        out=out,
        source=args.socket,
        interval_s=args.interval,
        iterations=args.iterations,
    )


def _request_tree(path: str, *, timeout_s: float) -> ActorTree:
    _check_socket_path(path)
    deadline = time.monotonic() + timeout_s
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    conn.settimeout(timeout_s)
    try:
        try:
            _connect(conn, path, deadline)
        except FileNotFoundError:
            raise _Exit(EXIT_UNREACHABLE, _no_socket(path)) from None
        except ConnectionRefusedError:
            raise _Exit(
                EXIT_UNREACHABLE,
                f"connection refused on {path}: nothing is serving it (a stale socket left "
                "by a process that exited?)",
            ) from None
        except PermissionError:
            raise _Exit(
                EXIT_UNREACHABLE,
                f"permission denied on {path}: the admin socket is mode 0600, so run as "
                "the user of the process that serves it",
            ) from None
        except BlockingIOError:
            raise _Exit(
                EXIT_UNREACHABLE,
                f"{path} is overloaded: its connection backlog stayed full for {timeout_s}s",
            ) from None
        except OSError as exc:
            raise _Exit(EXIT_UNREACHABLE, f"cannot connect to {path}: {exc}") from None
        try:
            conn.sendall(encode_line({"op": TREE_OP}))
            line = _read_reply(conn)
        except TimeoutError:
            raise _Exit(EXIT_UNREACHABLE, f"no reply on {path} within {timeout_s}s") from None
        except OSError as exc:
            raise _Exit(EXIT_UNREACHABLE, f"the connection to {path} failed: {exc}") from None
    finally:
        conn.close()
    return _parse_reply(path, line)


def _connect(conn: socket.socket, path: str, deadline: float) -> None:
    # A Unix socket whose backlog is full refuses a timed connect with EAGAIN at once,
    # where TCP would wait: retry until the deadline, as a blocking connect would.
    pause = threading.Event()
    while True:
        try:
            conn.connect(path)
            return
        except BlockingIOError:
            if time.monotonic() >= deadline:
                raise
            pause.wait(0.01)


def _check_socket_path(path: str) -> None:
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        raise _Exit(EXIT_UNREACHABLE, _no_socket(path)) from None
    except OSError as exc:
        raise _Exit(EXIT_UNREACHABLE, f"cannot reach {path}: {exc.strerror}") from None
    if not stat.S_ISSOCK(mode):
        raise _Exit(EXIT_UNREACHABLE, f"{path} is not a socket; pass the path given to serve_admin")


def _no_socket(path: str) -> str:
    return (
        f"no admin socket at {path}: is the process running and serving it "
        "(control.serve_admin(PATH))?"
    )


def _read_reply(conn: socket.socket) -> bytes:
    data = bytearray()
    while b"\n" not in data:
        if len(data) > _MAX_REPLY_BYTES:
            raise _Exit(EXIT_ERROR_REPLY, "the admin socket sent an oversized reply")
        chunk = conn.recv(65536)
        if not chunk:
            break
        data += chunk
    return bytes(data.split(b"\n", 1)[0])


def _parse_reply(path: str, line: bytes) -> ActorTree:
    if not line:
        raise _Exit(EXIT_ERROR_REPLY, f"{path} closed the connection without a reply")
    try:
        reply = json.loads(line.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        raise _Exit(EXIT_ERROR_REPLY, f"{path} did not answer with JSON") from None
    if not isinstance(reply, dict):
        raise _Exit(EXIT_ERROR_REPLY, f"{path} answered with {type(reply).__name__}, not a reply")
    if reply.get("ok") is not True:
        error = reply.get("error")
        error = error if isinstance(error, dict) else {}
        code = error.get("code", "?")
        message = error.get("message", "no message")
        raise _Exit(EXIT_ERROR_REPLY, f"the admin socket answered an error [{code}]: {message}")
    try:
        return ActorTree.model_validate(reply.get("tree"))
    except ValidationError as exc:
        raise _Exit(
            EXIT_ERROR_REPLY, f"{path} answered with a tree this CLI cannot read: {exc}"
        ) from None


# -- offline views -----------------------------------------------------------------------


def _open_store(url: str) -> SqlStore:
    scheme, sep, _ = url.partition("://")
    if not sep or not scheme:
        raise _Exit(
            EXIT_USAGE,
            f"--db {url!r} is not a database URL; use e.g. sqlite:///state.db or "
            "postgresql+psycopg://user@host:5432/db",
        )
    sqlite_path = _sqlite_file(url)
    if sqlite_path is not None and not os.path.isfile(sqlite_path):
        # The store would create an empty database there: say the name is wrong instead.
        raise _Exit(EXIT_NOT_FOUND, f"no SQLite store at {sqlite_path}: check --db")
    from persistence import SqlStore

    # Read as it is: an inspection never creates tables or migrates an older store
    # (a process of that older version may still be using it).
    return SqlStore(url, read_only=True)


def _sqlite_file(url: str) -> str | None:
    """The file a ``sqlite:///path`` URL names, or None for memory and URI forms."""
    scheme, _, rest = url.partition("://")
    if scheme != "sqlite" and not scheme.startswith("sqlite+"):
        return None
    if not rest.startswith("/"):
        return None
    path = rest[1:].split("?", 1)[0]
    if path in ("", ":memory:") or path.startswith("file:"):
        return None
    return path


def _run_children(args: argparse.Namespace, out: IO[str]) -> None:
    store = _open_store(args.db)
    try:
        children = store.list_children(args.parent)
    finally:
        store.close()
    _write_list(
        out,
        children,
        as_json=args.json,
        empty=f"(no children{f' of parent {args.parent}' if args.parent else ''})",
        header=("CHILD", "PARENT", "DEPTH", "CREATED", "LABEL"),
        row=lambda meta: (
            meta.child_id,
            meta.parent_session,
            str(meta.depth),
            meta.created_at.isoformat(timespec="seconds"),
            meta.label or "",
        ),
    )


def _run_tasks(args: argparse.Namespace, out: IO[str]) -> None:
    store = _open_store(args.db)
    try:
        tasks = store.ledger.recent(args.owner) if store.keeps_tasks else []
    finally:
        store.close()
    _write_list(
        out,
        tasks,
        as_json=args.json,
        empty=f"(no tasks{f' of session {args.owner}' if args.owner else ''})",
        header=("TASK", "STATUS", "OWNER", "CHILD", "CREATED", "RUNTIME", "LABEL"),
        row=lambda task: (
            task.id,
            task.status.value,
            task.owner_session,
            task.child_id or "",
            task.created_at.isoformat(timespec="seconds"),
            task.runtime_id or "",
            task.label,
        ),
    )


def _write_list(
    out: IO[str],
    items: Sequence[M],
    *,
    as_json: bool,
    empty: str,
    header: Sequence[str],
    row: Callable[[M], Sequence[str]],
) -> None:
    """An offline view's records: one JSON object per line, a table, or ``empty``."""
    if as_json:
        for item in items:
            out.write(item.model_dump_json() + "\n")
    elif not items:
        out.write(escape_controls(empty) + "\n")
    else:
        _write_table(out, header, [row(item) for item in items])


def _run_runtimes(args: argparse.Namespace, out: IO[str]) -> None:
    from persistence import is_expired

    store = _open_store(args.db)
    try:
        runtimes = store.ledger.runtimes() if store.keeps_tasks else []
        claims = store.ledger.claims() if store.keeps_tasks else {}
        now = utcnow()
    finally:
        store.close()
    if args.json:
        for runtime in runtimes:
            held = [
                {"child_id": child, "task_id": task, "fence": fence}
                for child, task, fence in claims.get(runtime.runtime_id, [])
            ]
            record = runtime.model_dump(mode="json") | {
                "alive": not is_expired(runtime, now),
                "claims": held,
            }
            out.write(json.dumps(record) + "\n")
        return
    if not runtimes:
        out.write("(no runtimes)\n")
        return
    rows = [
        (
            runtime.runtime_id,
            "dead" if is_expired(runtime, now) else "alive",
            runtime.host,
            str(runtime.pid),
            runtime.heartbeat_at.isoformat(timespec="seconds"),
            str(runtime.running_tasks),
            " ".join(
                f"{child}@{fence}" for child, _task, fence in claims.get(runtime.runtime_id, [])
            ),
        )
        for runtime in runtimes
    ]
    header = ("RUNTIME", "STATE", "HOST", "PID", "HEARTBEAT", "RUNNING", "HOLDS (CHILD@FENCE)")
    _write_table(out, header, rows)


def _run_transcript(args: argparse.Namespace, out: IO[str]) -> None:
    store = _open_store(args.db)
    try:
        session = store.load(args.child)
    finally:
        store.close()
    if args.json:
        for event in session.events:
            out.write(event.model_dump_json() + "\n")
        return
    meta = session.meta
    out.write(
        escape_controls(
            f"child {meta.child_id}  parent={meta.parent_session}  depth={meta.depth}"
            f"  created={meta.created_at.isoformat()}  events={len(session.events)}"
            f"  turns={session.last_turn}"
        )
        + "\n"
    )
    rows = [
        (str(e.seq), str(e.turn), e.kind, e.source.kind if e.source else "-", _event_text(e))
        for e in session.events
    ]
    _write_table(out, ("SEQ", "TURN", "KIND", "SOURCE", "TEXT"), rows)


def _event_text(event: SessionEvent) -> str:
    """What a person wants to read of an event: its text, else its data as JSON."""
    text = _text_in(event.data)
    if text is None:
        if event.data is None:
            return ""
        text = json.dumps(event.data, ensure_ascii=False, separators=(",", ":"))
    return text


def _text_in(data: Any) -> str | None:
    if isinstance(data, str):
        return data
    if isinstance(data, list) and data and all(_is_text_block(b) for b in data):
        return "".join(block["text"] for block in data)
    if isinstance(data, dict):
        for key in ("content", "message", "prompt", "output", "text"):
            if key in data:
                found = _text_in(data[key])
                if found is not None:
                    return found
    return None


def _is_text_block(value: Any) -> bool:
    return isinstance(value, dict) and isinstance(value.get("text"), str)


def _write_table(out: IO[str], header: Sequence[str], rows: Sequence[Sequence[str]]) -> None:
    # The last column is free text: it is not padded, so long texts do not widen the rest.
    table = [[escape_controls(cell) for cell in row] for row in [header, *rows]]
    widths = [max(len(row[i]) for row in table) for i in range(len(header) - 1)]
    for row in table:
        cells = [cell.ljust(width) for cell, width in zip(row, widths, strict=False)]
        out.write("  ".join([*cells, row[-1]]).rstrip() + "\n")


if __name__ == "__main__":
    sys.exit(main())
