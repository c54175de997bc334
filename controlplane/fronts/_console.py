"""The console: a web page for people, served from the store.

``subagent-control console --db URL`` runs `serve_console`; `ConsoleServer` serves one
control plane's store on one socket, in the caller's thread or a thread of its own. Any
process on the store can run it beside the harness processes: everything shown is read
from the store, and actions go through the control plane it opens (with no provider it
still answers, kills, sends and sets budgets; ``--setup``, ``--demo`` or
``--openai-model`` register providers, as for the other fronts, when this process should
also run resumed turns). With ``-v`` it logs one line per request (never its query, which
may hold the token).
"""

from __future__ import annotations

import logging
import sys
import time
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from controlplane.fronts._console_app import console_app
from controlplane.fronts._console_watch import TICK_S, ChangeFeed
from controlplane.fronts._security import (
    MAX_BODY_BYTES,
    ASGIApp,
    Bind,
    announce_token,
    guard,
    is_loopback,
    listen,
    parse_bind,
    resolve_token,
)
from controlplane.fronts._served import ServedApp
from controlplane.fronts._setup import FrontOptions, open_runtime

if TYPE_CHECKING:
    from controlplane.runtime._facade import SubagentControl

__all__ = ["ConsoleServer", "serve_console"]

_LOG = logging.getLogger("controlplane.console")


class ConsoleServer(ServedApp):
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
        super().__init__(_logged(guarded), self._socket, name="console-server")

    def _starting(self) -> None:
        self.feed.start()

    def _stopping(self) -> None:
        self.feed.stop()  # open streams end, so the server stops at once


def _logged(app: ASGIApp) -> ASGIApp:
    """``app``, logging one line per HTTP request at INFO (shown with ``-v``): method, path
    (not the query: ``?token=`` may be in it), status, and the time to the response's
    start (an event stream's start, not its end)."""

    async def logged(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or not _LOG.isEnabledFor(logging.INFO):
            await app(scope, receive, send)
            return
        started = time.perf_counter()

        async def sending(message: Any) -> None:
            if message["type"] == "http.response.start":
                took = (time.perf_counter() - started) * 1000
                _LOG.info("%s %s %s %.1f ms", scope["method"], scope["path"],
                          message["status"], took)  # fmt: skip
            await send(message)

        await app(scope, receive, sending)

    return logged


def serve_console(
    options: FrontOptions,
    *,
    http: str,
    token: str | None,
    out: IO[str],
    token_dir: Path | None = None,
) -> None:
    """``subagent-control console``: open the control plane on ``options.db`` with the
    providers ``options`` name (`open_runtime`, as every front), say on stderr which it
    serves, print ``http://HOST:PORT/`` once the socket listens, serve until a signal,
    close it.

    Raises:
        SubagentControlError: ``INVALID_INPUT`` for a bad bind, token or ``--setup`` (or one
            that raised), more than one of ``--setup``, ``--openai-model`` and ``--demo``,
            or a bind it cannot listen on; the store's errors when it cannot be opened.
        ImportError: ``--openai-model`` without the ``openai`` extra.
    """
    bind = parse_bind(http)  # a typo fails before the store opens
    required, token_file = resolve_token(bind, token, token_dir=token_dir)
    control = open_runtime(options)
    try:
        _announce(control)
        server = ConsoleServer(control, host=bind.host, port=bind.port, token=required)
        print(server.url, file=out, flush=True)
        announce_token(bind, token_file, out)
        server.serve()
    finally:
        control.close()


def _announce(control: SubagentControl) -> None:
    """One line on stderr, as every front says which provider it serves: here, which
    providers run the turn a message resumes, or that none is served."""
    names = control.providers.names()
    if names:
        message = (
            f"serving provider {', '.join(repr(n) for n in names)}: a message to an idle "
            "child on it resumes the child in this process"
        )
    else:
        message = (
            "serving no provider: answers, kills, steers and budgets work; a message to an "
            "idle child resumes it only where its provider is (give --demo, --setup "
            "MODULE:FUNCTION or --openai-model NAME to run such turns here)"
        )
    print(f"subagent-control: {message}", file=sys.stderr, flush=True)
