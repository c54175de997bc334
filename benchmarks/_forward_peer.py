"""Runtime A of the forwarding benchmark: another OS process on the same PostgreSQL store.

Run as ``python -m benchmarks._forward_peer MODE URL …`` (`Peer` does). It prints one line
``READY <json>`` once set up, then serves until its stdin closes (``steer``) or it is killed
(``takeover``). A watchdog ends it after ``WATCHDOG_S`` whatever happens, so a benchmark that
died cannot leave it behind.

- ``steer URL CHILDREN PING PONG``: ``CHILDREN`` running children (each published: one local
  steer returned) for the benchmark's runtime to steer by forwarding; and the raw baseline's
  far end, one connection listening on channel ``PING`` whose every notification is sent
  back on ``PONG`` from a second connection (autocommit, no store code in between).
- ``takeover URL LEASE_TTL_S HOST``: one running child, held until the process is killed.
  ``HOST`` ``here`` keeps the real host name; any other value is the host name the runtime
  reports, so the benchmark's runtime cannot check the process and must wait for the lease
  to lapse, as for a runtime on another machine.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

from benchmarks._routes import Plane

__all__ = ["Peer", "libpq"]

WATCHDOG_S = 900.0
_REPO = Path(__file__).resolve().parents[1]
_READY_S = 120.0


def libpq(url: str) -> str:
    """A store URL (SQLAlchemy's ``postgresql+psycopg://``) as psycopg's own."""
    return url.replace("postgresql+psycopg://", "postgresql://", 1)


class Peer:
    """A running ``_forward_peer`` process and what it reported."""

    def __init__(self, *args: str) -> None:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(_REPO), env.get("PYTHONPATH")]))
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "benchmarks._forward_peer", *args],
            cwd=_REPO,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        self.ready: dict[str, Any] = {}
        got = threading.Event()

        def read() -> None:
            assert self.proc.stdout is not None
            for line in self.proc.stdout:
                if line.startswith("READY "):
                    self.ready = json.loads(line.removeprefix("READY "))
                    got.set()

        threading.Thread(target=read, daemon=True).start()
        if not got.wait(_READY_S):
            self.reap()
            raise RuntimeError(f"forwarding peer {args[0]} never got ready")

    def stop(self) -> None:
        """Close its stdin (a ``steer`` peer closes its runtime and exits), then reap it."""
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.reap()

    def reap(self) -> None:
        """Kill it if it still runs, and wait for it."""
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(30)


def _pong(url: str, ping: str, pong: str, listening: threading.Event) -> None:
    import psycopg
    from psycopg import sql

    with (
        psycopg.connect(libpq(url), autocommit=True) as listen,
        psycopg.connect(libpq(url), autocommit=True) as answer,
    ):
        listen.execute(sql.SQL("LISTEN {}").format(sql.Identifier(ping)))
        listening.set()
        for notice in listen.notifies():
            answer.execute("SELECT pg_notify(%s, %s)", (pong, notice.payload))


def _steer(url: str, count: int, ping: str, pong: str) -> None:
    plane = Plane.open(url)
    try:
        children: list[str] = []
        plane.grow(children, count)
        listening = threading.Event()
        threading.Thread(target=_pong, args=(url, ping, pong, listening), daemon=True).start()
        if not listening.wait(_READY_S):
            raise RuntimeError("the raw listener never listened")
        ready = {"runtime_id": plane.control.runtime_id, "children": children}
        print("READY " + json.dumps(ready), flush=True)
        sys.stdin.read()  # until the benchmark closes it
    finally:
        plane.close()


def _takeover(url: str, lease_ttl_s: float, host: str) -> None:
    if host != "here":
        # What a runtime on another machine looks like to this one's: a host name that is
        # not ours, so its process cannot be checked and only its lease can lapse.
        socket.gethostname = lambda: host
    plane = Plane.open(url, lease_ttl_s=lease_ttl_s)
    children: list[str] = []
    plane.grow(children, 1)  # runs until the process is killed
    ready = {"runtime_id": plane.control.runtime_id, "child": children[0]}
    print("READY " + json.dumps(ready), flush=True)
    threading.Event().wait(WATCHDOG_S)


def main(argv: list[str]) -> int:
    """Run one peer mode (see the module docstring)."""
    watchdog = threading.Timer(WATCHDOG_S, os._exit, args=(3,))
    watchdog.daemon = True
    watchdog.start()
    mode, url, *args = argv
    if mode == "steer":
        _steer(url, int(args[0]), args[1], args[2])
    elif mode == "takeover":
        _takeover(url, float(args[0]), args[1])
    else:
        raise SystemExit(f"unknown peer mode {mode!r}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
