"""The console (SPEC §13): a web page for people, served from the store.

``subagent-control console --db URL`` runs `serve_console`; `ConsoleServer` serves one
control plane's store on one socket, in the caller's thread or a thread of its own. Any
process on the store can run it beside the harness processes: everything shown is read
from the store, and actions go through the control plane it opens (with no provider it
still answers, kills, sends and sets budgets; ``--setup`` registers providers when this
process should also run resumed turns).
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import threading
from collections.abc import Generator
from pathlib import Path
from types import FrameType
from typing import IO, TYPE_CHECKING, Self

import uvicorn

from controlplane.fronts._console_app import console_app
from controlplane.fronts._console_watch import TICK_S, ChangeFeed
from controlplane.fronts._security import (
    MAX_BODY_BYTES,
    Bind,
    announce_token,
    guard,
    is_loopback,
    listen,
    parse_bind,
    resolve_token,
)
from controlplane.fronts._setup import load_setup

if TYPE_CHECKING:
    from controlplane._facade import SubagentControl

__all__ = ["ConsoleServer", "serve_console"]

_STOP_S = 10.0
_STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class ConsoleServer:
    """The console of ``control``'s store on one listening socket.

    The socket listens when this returns, so `url` is final (port 0 picks a free port).

    Args:
        control: The open control plane (the caller closes it, after `stop`).
        host: Where to listen.
        port: The port (0: any free one).
        token: The token every request must show (None: none is asked).
        tick_s: How often the store is looked at for changes.
    """

    def __init__(
        self,
        control: SubagentControl,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        token: str | None = None,
        tick_s: float = TICK_S,
    ) -> None:
        store = control.store
        if store is None:
            from controlplane.contract import ErrorCode, SubagentControlError

            raise SubagentControlError(
                ErrorCode.PERSISTENCE_UNAVAILABLE, "the console reads a store; open one with a URL"
            )
        self.feed = ChangeFeed(store.overview.change_marker(), tick_s=tick_s)
        """The watcher of the store (its ``reads`` count the console's idle load)."""
        app = console_app(control, feed=self.feed, token=token)
        bind = Bind(host, port)
        self._socket = listen(bind)
        self.url = f"http://{bind.url_host}:{self._socket.getsockname()[1]}/"
        """Where a browser opens it."""
        guarded = guard(app, token=None, loopback=is_loopback(host), max_body=MAX_BODY_BYTES)
        config = uvicorn.Config(
            guarded, log_level="warning", lifespan="off", timeout_graceful_shutdown=2
        )
        self._server = _Server(config)
        self._thread: threading.Thread | None = None

    def serve(self) -> None:
        """Serve in this thread until `stop` (or, on the main thread, SIGINT or SIGTERM)."""
        previous = {}
        if threading.current_thread() is threading.main_thread():
            previous = {sig: signal.signal(sig, self._on_signal) for sig in _STOP_SIGNALS}
        self.feed.start()
        try:
            asyncio.run(self._server.serve(sockets=[self._socket]))
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            self.feed.stop()
            self._socket.close()

    def _on_signal(self, sig: int, _frame: FrameType | None) -> None:
        self.feed.stop()  # open streams end, so the server stops at once
        if self._server.should_exit and sig == signal.SIGINT:
            self._server.force_exit = True
        self._server.should_exit = True

    def start(self) -> Self:
        """Serve in a thread of its own; returns at once (the socket already listens)."""
        self._thread = threading.Thread(target=self.serve, name="console-server", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout_s: float = _STOP_S) -> None:
        """Stop serving (open streams end) and wait for the thread, if any."""
        self.feed.stop()
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
    """uvicorn's server without its own signal handling (see `ConsoleServer.serve`)."""

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None]:
        yield


def serve_console(
    db: str,
    *,
    http: str,
    token: str | None,
    setup: str | None,
    out: IO[str],
    token_dir: Path | None = None,
) -> None:
    """``subagent-control console``: open the control plane on ``db``, run ``setup`` on it,
    print ``http://HOST:PORT/`` once the socket listens, serve until a signal, close it.

    Raises:
        SubagentControlError: ``INVALID_INPUT`` for a bad bind, token or ``--setup``, or a
            bind it cannot listen on; the store's errors when it cannot be opened.
    """
    from controlplane._facade import SubagentControl

    bind = parse_bind(http)  # a typo fails before the store opens
    run_setup = load_setup(setup) if setup else None
    required, token_file = resolve_token(bind, token, token_dir=token_dir)
    control = SubagentControl.open(db)
    try:
        if run_setup is not None:
            run_setup(control)
        server = ConsoleServer(control, host=bind.host, port=bind.port, token=required)
        print(server.url, file=out, flush=True)
        announce_token(bind, token_file, out)
        server.serve()
    finally:
        control.close()
