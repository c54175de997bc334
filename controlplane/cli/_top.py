"""``subagent-control top``: a live view of a running process's children, refreshed in place.

One line per live child (each supervisor of the process): its state (``queued`` while its
Task waits for a concurrency slot), its Task, how long its activation has run, its place in
the queue and how long it waited, the messages held for its publication and its mailbox
depth. On a
terminal the view redraws every ``--interval`` seconds on the alternate screen and ends on
``q`` (or Ctrl-C), leaving the screen as it was; when stdout is not a terminal it prints
plain frames (one by default) and exits, so ``top | grep`` and scripts work.

It reads only what ``tree`` reads (the admin socket), and shows every id and reason with
control characters escaped, as ``tree`` does.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import select
import shutil
import sys
import time
from collections.abc import Callable, Iterator
from typing import IO, Final

from controlplane.contract import ActorTree, SupervisorNode, escape_controls

__all__ = ["ID_SHOWN", "render", "run_top"]

_HEADER: Final = (
    "CHILD", "STATE", "TASK", "AGE", "QUEUE", "TOKENS", "COST", "HELD", "MAILBOX",
    "PARENT  LABEL",
)  # fmt: skip
_ID_COLUMNS: Final = (0, 2)  # CHILD, TASK
ID_SHOWN: Final = 8
"""The shortest prefix of an id ``top`` shows in a fitted view (the demo prints as many)."""
_MIN_LAST: Final = 4
_ORDER: Final = {
    "running": 0,
    "starting": 1,
    "input_required": 2,
    "queued": 3,
    "settling": 4,
    "busy": 5,
    "idle": 6,
}
_QUIT_KEYS: Final = frozenset(b"qQ")
_ENTER_SCREEN: Final = "\x1b[?1049h\x1b[?25l"  # alternate screen, cursor hidden
_LEAVE_SCREEN: Final = "\x1b[?25h\x1b[?1049l"
_HOME: Final = "\x1b[H"
_CLEAR_LINE: Final = "\x1b[K"
_CLEAR_BELOW: Final = "\x1b[J"


def render(
    tree: ActorTree, *, source: str, error: str | None = None, width: int | None = None
) -> list[str]:
    """The view of ``tree`` as lines: a summary, a header, then one row per child,
    busiest first (running, starting, settling, busy, idle; the oldest activation first).

    ``width``: rows wider than that many columns are fitted by cutting the wide columns,
    not the useful ones: the child and Task ids shrink to a prefix unique among the rows
    (at least `ID_SHOWN` characters, which every id argument of the CLI accepts), and the
    parent session is clipped to what is left. None: whole ids and names, however wide.
    """
    nodes = sorted(tree.supervisors, key=_rank)
    counts: dict[str, int] = {}
    for node in nodes:
        counts[_state(node)] = counts.get(_state(node), 0) + 1
    states = ", ".join(f"{counts[s]} {s}" for s in _ORDER if s in counts) or "none"
    noun = "child" if len(nodes) == 1 else "children"
    at = tree.taken_at.astimezone().strftime("%H:%M:%S")
    closed = " (closed)" if tree.closed else ""
    when = f"{at}{closed} — {len(nodes)} {noun}: {states}"
    summary = f"subagent-control top — {source} — {when}"
    if width is not None and len(summary) > width:
        summary = f"top — {when}"  # the counts matter more than the socket's path
    rows = [_HEADER, *(_row(node) for node in nodes)]
    table = _table(rows)
    if width is not None and max(len(line) for line in table) > width:
        table = _table(_short_ids(rows), width=width)
    lines = [escape_controls(summary)]
    if error is not None:
        lines.append(escape_controls(f"! {error} (showing the last view)"))
    return [*lines, *table]


def _rank(node: SupervisorNode) -> tuple[int, float]:
    age = node.activation.age_s if node.activation is not None else 0.0
    return _ORDER.get(_state(node), len(_ORDER)), -age


def _state(node: SupervisorNode) -> str:
    """The supervisor's state, or ``queued`` while its Task waits for a slot, or
    ``input_required`` while its child waits for an approval answer."""
    if node.task_status in ("queued", "input_required"):
        return node.task_status
    return node.state


def _queue(node: SupervisorNode) -> str:
    """``#position wait`` while queued, ``waited wait`` once admitted after a wait."""
    activation = node.activation
    if activation is None or activation.queued_s is None:
        return "-"
    if activation.queue_position is not None:
        return f"#{activation.queue_position} {_age(activation.queued_s)}"
    return f"waited {_age(activation.queued_s)}"


