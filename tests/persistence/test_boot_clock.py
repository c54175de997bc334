"""SQLite leases on the host's boot clock (schema version 6): what a heartbeat records, how a
lease is judged from it, and the upgrade of a store whose runtimes had only wall-clock
heartbeats (version 5)."""

from __future__ import annotations

from datetime import timedelta

import sqlalchemy as sa

from controlplane.contract import RuntimeInfo, utcnow
from persistence import LeaseNow, RetryPolicy, SqlStore, is_expired
from persistence._host_clock import boot_id, boot_seconds
from persistence._schema import SCHEMA_VERSION
from tests.persistence.conftest import raw_engine

TTL = 10.0
BOOT = "6f1c52a2-0c4e-4c5e-9d59-0d1f4c7f8a11"


def runtime(**fields: object) -> RuntimeInfo:
    now = utcnow()
    values: dict[str, object] = {
        "runtime_id": "runtime-1",
        "host": "host-a",
        "pid": 4242,
        "boot_id": BOOT,
        "started_at": now,
        "heartbeat_at": now,
        "lease_ttl_s": TTL,
        "heartbeat_boot_s": 1000.0,
    }
    return RuntimeInfo.model_validate(values | fields)


def test_on_one_boot_the_lease_is_judged_on_the_boot_clock_whatever_the_wall_clocks_say() -> None:
    fresh = runtime()
    wall = fresh.heartbeat_at
    ahead = LeaseNow(wall=wall + timedelta(seconds=120), host="host-a", boot=(BOOT, 1005.0))
    assert not is_expired(fresh, ahead)  # a wall clock two minutes ahead lapses nothing
    behind = LeaseNow(wall=wall - timedelta(seconds=120), host="host-a", boot=(BOOT, 1011.0))
    assert is_expired(fresh, behind)  # nor does one behind keep a lapsed lease alive


def test_a_lease_written_before_this_hosts_reboot_has_lapsed() -> None:
    now = LeaseNow(wall=utcnow(), host="host-a", boot=("another-boot", 3.0))
    assert is_expired(runtime(), now)


def test_other_hosts_and_rows_without_a_boot_clock_are_judged_on_the_wall_clock() -> None:
    wall = utcnow()
    elsewhere = LeaseNow(wall=wall, host="host-b", boot=("another-boot", 3.0))
    assert not is_expired(runtime(), elsewhere)
    assert is_expired(runtime(), wall + timedelta(seconds=TTL + 1))
    old_row = runtime(heartbeat_boot_s=None)  # written by version 5
    assert not is_expired(old_row, LeaseNow(wall=wall, host="host-a", boot=(BOOT, 9e9)))


def test_a_sqlite_heartbeat_records_the_boot_clock_and_its_boot(sqlite_url: str) -> None:
    with SqlStore(sqlite_url, retry=RetryPolicy.immediate()) as store:
        before = boot_seconds()
        store.ledger.register_runtime("r", host="h", pid=1, boot_id=boot_id(), lease_ttl_s=TTL)
        assert store.ledger.heartbeat("r")
        (row,) = store.ledger.runtimes()
    assert before is not None
    assert row.heartbeat_boot_s is not None
    assert before <= row.heartbeat_boot_s <= (boot_seconds() or 0.0)


def test_a_version_5_store_gains_the_boot_clock_and_keeps_its_runtimes(sqlite_url: str) -> None:
    with SqlStore(sqlite_url, retry=RetryPolicy.immediate()) as store:
        store.ledger.register_runtime("old", host="h", pid=1, boot_id=BOOT, lease_ttl_s=TTL)
    engine = raw_engine(sqlite_url)
    with engine.begin() as conn:  # what version 5 wrote: no boot clock column
        conn.execute(sa.text("ALTER TABLE subagent_runtimes DROP COLUMN heartbeat_boot_s"))
        conn.execute(sa.text("UPDATE subagent_schema SET version = 5"))
    engine.dispose()

    with SqlStore(sqlite_url, retry=RetryPolicy.immediate()) as store:
        (old,) = store.ledger.runtimes()
        assert (old.runtime_id, old.heartbeat_boot_s) == ("old", None)
        assert store.ledger.heartbeat("old")
        (renewed,) = store.ledger.runtimes()
        assert renewed.heartbeat_boot_s is not None
    engine = raw_engine(sqlite_url)
    with engine.connect() as conn:
        version = conn.execute(sa.text("SELECT version FROM subagent_schema")).scalar_one()
    engine.dispose()
    assert version == SCHEMA_VERSION >= 6
