"""The durable store: child headers and append-only transcripts, in SQLite or PostgreSQL.

`SqlStore` is the store; `RetryPolicy` says how it retries transient database failures.
"""

from __future__ import annotations

from persistence._retry import RetryPolicy
from persistence._store import SqlStore

__all__ = ["RetryPolicy", "SqlStore"]
