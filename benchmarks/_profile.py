"""cProfile across threads: where a steer or a resume spends its time.

A steer or a resume crosses three threads (caller, supervisor, activation), and cProfile
sees one thread at a time. `profile_threads` enables one profiler per thread — the
caller's, and every thread started inside the block — and merges them.
"""

from __future__ import annotations

import contextlib
import cProfile
import io
import pstats
import sys
import threading
from collections.abc import Iterator
from types import FrameType
from typing import Any

__all__ = ["profile_threads"]


@contextlib.contextmanager
def profile_threads(
    out: list[str], *, top: int = 30, sort: str = "tottime", only: str | None = None
) -> Iterator[None]:
    """Profile the block on every thread; append the merged, sorted report to ``out``
    (its ``top`` lines, of those whose file or function matches the regex ``only``).

    End every thread the block started inside it (close the control plane): a thread's
    profiler runs until the thread ends.
    """
    profiles: list[cProfile.Profile] = []
    lock = threading.Lock()

    def hook(_frame: FrameType, _event: str, _arg: Any) -> None:
        # The first profile event of a new thread swaps this hook for a real profiler.
        sys.setprofile(None)
        profile = cProfile.Profile()
        with lock:
            profiles.append(profile)
        profile.enable()

    main = cProfile.Profile()
    profiles.append(main)
    threading.setprofile(hook)
    main.enable()
    try:
        yield
    finally:
        main.disable()
        threading.setprofile(None)  # type: ignore[arg-type, unused-ignore]
        buffer = io.StringIO()
        stats = pstats.Stats(main, stream=buffer)
        with lock:
            for profile in profiles[1:]:
                with contextlib.suppress(TypeError):  # a profiler that saw nothing
                    stats.add(profile)
        restrictions: list[str | int] = [only] if only else []
        stats.sort_stats(sort).print_stats(*restrictions, top)
        out.append(buffer.getvalue())
