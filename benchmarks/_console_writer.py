"""A writer in its own process for ``benchmarks.console``: on each ``go N`` line it appends
one assistant message ``mark-N`` to a child and prints ``T <wall seconds>`` once the append
has committed; ``quit`` ends it."""

from __future__ import annotations

import sys
import time

from controlplane.contract import NewEvent
from persistence import SqlStore


def main(url: str, child_id: str) -> None:
    with SqlStore(url) as store:
        print("READY", flush=True)
        for line in sys.stdin:
            word, _, number = line.strip().partition(" ")
            if word != "go":
                break
            store.append(
                child_id,
                [NewEvent(kind="assistant/message", turn=1, data={"text": f"mark-{number}"})],
            )
            print(f"T {time.time():.6f}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
