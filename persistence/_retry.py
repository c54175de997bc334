"""The one retry policy of the store: which failures are transient, and how to wait."""

from __future__ import annotations

import itertools
import logging
import re
import sqlite3
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import tenacity
from sqlalchemy import exc as sa_exc

from controlplane.contract import ErrorCode, SubagentControlError, seconds_problem
from persistence._deadlines import abandonable_sleep, is_abandoned, time_left

__all__ = ["Retrier", "RetryListener", "RetryPolicy", "describe", "is_transient", "retry_cause"]

_log = logging.getLogger(__name__)

T = TypeVar("T")

# SQLite primary result codes: another connection holds the lock we need.
_SQLITE_BUSY = 5
_SQLITE_LOCKED = 6

# PostgreSQL SQLSTATEs worth another attempt: serialization failure, deadlock, lock not
# available (lock_timeout), query canceled (statement_timeout: a lock or a load that the
# next attempt may find free; the policy's bounds stop a statement that is always too
# slow), and the server shutting down or refusing connections for now.
_PG_TRANSIENT_SQLSTATES = frozenset({"40001", "40P01", "55P03", "57014", "57P01", "57P02", "57P03"})
_PG_CONNECTION_CLASS = "08"  # connection_exception and its subclasses

_IMMEDIATE_ATTEMPTS = 8

RetryHook = Callable[[int, BaseException], None]
"""Called before each retry with the number of the attempt that failed and its error."""

RetryListener = Callable[[str, int, str], None]
"""Called before each retry with the operation (``"append events"``…), the number of the
attempt that failed and its cause (`retry_cause`); it must not raise."""


@dataclass(frozen=True, kw_only=True, slots=True)
class RetryPolicy:
    """How the store retries transient failures (busy/locked SQLite, dropped connections,
    serialization failures, deadlocks, a server restarting).

    Retries are bounded by time: no new attempt starts once the next wait would end more
    than ``max_total_s`` after the first failure, so an outage shorter than that budget
    (a PostgreSQL restart, a failover) is ridden through however many attempts it takes.
    A count bound (``max_attempts``) may be set as well; the default has none, because a
    count that runs out first (8 attempts took ~0.8 s) turns a routine restart into failed
    turns and steers. Waits grow exponentially from ``initial_backoff_s`` up to
    ``max_backoff_s``, with full jitter so that competing writers spread out. Anything
    else (bad input, a missing table, a constraint) fails at once.

    Attributes:
        max_attempts: Attempts in all, the first one included (1: never retry); None
            (the default): as many as ``max_total_s`` allows.
        max_total_s: Time budget in seconds for the retries and their waits: the longest
            store outage an operation rides through.
        initial_backoff_s: Upper bound of the first (jittered) wait.
        max_backoff_s: Upper bound of any single wait.
        wait: ``False`` retries at once (for tests); the bounds still apply, and an
            immediate policy keeps a count bound (8 unless given) so that it cannot spin.
        on_retry: Called before each retry as ``on_retry(failed_attempt, error)``; it must
            not raise. Tests use it to observe a retry without sleeping.
    """

    max_attempts: int | None = None
    max_total_s: float = 20.0
    initial_backoff_s: float = 0.01
    max_backoff_s: float = 1.0
    wait: bool = True
    on_retry: RetryHook | None = None

    def __post_init__(self) -> None:
        attempts = self.max_attempts
        if attempts is not None:
            if isinstance(attempts, bool) or not isinstance(attempts, int):
                raise _invalid("max_attempts must be an int or None")
            if attempts < 1:
                raise _invalid("max_attempts must be at least 1")
        elif not self.wait:
            raise _invalid("a policy that does not wait needs max_attempts")
        for name in ("max_total_s", "initial_backoff_s", "max_backoff_s"):
            problem = seconds_problem(getattr(self, name))
            if problem is not None:
                raise _invalid(f"{name} {problem}")

    @classmethod
    def immediate(cls, **options: Any) -> RetryPolicy:
        """A policy that retries without waiting (tests); other options as the constructor,
        with at most 8 attempts unless ``max_attempts`` says otherwise."""
        options.setdefault("max_attempts", _IMMEDIATE_ATTEMPTS)
        return cls(**options, wait=False)


