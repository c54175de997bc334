"""What dead runtimes leave in the store, deleted once nobody can need it.

Every process that opens the store adds a runtime row, and a process that dies without
`close()` (SIGKILL, a crash) leaves its forwarded messages' inbox rows behind as well: the
sender deletes them once it has their outcomes, and a dead sender never does. Nothing else
would ever delete either, so both tables grew with every process ever run (126 inbox rows
after one stress run).

Each live runtime's heartbeat thread, after its sweep, deletes them (`expire_leftovers`),
judging only runtimes *gone* — dead for good, not merely late (`Runtime.is_gone`): closed;
its process gone (same host and boot); or its lease lapsed more than `RETAIN_LAPSED_S`
ago, far longer than any outage a live runtime rides through. A runtime that is only
late, or whose store was down, keeps everything.

- An inbox row goes with its gone sender: nobody waits for its outcome any more. An
  ``abandoned`` row stays until its target is gone too, since it is what refuses a late
  take of the message (its sender was told ``NOT_DELIVERED``); the target itself deletes
  it once its one take was refused (`controlplane.runtime.routing._forwarding`). Rows are never
  touched on a live sender's behalf (`persistence.Inbox.expire`).
- An approval request goes `RETAIN_ANSWERED_S` after it was answered (or asked, if its
  Task settled unanswered), once its run took the answer or its Task no longer runs: the
  table kept every request ever answered (176 rows after 3,500 turns).
- A gone runtime's row goes once no running Task names it (the sweep settles those
  first, and releases their claims), and only if it did not renew meanwhile
  (`persistence.TaskLedger.expire_runtimes`). A settled Task keeps its ``runtime_id``:
  the id alone, like a closed process's pid, still says where it ran; a runtime missing
  from the store is dead to every check (`Runtime.is_dead_id`, a kill's lookup, a claim's
  takeover).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import timedelta
from typing import TYPE_CHECKING, Final

from controlplane.contract import RuntimeInfo, utcnow

if TYPE_CHECKING:
    from persistence import LeaseNow, SqlStore

__all__ = ["RETAIN_ANSWERED_S", "RETAIN_LAPSED_S", "expire_leftovers"]

log = logging.getLogger(__name__)

RETAIN_LAPSED_S: Final = 3600.0
"""How long past its lease a runtime that neither closed nor is known gone on this host is
kept: it may be alive behind a partition or a store outage, and renew again."""


RETAIN_ANSWERED_S: Final = 86400.0
"""How long an approval request is kept once done with (answered and taken, or its Task
settled): a day, for `answer` to say ``REQUEST_CLOSED`` rather than not found; the
transcript keeps every request and answer for good."""


def expire_leftovers(
    store: SqlStore, own_id: str, *, is_gone: Callable[[RuntimeInfo, LeaseNow], bool]
) -> tuple[int, int]:
    """Delete the inbox rows and runtime rows of runtimes gone for good; how many of each
    went (inbox rows, runtime rows)."""
    now = store.ledger.now()
    gone = [r for r in store.ledger.runtimes() if r.runtime_id != own_id and is_gone(r, now)]
    inbox_rows = 0
    if store.inbox is not None:
        inbox_rows = store.inbox.expire([r.runtime_id for r in gone])
    runtime_rows = store.ledger.expire_runtimes(gone) if gone else 0
    pruned = store.approvals.prune(utcnow() - timedelta(seconds=RETAIN_ANSWERED_S))
    if pruned:
        log.info("pruned %d approval request(s) answered over %gs ago", pruned, RETAIN_ANSWERED_S)
    if inbox_rows or runtime_rows:
        log.info("expired %d inbox row(s) and %d runtime row(s) of dead runtimes",
                 inbox_rows, runtime_rows)  # fmt: skip
    return inbox_rows, runtime_rows
