"""A process that serves a hand-built tree on an admin socket until SIGTERM.

Run as ``python -m tests.cli.serve_fake_tree SOCKET``; prints ``ready`` once serving.
"""

from __future__ import annotations

import signal
import sys
import threading

from controlplane._admin import AdminServer
from tests.cli.cli_support import sample_tree


def main(path: str) -> int:
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    with AdminServer(path, dump=sample_tree):
        print("ready", flush=True)
        stop.wait()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
