"""A process that serves a hand-built tree on an admin socket until SIGTERM.

Run as ``python -m tests.cli.serve_fake_tree SOCKET [MODE]``; prints ``ready`` once serving.
MODE ``tree`` (the default) is the real `AdminServer`; the others are misbehaving servers
the CLI must survive, each on a plain socket:

- ``trickle``: answers every request with a valid-looking reply one byte at a time, a byte
  every `TRICKLE_S`, never ending it: each read succeeds well inside any per-read timeout.
- ``deep``: answers with one line of JSON whose tree is nested `DEEP_LEVELS` deep.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import sys
import threading
from collections.abc import Callable
from typing import Final

from controlplane.runtime._admin import AdminServer
from tests.cli.cli_support import sample_tree

TRICKLE_S: Final = 0.4
DEEP_LEVELS: Final = 100_000


def main(path: str, mode: str = "tree") -> int:
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    if mode == "tree":
        with AdminServer(path, dump=sample_tree):
            print("ready", flush=True)
            stop.wait()
        return 0
    answer = {"trickle": _trickle, "deep": _deep}[mode]
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as server:
        server.bind(path)
        server.listen(8)
        server.settimeout(0.1)  # so the accept loop sees SIGTERM's flag
        print("ready", flush=True)
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except TimeoutError:
                continue
            threading.Thread(target=_serve, args=(conn, answer, stop), daemon=True).start()
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
    return 0


def _serve(conn: socket.socket, answer: Callable[[socket.socket, threading.Event], None],
           stop: threading.Event) -> None:  # fmt: skip
    with conn, contextlib.suppress(OSError):  # the client may hang up at any byte
        conn.recv(4096)  # the request line
        answer(conn, stop)


def _trickle(conn: socket.socket, stop: threading.Event) -> None:
    reply = b'{"ok": true, "tree": {"taken_at": "2026-01-02T03:04:05Z", "closed": false, '
    padding = b" " * 1_000_000  # JSON whitespace: the reply never ends within a test
    for byte in reply + padding:
        if stop.wait(TRICKLE_S):
            return
        conn.sendall(bytes([byte]))


def _deep(conn: socket.socket, _stop: threading.Event) -> None:
    conn.sendall(b'{"ok": true, "tree": ' + b"[" * DEEP_LEVELS + b"]" * DEEP_LEVELS + b"}\n")


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
