"""A dead runtime's database sessions are ended before its Tasks are taken over
(PostgreSQL): a transaction it left open on the server, holding its child's row lock, no
longer keeps the others from carrying the child's Task on.

A cut-off runtime's transaction can keep its child's row lock for as long as the cut lasts,
past the server's idle-in-transaction timeout (seen in a recovery stress run: 12 s). The
test makes such a transaction with a connection of its own, named as the SIGKILLed
runtime's sessions are (`persistence._sessions.session_name`), with the server's idle
timeout off; the recovering runtime must end it and finish the Task.
"""

from __future__ import annotations

from pathlib import Path

import psycopg
import pytest
from sqlalchemy import make_url

from controlplane import InProcessProvider, ScriptedModel, SubagentControl, TaskStatus
from persistence._sessions import session_name
from tests.reliability.processes import Reaper, reaping
from tests.reliability.recovery_child import PARENT, work_tool
from tests.reliability.recovery_setup import killed_at
from tests.support import WAIT_S

pytestmark = [pytest.mark.postgres, pytest.mark.slow]

reaped = pytest.fixture(reaping, name="reaped")


def _libpq(url: str) -> str:
    return url.replace("postgresql+psycopg://", "postgresql://", 1)


def _options(url: str) -> str:
    """The URL's own libpq options (the test's schema), to keep beside ours."""
    given = make_url(url).query.get("options", "")
    return given if isinstance(given, str) else " ".join(given)


def test_a_dead_runtimes_open_transaction_on_its_child_is_ended_and_its_task_carried_on(
    reaped: Reaper, pg_url: str, tmp_path: Path
) -> None:
    runs = tmp_path / "runs.jsonl"
    ready = killed_at(reaped, pg_url, "model", runs)
    task_id, child_id, dead = str(ready["task_id"]), str(ready["child_id"]), ready["runtime_id"]

    stuck = psycopg.connect(
        _libpq(pg_url),
        application_name=session_name(str(dead)),
        options=f"{_options(pg_url)} -c idle_in_transaction_session_timeout=0",
    )
    try:
        locked = stuck.execute(
            "SELECT child_id FROM subagent_children WHERE child_id = %s FOR UPDATE", (child_id,)
        ).fetchall()
        assert locked == [(child_id,)]  # the row lock, in a transaction left open

        with SubagentControl.open(pg_url, lease_ttl_s=30.0) as control:
            model = ScriptedModel(["finished after recovery"])
            control.providers.register(InProcessProvider(model, tools=[work_tool(runs)]))
            parent = control.agents.register(PARENT)
            done = control.tasks.wait(task_id, timeout=WAIT_S * 2, requester=parent)
            assert done.status is TaskStatus.COMPLETED, done
            assert done.recoveries == 1

        with pytest.raises(psycopg.OperationalError):  # its session was ended
            stuck.execute("SELECT 1").fetchall()
    finally:
        stuck.close()


def test_the_sessions_of_a_live_runtime_are_never_ended(pg_url: str) -> None:
    with (
        SubagentControl.open(pg_url, lease_ttl_s=30.0) as control,
        psycopg.connect(_libpq(pg_url), autocommit=True) as watcher,
    ):
        assert control.store is not None
        named = session_name(control.runtime_id)
        control.store.ledger.get("no-such-task")  # a session of its own, named
        rows = watcher.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name LIKE %s", (f"%{named}",)
        ).fetchone()
        assert rows is not None
        assert rows[0] >= 1
        assert control._runtime is not None
        assert control._runtime.sweep() == 0  # it judges nobody dead: ends nothing
        assert control.store.end_sessions_of(["another-runtime"]) == 0
        again = watcher.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name LIKE %s", (f"%{named}",)
        ).fetchone()
        assert again is not None
        assert again[0] >= 1
