"""One listening socket served by uvicorn, in the caller's thread or one of its own: what the
A2A front and the console share (the MCP front serves through its SDK's own runner).

The socket listens before the server runs, so a front knows its URL at once (port 0 picks
a free one) and early clients queue. Requests are read by `LimitedH11` (deadlines on a
request's head and body, a cap on one client's half-sent connections). uvicorn's own
signal handling is off: it raises the signal again once it has stopped, which would end
the process before the control plane is closed; on the main thread, SIGINT and SIGTERM
stop the server instead (a second SIGINT ends open streams at once), and `serve` returns so
the caller closes the control plane.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import socket
import threading
from collections.abc import Generator
from types import FrameType
from typing import Self

import uvicorn
from starlette.types import ASGIApp

from controlplane.fronts._http_limits import LimitedH11

__all__ = ["ServedApp"]

STOP_S = 10.0
"""How long `ServedApp.stop` waits for the serving thread, twice (then forced)."""
_STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class ServedApp:
    """``app`` served on ``sock`` (already listening) until `stop` or a stop signal.

    Subclasses that run something beside the server override `_starting` (before it
    serves) and `_stopping` (when it is asked to stop: open streams should end then).

    Args:
        app: The ASGI app, its guards applied.
        sock: The listening socket (closed when serving ends).
        name: The serving thread's name.
    """

    def __init__(self, app: ASGIApp, sock: socket.socket, *, name: str) -> None:
        config = uvicorn.Config(
            app, log_level="warning", http=LimitedH11, lifespan="off", timeout_graceful_shutdown=2
        )
        self._server = _Server(config)
        self._socket = sock
        self._name = name
        self._thread: threading.Thread | None = None

    def _starting(self) -> None:
        """Called in the serving thread just before the server runs."""

    def _stopping(self) -> None:
        """Called when the server is asked to stop (by `stop`, a signal, or its end)."""

    def serve(self) -> None:
        """Serve in this thread until `stop` (or, on the main thread, SIGINT or SIGTERM)."""
        previous = {}
        if threading.current_thread() is threading.main_thread():
            previous = {sig: signal.signal(sig, self._on_signal) for sig in _STOP_SIGNALS}
        self._starting()
        try:
            asyncio.run(self._server.serve(sockets=[self._socket]))
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            self._stopping()
            self._socket.close()

    def _on_signal(self, sig: int, _frame: FrameType | None) -> None:
        self._stopping()
        if self._server.should_exit and sig == signal.SIGINT:
            self._server.force_exit = True
        self._server.should_exit = True

    def start(self) -> Self:
        """Serve in a thread of its own; returns at once (the socket already listens)."""
        self._thread = threading.Thread(target=self.serve, name=self._name, daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout_s: float = STOP_S) -> None:
        """Stop serving (open streams end) and wait for the thread, if any."""
        self._stopping()
        self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout_s)
            if self._thread.is_alive():
                self._server.force_exit = True
                self._thread.join(timeout_s)
        else:
            self._socket.close()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


class _Server(uvicorn.Server):
    """uvicorn's server without its own signal handling (see the module)."""

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None]:
        yield
