"""The durable store: child headers and append-only transcripts, in SQLite or PostgreSQL.

`SqlStore` is the store; `RetryPolicy` says how it retries transient database failures.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from controlplane.contract import loaded_on_first_use

if TYPE_CHECKING:
    from persistence._approvals import Answered, ApprovalBook, StoredRequest, WaitingRequest
    from persistence._claims import Recovered, TaskInRecovery
    from persistence._codec import SteeringRecord, steering_record
    from persistence._host_clock import LeaseNow, boot_id, host_name, is_expired
    from persistence._inbox import Inbox, InboxItem, Listener
    from persistence._ledger import TaskLedger
    from persistence._overview import ChangeMarker, KeyedTask, StoreOverview
    from persistence._queue import AdmissionQueue, Admitted, QueueHead, QueuePlace
    from persistence._queue_listener import AdmissionListener
    from persistence._retry import RetryPolicy
    from persistence._spend import ScopeCounts, ScopeSpend, SpendLedger
    from persistence._sqlite_tasks import sqlite_recent_tasks
    from persistence._store import SqlStore
    from persistence._takeable import Takeable, Watch
    from persistence._task_sql import Fence, Settlement, TxStep

__all__ = [
    "AdmissionListener",
    "AdmissionQueue",
    "Admitted",
    "Answered",
    "ApprovalBook",
    "ChangeMarker",
    "Fence",
    "Inbox",
    "InboxItem",
    "KeyedTask",
    "LeaseNow",
    "Listener",
    "QueueHead",
    "QueuePlace",
    "Recovered",
    "RetryPolicy",
    "ScopeCounts",
    "ScopeSpend",
    "Settlement",
    "SpendLedger",
    "SqlStore",
    "SteeringRecord",
    "StoreOverview",
    "StoredRequest",
    "Takeable",
    "TaskInRecovery",
    "TaskLedger",
    "TxStep",
    "WaitingRequest",
    "Watch",
    "boot_id",
    "host_name",
    "is_expired",
    "sqlite_recent_tasks",
    "steering_record",
]

# Each name is imported from its module on first use: the store's modules build on
# SQLAlchemy Core (about half the cost of `from controlplane import SubagentControl`),
# which a process needs only once it opens a store, and the command line's `--help` never.
_HOMES: dict[str, str] = {
    **dict.fromkeys(["Answered", "ApprovalBook", "StoredRequest", "WaitingRequest"], "_approvals"),
    **dict.fromkeys(["Recovered", "TaskInRecovery"], "_claims"),
    **dict.fromkeys(["SteeringRecord", "steering_record"], "_codec"),
    **dict.fromkeys(["LeaseNow", "boot_id", "host_name", "is_expired"], "_host_clock"),
    **dict.fromkeys(["Inbox", "InboxItem", "Listener"], "_inbox"),
    **dict.fromkeys(["TaskLedger"], "_ledger"),
    **dict.fromkeys(["ChangeMarker", "KeyedTask", "StoreOverview"], "_overview"),
    **dict.fromkeys(["AdmissionQueue", "Admitted", "QueueHead", "QueuePlace"], "_queue"),
    **dict.fromkeys(["AdmissionListener"], "_queue_listener"),
    **dict.fromkeys(["RetryPolicy"], "_retry"),
    **dict.fromkeys(["ScopeCounts", "ScopeSpend", "SpendLedger"], "_spend"),
    **dict.fromkeys(["sqlite_recent_tasks"], "_sqlite_tasks"),
    **dict.fromkeys(["SqlStore"], "_store"),
    **dict.fromkeys(["Takeable", "Watch"], "_takeable"),
    **dict.fromkeys(["Fence", "Settlement", "TxStep"], "_task_sql"),
}


__getattr__, __dir__ = loaded_on_first_use(__name__, _HOMES, __all__)


# A library logs; the application decides where it goes. Without a handler anywhere,
# logging's last resort would print the store's retry warnings to the host's stderr.
logging.getLogger(__name__).addHandler(logging.NullHandler())
