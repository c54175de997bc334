"""Stored timestamps, both ways: kept apart from the table definitions so that a read
that builds no table (the command line's SQLite read of the Tasks,
`persistence._sqlite_tasks`) decodes them without SQLAlchemy."""

from __future__ import annotations

from datetime import UTC, datetime

__all__ = ["sqlite_time", "utc_time"]


def utc_time(value: object) -> datetime:
    """A database timestamp as a timezone-aware UTC datetime.

    SQLite returns our fixed-width ISO text; PostgreSQL returns ``timestamptz`` values
    already in UTC (the connection's time zone), which pass through untouched.
    """
    if isinstance(value, str):
        return datetime.fromisoformat(value)
    if isinstance(value, datetime):
        return value if value.tzinfo is UTC else value.astimezone(UTC)
    raise TypeError(f"not a stored timestamp: {value!r}")


def sqlite_time(value: datetime) -> str:
    """Fixed-width ISO-8601 text in UTC, so that text order is time order."""
    if value.tzinfo is not UTC:  # an append's own stamp is UTC already (`utcnow`)
        value = value.astimezone(UTC)
    return value.isoformat(timespec="microseconds")
