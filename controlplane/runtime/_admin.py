"""The opt-in admin endpoint: a read-only Unix socket that answers actor-tree dumps.

Protocol: newline-delimited JSON, UTF-8. The only request is ``{"op": "tree"}``; its reply is
one line ``{"ok": true, "tree": <ActorTree as JSON>}``. Anything else gets one line
``{"ok": false, "error": {"code": ..., "message": ...}}`` (codes in `AdminErrorCode`) or a
closed connection. A connection may carry several requests; a framing failure (an oversized
line, a partial line then EOF, a client slower than ``timeout_s``) ends it.

It sits at the runtime's level, not in `controlplane.cli`: the facade starts the server
(`SubagentControl.serve_admin`) and the CLI's client (`controlplane.cli`) reads the same
wire protocol (`TREE_OP`, `encode_line`) from here, so both imports run down and neither
the runtime nor this module imports the CLI.
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import selectors
import socket
import stat
import tempfile
import threading
import time
from collections.abc import Callable
from enum import StrEnum
from types import TracebackType
from typing import Any, Final

from controlplane.contract import ActorTree, ErrorCode, SubagentControlError

__all__ = ["TREE_OP", "AdminErrorCode", "AdminServer", "encode_line"]

log = logging.getLogger(__name__)

TREE_OP: Final = "tree"

# sun_path holds 108 bytes on Linux, including the terminating NUL.
_MAX_SOCKET_PATH_BYTES: Final = 107
_BACKLOG: Final = 128


class AdminErrorCode(StrEnum):
    """The codes of admin-socket error replies (``SubagentControlError`` codes pass through)."""

    BAD_REQUEST = "BAD_REQUEST"
    UNKNOWN_OP = "UNKNOWN_OP"
    REQUEST_TOO_LARGE = "REQUEST_TOO_LARGE"
    INCOMPLETE_REQUEST = "INCOMPLETE_REQUEST"
    TIMEOUT = "TIMEOUT"
    BUSY = "BUSY"
    DUMP_FAILED = "DUMP_FAILED"


def encode_line(value: dict[str, Any]) -> bytes:
    """One protocol line: compact JSON, UTF-8, newline-terminated."""
    text = json.dumps(value, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    return text.encode("utf-8") + b"\n"


def _error_line(code: str, message: str) -> bytes:
    return encode_line({"ok": False, "error": {"code": code, "message": message}})


class _FramingError(Exception):
    """The request stream is unusable; reply with this error, then close the connection."""

    def __init__(self, code: AdminErrorCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


class AdminServer:
    """Serves ``dump()`` read-only on a Unix domain socket with mode 0600.

    The socket is bound inside a fresh 0700 directory, set to 0600, and only then linked
    at ``path``, so it is never reachable by other users, not even for an instant. An
    existing file that is not a socket is never replaced; a stale socket (nobody accepts
    on it) is. A daemon thread accepts; each connection gets its own daemon thread, at most
    ``max_connections`` at once (others get a ``BUSY`` reply), so a slow or hostile client
    can hold a slot for at most ``timeout_s`` per request and never blocks the runtime.

    Args:
        path: Where to create the socket.
        dump: Returns the current tree; called on a connection thread for each request.
        max_request_bytes: Longest accepted request line, newline excluded.
        timeout_s: How long a client may take to send one whole request (and to read
            its reply) before the connection is closed.
        max_connections: Connections served at once.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        dump: Callable[[], ActorTree],
        max_request_bytes: int = 4096,
        timeout_s: float = 2.0,
        max_connections: int = 8,
    ) -> None:
        if max_request_bytes < 16:
            raise SubagentControlError(
                ErrorCode.INVALID_INPUT,
                f"max_request_bytes must be at least 16, got {max_request_bytes}",
            )
        if not timeout_s > 0:
            raise SubagentControlError(
                ErrorCode.INVALID_INPUT, f"timeout_s must be positive, got {timeout_s}"
            )
        if max_connections < 1:
            raise SubagentControlError(
                ErrorCode.INVALID_INPUT,
                f"max_connections must be at least 1, got {max_connections}",
            )
        self._path = os.path.abspath(os.fspath(path))
        self._dump = dump
        self._max_request_bytes = max_request_bytes
        self._timeout_s = timeout_s
        self._slots = threading.BoundedSemaphore(max_connections)
        self._lock = threading.Lock()
        self._state = "new"  # new -> serving -> closed
        self._listener: socket.socket | None = None
        self._identity: tuple[int, int] | None = None  # (st_dev, st_ino) of our socket file
        self._wake_r: socket.socket | None = None
        self._wake_w: socket.socket | None = None
        self._acceptor: threading.Thread | None = None
        self._connections: set[socket.socket] = set()

    @property
    def path(self) -> str:
        """The absolute path of the socket."""
        return self._path

    @property
    def is_serving(self) -> bool:
        """Whether the server has started and is not closed."""
        return self._state == "serving"

    def start(self) -> AdminServer:
        """Create the socket and start serving. Idempotent while serving.

        Raises:
            SubagentControlError: ``CLOSED`` after `close`; ``INVALID_INPUT`` if the path is
                too long, its directory is missing, a non-socket file is there, or another
                server is live on it.
        """
        with self._lock:
            if self._state == "serving":
                return self
            if self._state == "closed":
                raise SubagentControlError(
                    ErrorCode.CLOSED, "this admin server is closed; create a new one"
                )
            listener = self._bind()
            self._listener = listener
            self._wake_r, self._wake_w = socket.socketpair()
            self._acceptor = threading.Thread(
                target=self._accept_loop,
                name=f"subagent-control-admin:{os.path.basename(self._path)}",
                daemon=True,
            )
            self._state = "serving"
            self._acceptor.start()
        return self

    def close(self) -> None:
        """Stop serving, end open connections and remove the socket file. Idempotent."""
        with self._lock:
            if self._state == "closed":
                return
            was_serving = self._state == "serving"
            self._state = "closed"
            connections = list(self._connections)
        if not was_serving:
            return
        assert self._wake_w is not None
        assert self._listener is not None
        with contextlib.suppress(OSError):
            self._wake_w.send(b"x")
        if self._acceptor is not None and self._acceptor is not threading.current_thread():
            self._acceptor.join(timeout=5.0)
        for conn in connections:
            # Wakes a handler blocked in recv/send; it then closes its own socket.
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
        self._listener.close()
        self._wake_w.close()
        if self._wake_r is not None:
            self._wake_r.close()
        self._unlink_if_ours()

    def __enter__(self) -> AdminServer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<AdminServer {self._path!r} {self._state}>"

    # -- socket file ---------------------------------------------------------------------

    def _bind(self) -> socket.socket:
        directory = os.path.dirname(self._path)
        if len(os.fsencode(self._path)) > _MAX_SOCKET_PATH_BYTES:
            raise SubagentControlError(
                ErrorCode.INVALID_INPUT,
                f"admin socket path {self._path!r} is longer than "
                f"{_MAX_SOCKET_PATH_BYTES} bytes; choose a shorter path",
            )
        if not os.path.isdir(directory):
            raise SubagentControlError(
                ErrorCode.INVALID_INPUT,
                f"the directory of admin socket path {self._path!r} does not exist; create it",
            )
        self._clear_stale()
        # mkdtemp makes the directory 0700: while the socket has umask permissions nobody
        # else can reach it. os.umask would do the same but is process-wide, racing every
        # other thread that creates files.
        private_dir = tempfile.mkdtemp(prefix=".sc", dir=directory)
        staging = os.path.join(private_dir, "s")
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            if len(os.fsencode(staging)) > _MAX_SOCKET_PATH_BYTES:
                raise SubagentControlError(
                    ErrorCode.INVALID_INPUT,
                    f"the directory of admin socket path {self._path!r} is too deep to bind "
                    "a socket in it safely; choose a shorter path",
                )
            listener.bind(staging)
            os.chmod(staging, 0o600)
            # A burst beyond the backlog fails clients at once (EAGAIN on AF_UNIX), and the
            # accept loop only hands sockets to threads: a deep backlog costs nothing.
            listener.listen(_BACKLOG)
            listener.setblocking(False)
            self._publish(staging)
        except BaseException:
            listener.close()
            raise
        finally:
            with contextlib.suppress(OSError):
                os.unlink(staging)
            with contextlib.suppress(OSError):
                os.rmdir(private_dir)
        return listener

    def _publish(self, staging: str) -> None:
        # link() never replaces an existing name, unlike rename(): a file that appeared
        # after the stale check is refused, not clobbered.
        for _ in range(3):
            try:
                os.link(staging, self._path)
            except FileExistsError:
                self._clear_stale()
                continue
            st = os.lstat(self._path)
            self._identity = (st.st_dev, st.st_ino)
            return
        raise SubagentControlError(
            ErrorCode.INVALID_INPUT,
            f"admin socket path {self._path!r} keeps being re-created by someone else",
        )

    def _clear_stale(self) -> None:
        try:
            st = os.lstat(self._path)
        except FileNotFoundError:
            return
        if not stat.S_ISSOCK(st.st_mode):
            raise SubagentControlError(
                ErrorCode.INVALID_INPUT,
                f"{self._path!r} exists and is not a socket; refusing to replace it "
                "(remove it or choose another path)",
            )
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        probe.settimeout(1.0)
        try:
            probe.connect(self._path)
        except (ConnectionRefusedError, FileNotFoundError):
            pass  # stale: nobody accepts on it
        except OSError as exc:
            raise SubagentControlError(
                ErrorCode.INVALID_INPUT,
                f"cannot tell whether the socket at {self._path!r} is in use ({exc}); "
                "remove it or choose another path",
            ) from exc
        else:
            raise SubagentControlError(
                ErrorCode.INVALID_INPUT,
                f"another server is live on {self._path!r}; close it or choose another path",
            )
        finally:
            probe.close()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self._path)

    def _unlink_if_ours(self) -> None:
        # Only our own inode: a successor may already serve a new socket at this path.
        try:
            st = os.lstat(self._path)
        except FileNotFoundError:
            return
        if (st.st_dev, st.st_ino) == self._identity:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self._path)

    # -- serving -------------------------------------------------------------------------

    def _accept_loop(self) -> None:
        assert self._listener is not None
        assert self._wake_r is not None
        with selectors.DefaultSelector() as selector:
            selector.register(self._listener, selectors.EVENT_READ, "accept")
            selector.register(self._wake_r, selectors.EVENT_READ, "wake")
            while self._state == "serving":
                for key, _ in selector.select():
                    if key.data == "wake":
                        return
                    self._accept_one()

    def _accept_one(self) -> None:
        assert self._listener is not None
        try:
            conn, _ = self._listener.accept()
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            if exc.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                # Out of descriptors: back off instead of spinning on a ready listener.
                log.warning("admin socket %s cannot accept: %s", self._path, exc)
                time.sleep(0.05)
            return
        if not self._slots.acquire(blocking=False):
            self._refuse(conn)
            return
        with self._lock:
            if self._state != "serving":
                self._slots.release()
                conn.close()
                return
            self._connections.add(conn)
        threading.Thread(
            target=self._handle, args=(conn,), name="subagent-control-admin-conn", daemon=True
        ).start()

    def _refuse(self, conn: socket.socket) -> None:
        conn.setblocking(False)
        with contextlib.suppress(OSError):
            conn.send(_error_line(AdminErrorCode.BUSY, "too many admin connections; retry shortly"))
        conn.close()

    def _handle(self, conn: socket.socket) -> None:
        try:
            self._converse(conn)
        except Exception as exc:  # a client must never end the server
            log.debug("admin connection on %s ended: %r", self._path, exc)
        finally:
            with self._lock:
                self._connections.discard(conn)
            conn.close()
            self._slots.release()

    def _converse(self, conn: socket.socket) -> None:
        buffer = bytearray()
        while self._state == "serving":
            try:
                line = self._read_line(conn, buffer)
            except _FramingError as failure:
                self._send(conn, _error_line(failure.code, failure.message))
                return
            if line is None:
                return
            self._send(conn, self._answer(line))

    def _read_line(self, conn: socket.socket, buffer: bytearray) -> bytes | None:
        """The next request line (without its newline), or None at a clean EOF."""
        deadline = time.monotonic() + self._timeout_s
        limit = self._max_request_bytes
        while True:
            newline = buffer.find(b"\n")
            if newline > limit or (newline < 0 and len(buffer) > limit):
                raise _FramingError(
                    AdminErrorCode.REQUEST_TOO_LARGE,
                    f'request longer than {limit} bytes; the only request is {{"op": "tree"}}',
                )
            if newline >= 0:
                line = bytes(buffer[:newline])
                del buffer[: newline + 1]
                return line
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise _FramingError(
                    AdminErrorCode.TIMEOUT,
                    f"no complete request line within {self._timeout_s}s",
                )
            conn.settimeout(remaining)
            try:
                chunk = conn.recv(limit + 1 - len(buffer))
            except TimeoutError:
                continue  # the deadline check above reports it
            if not chunk:
                if buffer:
                    raise _FramingError(
                        AdminErrorCode.INCOMPLETE_REQUEST,
                        "connection closed in the middle of a request line; end each "
                        "request with a newline",
                    )
                return None
            buffer += chunk

    def _answer(self, line: bytes) -> bytes:
        try:
            request = json.loads(line.decode("utf-8"))
        except (UnicodeDecodeError, ValueError):
            return _error_line(
                AdminErrorCode.BAD_REQUEST,
                'request is not UTF-8 JSON; send one line such as {"op": "tree"}',
            )
        if not isinstance(request, dict):
            return _error_line(
                AdminErrorCode.BAD_REQUEST,
                'request must be a JSON object such as {"op": "tree"}',
            )
        op = request.get("op")
        if op != TREE_OP:
            return _error_line(
                AdminErrorCode.UNKNOWN_OP,
                f"unknown op {op!r}: the admin socket is read-only and answers only "
                '{"op": "tree"}',
            )
        try:
            tree = self._dump()
            return encode_line({"ok": True, "tree": tree.model_dump(mode="json")})
        except SubagentControlError as exc:
            return _error_line(exc.code.value, exc.message)
        except Exception as exc:  # report the failure; keep serving
            log.warning("admin tree dump on %s failed", self._path, exc_info=True)
            return _error_line(
                AdminErrorCode.DUMP_FAILED, f"the tree dump failed: {type(exc).__name__}: {exc}"
            )

    def _send(self, conn: socket.socket, data: bytes) -> None:
        conn.settimeout(self._timeout_s)
        conn.sendall(data)
