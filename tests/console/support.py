"""Helpers of the console's tests: the console and a harness as real processes."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tests.reliability.processes import LinesProcess

HARNESS = Path(__file__).with_name("harness.py")


class ConsoleProcess(LinesProcess):
    """``python -m controlplane.cli console`` on a free loopback port (or ``bind``)."""

    def __init__(
        self,
        url: str,
        *args: str,
        name: str = "console",
        stderr: Path | None = None,
        bind: str = "127.0.0.1:0",
        env: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(
            Path("-m"),
            "controlplane.cli",
            "console",
            "--db",
            url,
            "--http",
            bind,
            *args,
            name=name,
            stderr=stderr,
            env=env,
        )

    def ready(self) -> str:
        """Wait (bounded) until it listens; its address."""
        return "http://" + self.expect("http://")


class Harness(LinesProcess):
    """`harness.py`: a runtime whose child the console shows (see there)."""

    def __init__(self, url: str, runs: Path, mode: str, *, stderr: Path | None = None) -> None:
        super().__init__(HARNESS, url, str(runs), mode, name=f"harness-{mode}", stderr=stderr)

    def ready(self) -> dict[str, Any]:
        """Wait (bounded) for its child; the ids it printed."""
        found: dict[str, Any] = json.loads(self.expect("READY ", timeout_s=30.0))
        return found


def populate(url: str, *, children: int, tasks: int, sessions: int = 7) -> list[str]:
    """Write ``children`` children (a tenth of them grandchildren) under ``sessions``
    parent sessions, each with a finished first turn, and ``tasks`` settled Tasks spread
    over them, straight into the store at ``url``; the child ids, oldest first."""
    import uuid
    from datetime import timedelta

    from controlplane.contract import (
        ChildMeta,
        NewEvent,
        TaskOutcome,
        TaskSnapshot,
        TaskStatus,
        utcnow,
    )
    from persistence import SqlStore

    ids: list[str] = []
    start = utcnow() - timedelta(hours=1)
    with SqlStore(url) as store:
        for index in range(children):
            child_id = str(uuid.uuid4())
            nested = index % 10 == 9 and ids
            parent = ids[index - 1] if nested else f"session-{index % sessions}"
            meta = ChildMeta(
                child_id=child_id,
                parent_session=parent,
                depth=2 if nested else 1,
                label=f"job {index}",
            )
            store.create_child(
                meta,
                [
                    NewEvent(kind="turn/start", turn=1, data={"task_id": f"t-{index}"}),
                    NewEvent(kind="user/message", turn=1, data={"text": f"do job {index}"}),
                    NewEvent(kind="assistant/message", turn=1, data={"text": "done"}),
                    NewEvent(kind="turn/end", turn=1, data={"status": "completed"}),
                ],
            )
            ids.append(child_id)
        for index in range(tasks):
            child_id = ids[index % len(ids)]
            task = TaskSnapshot(
                id=str(uuid.uuid4()),
                label=f"turn {index}",
                owner_session="owner",
                status=TaskStatus.RUNNING,
                child_id=child_id,
                runtime_id="gone",
                created_at=start + timedelta(milliseconds=index),
            )
            store.ledger.admit(task)
            outcome = TaskOutcome(status=TaskStatus.COMPLETED, output=f"output {index}")
            store.ledger.settle((task.id, outcome, task.created_at))
    return ids
