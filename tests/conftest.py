"""Shared fixtures: real stores on both backends, no actor left behind, and a control plane
with the fake provider and two parents.

The control plane opens ``url``, SQLite unless a module overrides ``url`` with ``store_url``
(a module whose behaviour depends on the store runs on SQLite and PostgreSQL).
"""

from __future__ import annotations

import os
import threading
import uuid
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pykka
import pytest

from controlplane import AgentHandle, SubagentControl
from tests.fakes import FakeProvider
from tests.reliability.pg_fault import pg_server, tcp_proxy_factory  # noqa: F401 (fixtures)
from tests.support import PARENT_MODEL, MakeControl

PG_URL_ENV = "SUBAGENT_CONTROL_TEST_PG_URL"


def pg_base_url() -> str | None:
    """The PostgreSQL URL the tests may use, or None when none is configured/reachable."""
    url = os.environ.get(PG_URL_ENV)
    if not url:
        return None
    try:
        import psycopg

        with psycopg.connect(_libpq(url), connect_timeout=3):
            pass
    except Exception:
        return None
    return url


def _libpq(url: str) -> str:
    return url.replace("postgresql+psycopg://", "postgresql://", 1)


@pytest.fixture(scope="session")
def pg_url_base() -> str:
    url = pg_base_url()
    if url is None:
        pytest.skip(
            f"PostgreSQL not available: set {PG_URL_ENV} to a reachable server "
            "(.ci/run does this) to run the PostgreSQL tests"
        )
    return url


@pytest.fixture
def pg_url(pg_url_base: str) -> Iterator[str]:
    """A PostgreSQL URL whose search_path is a fresh schema, dropped after the test."""
    import psycopg

    schema = f"t_{uuid.uuid4().hex[:16]}"
    with psycopg.connect(_libpq(pg_url_base), autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{schema}"')
    sep = "&" if "?" in pg_url_base else "?"
    try:
        yield f"{pg_url_base}{sep}options=-csearch_path%3D{schema}"
    finally:
        with psycopg.connect(_libpq(pg_url_base), autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


@pytest.fixture
def sqlite_url(tmp_path: os.PathLike[str]) -> str:
    return f"sqlite:///{os.fspath(tmp_path)}/state.db"


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def store_url(request: pytest.FixtureRequest) -> str:
    """A fresh store URL on each backend (PostgreSQL skips when no server is reachable)."""
    if request.param == "sqlite":
        return str(request.getfixturevalue("sqlite_url"))
    return str(request.getfixturevalue("pg_url"))


@pytest.fixture(autouse=True)
def _stop_every_actor() -> Iterator[None]:
    """No test leaks an actor (pykka threads are non-daemon: a leak hangs the run)."""
    yield
    pykka.ActorRegistry.stop_all(block=True, timeout=10)


@pytest.fixture
def url(sqlite_url: str) -> str:
    """The store the control plane opens (SQLite unless a module overrides it)."""
    return sqlite_url


@pytest.fixture
def provider() -> FakeProvider:
    """The fake provider, registered as ``fake`` on every control plane a test makes."""
    return FakeProvider()


@pytest.fixture
def make_control(url: str, provider: FakeProvider) -> Iterator[MakeControl]:
    """Build control planes on ``url`` (closed after the test) with ``provider`` registered."""
    made: list[SubagentControl] = []

    def make(store_url: str | None = None, **options: Any) -> SubagentControl:
        control = SubagentControl.open(store_url or url, **options)
        control.providers.register(provider)
        made.append(control)
        return control

    yield make
    for control in made:
        control.close(timeout_s=10.0)


@pytest.fixture
def control(make_control: MakeControl) -> SubagentControl:
    """A control plane on the test's store."""
    return make_control()


@pytest.fixture
def parent(control: SubagentControl) -> AgentHandle:
    """The live parent that owns the children a test starts."""
    return control.agents.register("parent-1", model=PARENT_MODEL)


@pytest.fixture
def stranger(control: SubagentControl) -> AgentHandle:
    """Another live parent session: it must never reach ``parent``'s children or Tasks."""
    return control.agents.register("parent-2", model=PARENT_MODEL)


@pytest.fixture
def hold() -> Iterator[threading.Event]:
    """A gate a test may close runs with: it opens when the test ends."""
    gate = threading.Event()
    yield gate
    gate.set()


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """Each skip reason once, with how many tests it skipped (``-ra`` printed one line per
    test: hundreds of identical "PostgreSQL not available" lines burying the result)."""
    reasons: Counter[str] = Counter()
    for report in terminalreporter.stats.get("skipped", []):
        longrepr = report.longrepr
        reason = longrepr[2] if isinstance(longrepr, tuple) else str(longrepr)
        reasons[reason.removeprefix("Skipped: ")] += 1
    if not reasons:
        return
    terminalreporter.section("skipped, by reason", sep="-")
    for reason, count in reasons.most_common():
        terminalreporter.line(f"{count:5} {reason}")
