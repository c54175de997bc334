"""`ActorTree.render()`: the text operators read from `subagent-control tree`."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from controlplane import ActorTree
from controlplane.contract import (
    ActivationNode,
    SupervisorNode,
)
from controlplane.contract._tree import ForwardedNode
from tests.cli.cli_support import sample_tree

TAKEN = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)


def test_render_names_supervisors_by_child_id_and_activations_by_task_id() -> None:
    lines = sample_tree().render().splitlines()
    assert lines == [
        "root (2 supervisors) at 2026-01-02T03:04:05+00:00",
        "├─ supervisor child-idle [idle] parent=parent-1 held=0 mailbox=0 quiet=0.0s",
        "└─ supervisor child-busy [running] parent=parent-1 held=1 mailbox=2 quiet=0.0s",
        "   └─ activation task-7 (resumed, published, running, age 1.5s)",
    ]


def test_render_shows_cancel_reasons_quiet_time_and_a_task_without_its_activation() -> None:
    tree = ActorTree(
        taken_at=TAKEN,
        closed=True,
        supervisors=[
            SupervisorNode(
                child_id="c1",
                parent_session="p",
                state="running",
                last_activity=TAKEN - timedelta(seconds=12.5),
                activation=ActivationNode(
                    task_id="t1",
                    kind="initial",
                    published=False,
                    task_status="running",
                    cancel_reason="killed by owner",
                    age_s=2.0,
                ),
            ),
            SupervisorNode(
                child_id="c2",
                parent_session=None,
                state="busy",
                task_id="t2",
                task_status="running",
                last_activity=TAKEN,
            ),
        ],
    )
    assert tree.render().splitlines() == [
        "root (2 supervisors, closed) at 2026-01-02T03:04:05+00:00",
        "├─ supervisor c1 [running] parent=p held=0 mailbox=0 quiet=12.5s",
        "│  └─ activation t1 (initial, unpublished, running, age 2.0s) cancel='killed by owner'",
        "└─ supervisor c2 [busy] parent=? task=t2 (running) held=0 mailbox=0 quiet=0.0s",
    ]


def test_render_of_an_empty_tree_is_one_line() -> None:
    tree = ActorTree(taken_at=TAKEN, closed=False, supervisors=[])
    assert tree.render() == "root (0 supervisors) at 2026-01-02T03:04:05+00:00"


def test_render_escapes_control_characters_in_ids_and_reasons() -> None:
    tree = ActorTree(
        taken_at=TAKEN,
        closed=False,
        supervisors=[
            SupervisorNode(
                child_id="c\x1b[31m",
                parent_session="p\nforged line",
                state="idle",
                last_activity=TAKEN,
            )
        ],
    )
    lines = tree.render().splitlines()
    assert len(lines) == 2
    assert lines[1].startswith("└─ supervisor c\\x1b[31m [idle] parent=p\\nforged line ")


def test_render_lists_forwarded_messages_in_flight_after_the_supervisors() -> None:
    tree = ActorTree(
        taken_at=TAKEN,
        closed=False,
        runtime_id="host-1-abc",
        supervisors=[
            SupervisorNode(child_id="c1", parent_session="p", state="idle", last_activity=TAKEN)
        ],
        forwarded=[
            ForwardedNode(
                inbox_id="i1",
                direction="sending",
                child_id="c2",
                runtime_id="host-2-def",
                age_s=0.25,
            ),
            ForwardedNode(
                inbox_id="i2",
                direction="serving",
                child_id="c1\x1b",
                runtime_id="host-3-ghi",
                age_s=1.0,
            ),
        ],
    )
    assert tree.render().splitlines() == [
        "root runtime host-1-abc (1 supervisor, 2 forwarded) at 2026-01-02T03:04:05+00:00",
        "├─ supervisor c1 [idle] parent=p held=0 mailbox=0 quiet=0.0s",
        "├─ forwarded i1 [sending] child=c2 to runtime host-2-def age 0.2s",
        "└─ forwarded i2 [serving] child=c1\\x1b from runtime host-3-ghi age 1.0s",
    ]
    assert ActorTree.model_validate_json(tree.model_dump_json()) == tree