def _row(node: SupervisorNode) -> tuple[str, ...]:
    activation = node.activation
    return (
        node.child_id,
        _state(node),
        node.task_id or "-",
        _age(activation.age_s) if activation is not None else "-",
        _queue(node),
        f"{activation.usage.total_tokens:,}" if activation is not None else "-",
        _cost(activation.usage.cost if activation is not None else None),
        str(node.held_messages),
        str(node.mailbox_depth),
        # Free text, last: the label follows its parent, and a narrow view clips it first.
        f"{node.parent_session or '?'}  {node.label}" if node.label else node.parent_session or "?",
    )


def _cost(cost: float | None) -> str:
    """A cost in USD, or ``-`` where none is known (no price: unknown, not zero)."""
    return "-" if cost is None else f"${cost:,.4f}"


def _age(seconds: float) -> str:
    if seconds < 60:
        return f"{seconds:.1f}s"
    minutes, secs = divmod(int(seconds), 60)
    if minutes < 60:
        return f"{minutes}m{secs:02d}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m"


def _short_ids(rows: list[tuple[str, ...]]) -> list[tuple[str, ...]]:
    """The rows with each id column cut to one prefix length that keeps its ids apart."""
    header, *body = rows
    for column in _ID_COLUMNS:
        keep = _unique_length({row[column] for row in body if row[column] != "-"})
        body = [(*row[:column], row[column][:keep], *row[column + 1 :]) for row in body]
    return [header, *body]


def _unique_length(ids: set[str]) -> int:
    """The shortest length, at least `ID_SHOWN`, at which no two of ``ids`` share a prefix
    (sorted, an id shares the longest prefix with a neighbour)."""
    ordered = sorted(ids)
    longest = max((_shared(a, b) for a, b in itertools.pairwise(ordered)), default=0)
    return max(ID_SHOWN, longest + 1)


def _shared(a: str, b: str) -> int:
    """How many leading characters ``a`` and ``b`` share."""
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def _table(rows: list[tuple[str, ...]], *, width: int | None = None) -> list[str]:
    cells = [[escape_controls(cell) for cell in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(_HEADER) - 1)]
    gap = 2
    if width is not None:
        # The last column (the parent session and label) takes what the others leave. When two
        # spaces between columns leave it too little, one does; past a few characters of
        # it, the terminal cuts the row.
        last = max(len(row[-1]) for row in cells)
        if width - sum(widths) - gap * len(widths) < min(last, _MIN_LAST * 2):
            gap = 1
        room = max(_MIN_LAST, width - sum(widths) - gap * len(widths))
        for row in cells:
            row[-1] = _clip(row[-1], room)
    sep = " " * gap
    return [
        sep.join([*(c.ljust(w) for c, w in zip(row, widths, strict=False)), row[-1]]).rstrip()
        for row in cells
    ]


def _clip(text: str, room: int) -> str:
    return text if len(text) <= room else text[: room - 1] + "…"


