"""``subagent-control tree`` and ``top``: a running process's actor tree, asked over the
admin socket it serves (`controlplane.runtime._admin`). The client side only: a bounded connect, one
request line, one reply line, each failure an exit status with a message that says what to
check.

``--timeout`` is one deadline for the whole exchange, connect to last byte: a server that
trickles its reply a byte at a time would otherwise keep every read inside a per-read timeout
forever. A reply is read as JSON only as deep as the decoder nests (a tree is six levels); a
deeper one is an answer that is not a tree, never a `RecursionError`."""

from __future__ import annotations

import argparse
import json
import os
import socket
import stat
import threading
import time
from typing import IO, Final

from pydantic import ValidationError

from controlplane.cli._exit_status import EXIT_ERROR_REPLY, EXIT_UNREACHABLE, CommandExit
from controlplane.contract import ActorTree
from controlplane.runtime._admin import TREE_OP, encode_line

__all__ = ["run_top", "run_tree"]

_MAX_REPLY_BYTES: Final = 256 * 1024 * 1024


def run_tree(args: argparse.Namespace, out: IO[str]) -> None:
    tree = _request_tree(args.socket, timeout_s=args.timeout)
    if args.json:
        out.write(tree.model_dump_json(indent=2) + "\n")
    else:
        out.write(tree.render() + "\n")


def run_top(args: argparse.Namespace, out: IO[str]) -> None:
    from controlplane.cli._top import run_top as top

    top(
        lambda: _request_tree(args.socket, timeout_s=args.timeout),
        out=out,
        source=args.socket,
        interval_s=args.interval,
        iterations=args.iterations,
        wide=args.wide,
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
            raise CommandExit(EXIT_UNREACHABLE, _no_socket(path)) from None
        except ConnectionRefusedError:
            raise CommandExit(
                EXIT_UNREACHABLE,
                f"connection refused on {path}: nothing is serving it (a stale socket left "
                "by a process that exited?)",
            ) from None
        except PermissionError:
            raise CommandExit(
                EXIT_UNREACHABLE,
                f"permission denied on {path}: the admin socket is mode 0600, so run as "
                "the user of the process that serves it",
            ) from None
        except BlockingIOError:
            raise CommandExit(
                EXIT_UNREACHABLE,
                f"{path} is overloaded: its connection backlog stayed full for {timeout_s}s",
            ) from None
        except OSError as exc:
            raise CommandExit(EXIT_UNREACHABLE, f"cannot connect to {path}: {exc}") from None
        try:
            _before(conn, deadline)
            conn.sendall(encode_line({"op": TREE_OP}))
            line = _read_reply(conn, deadline)
        except TimeoutError:
            raise CommandExit(EXIT_UNREACHABLE, f"no reply on {path} within {timeout_s}s") from None
        except OSError as exc:
            raise CommandExit(EXIT_UNREACHABLE, f"the connection to {path} failed: {exc}") from None
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
        raise CommandExit(EXIT_UNREACHABLE, _no_socket(path)) from None
    except OSError as exc:
        raise CommandExit(EXIT_UNREACHABLE, f"cannot reach {path}: {exc.strerror}") from None
    if not stat.S_ISSOCK(mode):
        raise CommandExit(
            EXIT_UNREACHABLE, f"{path} is not a socket; pass the path given to serve_admin"
        )


def _no_socket(path: str) -> str:
    return (
        f"no admin socket at {path}: is the process running and serving it "
        "(control.serve_admin(PATH))?"
    )


def _before(conn: socket.socket, deadline: float) -> None:
    """Bound the next socket call by what is left of the deadline."""
    left = deadline - time.monotonic()
    if left <= 0:
        raise TimeoutError
    conn.settimeout(left)


def _read_reply(conn: socket.socket, deadline: float) -> bytes:
    data = bytearray()
    while b"\n" not in data:
        if len(data) > _MAX_REPLY_BYTES:
            raise CommandExit(EXIT_ERROR_REPLY, "the admin socket sent an oversized reply")
        _before(conn, deadline)
        chunk = conn.recv(65536)
        if not chunk:
            break
        data += chunk
    return bytes(data.split(b"\n", 1)[0])


def _parse_reply(path: str, line: bytes) -> ActorTree:
    if not line:
        raise CommandExit(EXIT_ERROR_REPLY, f"{path} closed the connection without a reply")
    try:
        reply = json.loads(line.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        raise CommandExit(EXIT_ERROR_REPLY, f"{path} did not answer with JSON") from None
    except RecursionError:  # the decoder's own bound on nesting, raised before any harm
        raise CommandExit(
            EXIT_ERROR_REPLY, f"{path} answered with JSON nested too deeply to be a tree"
        ) from None
    if not isinstance(reply, dict):
        raise CommandExit(
            EXIT_ERROR_REPLY, f"{path} answered with {type(reply).__name__}, not a reply"
        )
    if reply.get("ok") is not True:
        error = reply.get("error")
        error = error if isinstance(error, dict) else {}
        # Shown only when they are text: anything else would print as its repr, as big and
        # as deep as the server made it.
        code = _text(error.get("code"), "?")
        message = _text(error.get("message"), "no message")
        raise CommandExit(
            EXIT_ERROR_REPLY, f"the admin socket answered an error [{code}]: {message}"
        )
    try:
        return ActorTree.model_validate(reply.get("tree"))
    except ValidationError as exc:
        raise CommandExit(
            EXIT_ERROR_REPLY, f"{path} answered with a tree this CLI cannot read: {exc}"
        ) from None


def _text(value: object, default: str) -> str:
    return value if isinstance(value, str) else default