class Retrier:
    """Runs a store's operations under its `RetryPolicy`, and turns database failures
    into ``STORE_UNAVAILABLE``.

    Args:
        policy: The retry policy.
        errors: What the database raises (SQLAlchemy's errors and the driver's own).
    """

    def __init__(self, policy: RetryPolicy, errors: tuple[type[Exception], ...]) -> None:
        # One controller serves every thread: tenacity keeps each call's state in
        # thread-local storage. Calls do not nest (no operation calls another one).
        self._listeners: list[RetryListener] = []
        self._retrying = _tenacity_controller(policy, self._listeners)
        self._errors = errors

    def add_listener(self, listener: RetryListener) -> None:
        """Tell ``listener`` of every retry from now on (metrics, lifecycle logs)."""
        self._listeners.append(listener)

    def run(self, action: str, operation: Callable[[int], T]) -> T:
        """``operation(attempt_number)``, retried while it fails transiently.

        The first attempt runs bare: tenacity's bookkeeping costs about as much as an
        append itself, and nearly every call succeeds at once. A transient failure hands
        the call to tenacity, which replays that failure as attempt 1, so the bounds,
        backoff and hook apply as if it had run the call from the start (the time budget
        counts from that first failure).

        Raises:
            SubagentControlError: ``STORE_UNAVAILABLE`` for a permanent failure, or the
                last transient one once the policy gives up; the operation's own errors
                as they are.
        """
        try:
            try:
                return operation(1)
            except self._errors as exc:
                if not is_transient(exc):
                    raise
                first_failure: Exception | None = exc
                last_failure: Exception = exc
            attempts = itertools.count(1)

            def attempt(_action: str) -> T:  # the action: for the listeners (state.args)
                nonlocal first_failure, last_failure
                number = next(attempts)
                if first_failure is not None:
                    failure, first_failure = first_failure, None
                    raise failure
                if is_abandoned():
                    # Abandoned during the backoff: no further attempt; tenacity stops on
                    # this (no time left) and raises it.
                    raise last_failure
                try:
                    return operation(number)
                except Exception as failed:
                    last_failure = failed
                    raise

            return self._retrying(attempt, action)
        except self._errors as exc:
            cause = getattr(exc, "orig", None)
            if isinstance(cause, SubagentControlError):
                raise cause from None  # our own check, run by SQLAlchemy (a bind parameter)
            if is_missing_database(exc):
                raise SubagentControlError(
                    ErrorCode.STORE_NOT_FOUND,
                    f"could not {action}: {describe(exc)}; the server is reachable but has "
                    "no such database: create it (createdb NAME) or check the URL",
                ) from exc
            raise SubagentControlError(
                ErrorCode.STORE_UNAVAILABLE,
                f"could not {action}: {describe(exc)}; check that the database is "
                "reachable and writable, then retry",
            ) from exc


def _tenacity_controller(policy: RetryPolicy, listeners: list[RetryListener]) -> tenacity.Retrying:
    wait: tenacity.wait.wait_base = (
        tenacity.wait_random_exponential(
            multiplier=policy.initial_backoff_s, max=policy.max_backoff_s
        )
        if policy.wait
        else tenacity.wait_none()
    )
    hook = policy.on_retry

    def before_sleep(state: tenacity.RetryCallState) -> None:
        error = state.outcome.exception() if state.outcome is not None else None
        if error is None:  # pragma: no cover - tenacity only sleeps after a failure
            return
        _log.warning(
            "store attempt %d failed transiently (%s); retrying",
            state.attempt_number,
            describe(error),
        )
        if hook is not None:
            hook(state.attempt_number, error)
        if listeners:
            action = str(state.args[0]) if state.args else ""
            cause = retry_cause(error)
            for listener in list(listeners):
                try:
                    listener(action, state.attempt_number, cause)
                except Exception:  # an observer must never change what the store does
                    _log.exception("a store retry listener failed")

    stop: tenacity.stop.stop_base = tenacity.stop_before_delay(policy.max_total_s)
    if policy.max_attempts is not None:
        stop = stop | tenacity.stop_after_attempt(policy.max_attempts)
    return tenacity.Retrying(
        stop=stop | _PastCallDeadline(),
        wait=wait,
        retry=tenacity.retry_if_exception(is_transient),
        before_sleep=before_sleep,
        sleep=abandonable_sleep,  # a backoff ends once its call is abandoned
        reraise=True,
    )


