"""A TCP relay that holds every chunk for a fixed delay before passing it on, each way:
latency on a link where the kernel has no ``netem`` qdisc (`netns.DelayRelay` runs it in
the store's network namespace).

Usage: ``python tests/reliability/delay_relay.py LISTEN_HOST LISTEN_PORT TO_HOST TO_PORT DELAY_S``

Prints ``relaying`` once it listens, then relays until it is killed (its parent's job).
Order is kept: each direction is one queue, released in order at each chunk's due time.
"""

from __future__ import annotations

import contextlib
import socket
import sys
import threading
import time
from collections import deque


def _pump(src: socket.socket, dst: socket.socket, delay_s: float) -> None:
    queue: deque[tuple[float, bytes]] = deque()
    ready = threading.Condition()
    ended = threading.Event()

    def read() -> None:
        try:
            while chunk := src.recv(65536):
                with ready:
                    queue.append((time.monotonic() + delay_s, chunk))
                    ready.notify()
        except OSError:
            pass
        ended.set()
        with ready:
            ready.notify()

    threading.Thread(target=read, daemon=True).start()
    try:
        while True:
            with ready:
                while not queue and not ended.is_set():
                    ready.wait()
                if not queue:
                    break
                due, chunk = queue.popleft()
            pause = due - time.monotonic()
            if pause > 0:
                time.sleep(pause)  # the latency itself
            dst.sendall(chunk)
    except OSError:
        pass
    for sock in (src, dst):
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)


def main() -> None:
    host, port, to_host, to_port, delay = sys.argv[1:6]
    delay_s = float(delay)
    server = socket.socket()
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    server.bind((host, int(port)))
    server.listen(128)
    print("relaying", flush=True)
    while True:
        client, _ = server.accept()
        try:
            upstream = socket.create_connection((to_host, int(to_port)), timeout=10)
        except OSError:
            client.close()
            continue
        upstream.settimeout(None)
        for src, dst in ((client, upstream), (upstream, client)):
            threading.Thread(target=_pump, args=(src, dst, delay_s), daemon=True).start()


if __name__ == "__main__":
    main()
