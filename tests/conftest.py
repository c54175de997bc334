"""Shared fixtures: real stores on both backends, and no actor left behind."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator

import pykka
import pytest

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