def run_top(
    fetch: Callable[[], ActorTree],
    *,
    out: IO[str],
    source: str,
    interval_s: float,
    iterations: int | None,
    wide: bool = False,
    keys: IO[str] | None = None,
) -> None:
    """Show ``fetch()`` every ``interval_s`` seconds: live on a terminal until ``q`` (or
    ``iterations`` frames), else ``iterations`` plain frames (default one).

    On a terminal each frame fits its width (`render`) unless ``wide``; plain frames are
    never cut, so a script or ``grep`` sees whole ids.

    Raises:
        Whatever ``fetch`` raises when not on a terminal, or for the first frame.
    """
    keys = sys.stdin if keys is None else keys
    if not out.isatty():
        _plain(fetch, out=out, source=source, interval_s=interval_s, frames=iterations or 1)
        return
    tree = fetch()  # an unreachable socket is the command's error, not a screen of it
    with _screen(out), _cbreak(keys) as key_fd:
        frames = 0
        error: str | None = None
        while True:
            size = shutil.get_terminal_size()
            fit = None if wide else size.columns
            _draw(out, render(tree, source=source, error=error, width=fit), size, wide=wide)
            frames += 1
            if iterations is not None and frames >= iterations:
                return
            if _quit_within(key_fd, interval_s):
                return
            try:
                tree, error = fetch(), None
            except Exception as exc:  # the process may be gone for now: say so, keep trying
                error = getattr(exc, "message", None) or str(exc) or type(exc).__name__


def _plain(
    fetch: Callable[[], ActorTree], *, out: IO[str], source: str, interval_s: float, frames: int
) -> None:
    for frame in range(frames):
        if frame:
            time.sleep(interval_s)  # the refresh interval, not a synchronisation
            out.write("\n")
        out.write("\n".join(render(fetch(), source=source)) + "\n")
        out.flush()


def _draw(out: IO[str], lines: list[str], size: os.terminal_size, *, wide: bool) -> None:
    """One frame from the top of the screen: each line cut at the terminal's width, or
    (``wide``) whole, wrapping onto as many screen rows as it needs."""
    rows_left = max(1, size.lines - 1)
    shown: list[str] = []
    for line in lines:
        rows = -(-len(line) // size.columns) if wide and line else 1
        if rows > rows_left:
            break
        shown.append(line if wide else line[: size.columns])
        rows_left -= rows
    if len(shown) < len(lines):
        hidden = len(lines) - len(shown) + (1 if shown else 0)
        shown[-1:] = [f"… {hidden} more (enlarge the terminal)"]
    text = _CLEAR_LINE + "\n".join(line + _CLEAR_LINE for line in shown)
    out.write(_HOME + text + "\n" + _CLEAR_BELOW)
    out.flush()


def _quit_within(key_fd: int | None, timeout_s: float) -> bool:
    """Wait up to ``timeout_s`` for a key; whether it was a quit key."""
    deadline = time.monotonic() + timeout_s
    while (left := deadline - time.monotonic()) > 0:
        if key_fd is None:
            time.sleep(left)
            return False
        ready, _, _ = select.select([key_fd], [], [], left)
        if not ready:
            return False
        typed = os.read(key_fd, 64)
        if not typed:  # end of input: nothing more will be typed
            key_fd = None
            continue
        if any(byte in _QUIT_KEYS for byte in typed):
            return True
    return False


@contextlib.contextmanager
def _screen(out: IO[str]) -> Iterator[None]:
    out.write(_ENTER_SCREEN)
    try:
        yield
    except KeyboardInterrupt:  # Ctrl-C quits, as q does
        pass
    finally:
        out.write(_LEAVE_SCREEN)
        out.flush()


@contextlib.contextmanager
def _cbreak(keys: IO[str]) -> Iterator[int | None]:
    """Keys one at a time, not echoed, from ``keys`` if it is a terminal (else None)."""
    try:
        fd = keys.fileno()
    except (AttributeError, OSError, ValueError):
        yield None
        return
    if not os.isatty(fd):
        yield None
        return
    import termios
    import tty

    saved = termios.tcgetattr(fd)
    try:
        tty.setcbreak(fd)
        yield fd
    finally:
        termios.tcsetattr(fd, termios.TCSADRAIN, saved)
