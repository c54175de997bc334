"""The durable store: child headers and append-only transcripts, in SQLite or PostgreSQL.

`SqlStore` is the store; `RetryPolicy` says how it retries transient database failures.
"""

from __future__ import annotations

import logging

from persistence._approvals import Answered, ApprovalBook, StoredRequest, WaitingRequest
from persistence._claims import Recovered, TaskInRecovery
from persistence._host_clock import LeaseNow, boot_id, host_name, is_expired
from persistence._inbox import Inbox, InboxItem, Listener
from persistence._ledger import TaskLedger
from persistence._overview import ChangeMarker, KeyedTask, StoreOverview
from persistence._queue import AdmissionQueue, Admitted, QueueHead, QueuePlace
from persistence._queue_listener import AdmissionListener
from persistence._retry import RetryPolicy
from persistence._spend import ScopeSpend, SpendLedger
from persistence._store import SqlStore
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
    "ScopeSpend",
    "Settlement",
    "SpendLedger",
    "SqlStore",
    "StoreOverview",
    "StoredRequest",
    "TaskInRecovery",
    "TaskLedger",
    "TxStep",
    "WaitingRequest",
    "boot_id",
    "host_name",
    "is_expired",
]

# A library logs; the application decides where it goes. Without a handler anywhere,
# logging's last resort would print the store's retry warnings to the host's stderr.
logging.getLogger(__name__).addHandler(logging.NullHandler())