class _PastCallDeadline(tenacity.stop.stop_base):
    """Stops when no retry would end before the thread's `call_deadline`
    (`persistence._deadlines`)."""

    def __call__(self, retry_state: tenacity.RetryCallState) -> bool:
        left = time_left()
        return left is not None and left <= (retry_state.upcoming_sleep or 0.0)


def is_transient(error: BaseException) -> bool:
    """Whether another attempt of the same operation may succeed.

    Only failures of the database itself qualify: a busy or locked SQLite file, a dropped
    or refused PostgreSQL connection, a serialization failure, a deadlock, a lock or
    statement timeout.
    Bad input, missing tables, constraint violations and our own errors never do.
    """
    if isinstance(error, sa_exc.DBAPIError):
        if error.connection_invalidated:
            return True
        return error.orig is not None and is_transient(error.orig)
    if isinstance(error, sqlite3.OperationalError):
        code = getattr(error, "sqlite_errorcode", None)
        if isinstance(code, int):
            return code & 0xFF in (_SQLITE_BUSY, _SQLITE_LOCKED)
        text = str(error).lower()  # an error raised without a result code
        return "database is locked" in text or "database is busy" in text
    psycopg = sys.modules.get("psycopg")
    if psycopg is not None and isinstance(error, psycopg.Error):
        sqlstate = getattr(error, "sqlstate", None)
        if sqlstate:
            return sqlstate in _PG_TRANSIENT_SQLSTATES or sqlstate.startswith(_PG_CONNECTION_CLASS)
        # No SQLSTATE: the failure happened on the client side of the connection
        # (refused, reset, closed by the server), or the database is not there.
        return isinstance(error, psycopg.OperationalError) and not is_missing_database(error)
    return False


_PG_INVALID_CATALOG_NAME = "3D000"
"""PostgreSQL's SQLSTATE for a database that does not exist."""
_PG_NO_DATABASE = re.compile(r'FATAL: +database ".*" does not exist')


def is_missing_database(error: BaseException) -> bool:
    """Whether the server answered that the database the URL names does not exist: a
    wrong name, not an outage (never transient, never retried)."""
    if isinstance(error, sa_exc.DBAPIError) and error.orig is not None:
        error = error.orig
    psycopg = sys.modules.get("psycopg")
    if psycopg is None or not isinstance(error, psycopg.Error):
        return False
    if getattr(error, "sqlstate", None) == _PG_INVALID_CATALOG_NAME:
        return True
    # Refused while connecting, libpq's error has no SQLSTATE: only the server's words.
    return _PG_NO_DATABASE.search(str(error)) is not None


def retry_cause(error: BaseException) -> str:
    """A transient failure's cause in one word, for counting retries: ``busy``,
    ``locked`` (SQLite), ``serialization``, ``deadlock``, ``lock_timeout``,
    ``statement_timeout``, ``server_unavailable`` (PostgreSQL), ``connection``, or
    ``other``."""
    if isinstance(error, sa_exc.DBAPIError):
        if error.connection_invalidated:
            return "connection"
        return retry_cause(error.orig) if error.orig is not None else "other"
    if isinstance(error, sqlite3.OperationalError):
        code = getattr(error, "sqlite_errorcode", None)
        if isinstance(code, int):
            return "locked" if code & 0xFF == _SQLITE_LOCKED else "busy"
        return "locked" if "locked" in str(error).lower() else "busy"
    psycopg = sys.modules.get("psycopg")
    if psycopg is not None and isinstance(error, psycopg.Error):
        sqlstate = getattr(error, "sqlstate", None) or ""
        if sqlstate in _PG_CAUSES:
            return _PG_CAUSES[sqlstate]
        if sqlstate.startswith("57P"):
            return "server_unavailable"
        return "connection"
    return "other"


_PG_CAUSES = {
    "40001": "serialization",
    "40P01": "deadlock",
    "55P03": "lock_timeout",
    "57014": "statement_timeout",
}


def describe(error: BaseException) -> str:
    """A one-line description of a database error, without SQL text or parameters."""
    cause: BaseException = error
    if isinstance(error, sa_exc.DBAPIError) and error.orig is not None:
        cause = error.orig
    first_line = (str(cause).strip().splitlines() or [""])[0]
    return f"{type(cause).__name__}: {first_line}" if first_line else type(cause).__name__


def _invalid(message: str) -> SubagentControlError:
    return SubagentControlError(ErrorCode.INVALID_INPUT, f"invalid RetryPolicy: {message}")
