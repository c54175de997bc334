"""Short ids on the command line: every id argument takes a unique prefix (4+ characters),
resolved by one indexed read of the store; an ambiguous prefix is a usage error listing the
candidates, an unknown one is not found. The demo's 8-character ids work as they print.

Both backends: SQLite in ``tmp_path``, PostgreSQL when its URL is set.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from controlplane import (
    ChildMeta,
    ChildTool,
    ContinuableStartSpec,
    ErrorCode,
    InProcessProvider,
    ScriptedModel,
    SubagentControl,
    SubagentControlError,
    TaskStatus,
    TextBlock,
)
from controlplane.cli import main
from controlplane.cli._exit_status import EXIT_NOT_FOUND, EXIT_OK, EXIT_USAGE
from controlplane.models import ModelReply, ToolCall
from persistence import SqlStore
from tests.cli.cli_support import insert_requests
from tests.support import eventually, run_python

pytestmark = pytest.mark.timeout(60)

WAIT_S = 10.0
SHARED = "abcd1234"
"""The first characters of the children `store` writes under the shared prefix."""


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    status = main(list(argv))
    out, err = capsys.readouterr()
    return status, out, err


@pytest.fixture
def store(store_url: str) -> Iterator[SqlStore]:
    """A store with 12 children whose ids start with `SHARED`, two of them ``…-0000`` and
    ``…-00001`` (one id the prefix of another), and one unrelated child."""
    opened = SqlStore(store_url)
    try:
        ids = [f"{SHARED}-{n:04d}" for n in range(11)] + [f"{SHARED}-00001", "ffff0000-lonely"]
        for child_id in ids:
            opened.create_child(ChildMeta(child_id=child_id, parent_session="parent-1", depth=1))
        yield opened
    finally:
        opened.close()


def test_the_store_finds_ids_by_prefix_in_key_order_up_to_the_limit(store: SqlStore) -> None:
    assert store.ids_with_prefix("child", f"{SHARED}-000", limit=5) == [
        f"{SHARED}-0000", f"{SHARED}-00001", f"{SHARED}-0001", f"{SHARED}-0002",
        f"{SHARED}-0003",
    ]  # fmt: skip
    assert store.ids_with_prefix("child", "ffff", limit=5) == ["ffff0000-lonely"]
    assert store.ids_with_prefix("child", "ABCD", limit=5) == []  # exact case
    assert store.ids_with_prefix("child", "abcd%", limit=5) == []  # LIKE wildcards are text
    assert store.ids_with_prefix("child", "abcd_234", limit=5) == []
    assert store.ids_with_prefix("task", SHARED, limit=5) == []
    assert store.ids_with_prefix("request", SHARED, limit=5) == []


@pytest.mark.parametrize(
    ("kind", "prefix", "limit"),
    [("session", "abcd", 1), ("child", "", 1), ("child", "abcd", 0), ("child", "abcd", 1001)],
)
def test_a_bad_prefix_question_is_refused_with_a_code(
    store: SqlStore, kind: str, prefix: str, limit: int
) -> None:
    with pytest.raises(SubagentControlError) as refused:
        store.ids_with_prefix(kind, prefix, limit=limit)
    assert refused.value.code is ErrorCode.INVALID_INPUT


def test_the_prefix_read_walks_the_primary_key_index(store: SqlStore, store_url: str) -> None:
    from persistence._id_prefix import prefix_query

    engine = sa.create_engine(store_url)
    try:
        statement = prefix_query("child", SHARED, 11).compile(
            engine, compile_kwargs={"literal_binds": True}
        )
        explain = "EXPLAIN QUERY PLAN " if engine.dialect.name == "sqlite" else "EXPLAIN "
        with engine.connect() as conn:
            if engine.dialect.name == "postgresql":
                # A table this small may be scanned whole anyway: ask whether the index
                # can serve the query at all (a bare LIKE under C.UTF-8 could not).
                conn.exec_driver_sql("SET enable_seqscan = off")
            plan = " ".join(str(row) for row in conn.exec_driver_sql(f"{explain}{statement}"))
    finally:
        engine.dispose()
    if engine.dialect.name == "sqlite":
        assert "SEARCH subagent_children USING COVERING INDEX" in plan, plan
    else:
        assert "Index Cond" in plan, plan
        assert "subagent_children_pkey" in plan, plan


def test_transcript_takes_a_unique_prefix(
    store: SqlStore, store_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    status, out, err = run(capsys, "transcript", "ffff", "--db", store_url)
    assert (status, err) == (EXIT_OK, "")
    assert out.startswith("child ffff0000-lonely ")


def test_a_whole_id_is_itself_even_when_it_starts_other_ids(
    store: SqlStore, store_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    status, out, _ = run(capsys, "transcript", f"{SHARED}-0000", "--db", store_url)
    assert status == EXIT_OK
    assert out.startswith(f"child {SHARED}-0000 ")


def test_an_ambiguous_prefix_is_a_usage_error_listing_the_first_ten(
    store: SqlStore, store_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    status, out, err = run(capsys, "transcript", SHARED, "--db", store_url)
    assert (status, out) == (EXIT_USAGE, "")
    listed = re.findall(rf"{SHARED}-\d+", err)
    assert listed == store.ids_with_prefix("child", SHARED, limit=10)
    assert "and more" in err
    assert "give more characters" in err

    status, _, err = run(capsys, "transcript", f"{SHARED}-0001", "--db", store_url)
    assert status == EXIT_OK  # a whole id, though …-00001 starts with it too


@pytest.mark.parametrize("text", ["eeee", "abc", "ffff0000-lonely-not"])
def test_a_prefix_that_fits_no_id_or_is_too_short_is_not_found(
    store: SqlStore, store_url: str, capsys: pytest.CaptureFixture[str], text: str
) -> None:
    status, out, err = run(capsys, "transcript", text, "--db", store_url)
    assert (status, out) == (EXIT_NOT_FOUND, "")
    assert f"no child {text!r}" in err
    if text == "abc":  # ids start with it, but three characters name none of them
        assert "at least 4 characters" in err


def test_answer_refuses_an_ambiguous_request_prefix_and_answers_nothing(
    store: SqlStore, store_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    insert_requests(store_url, ["beef0001", "beef0002"])

    status, _, err = run(capsys, "answer", "beef", "--db", store_url, "--allow")

    assert status == EXIT_USAGE
    assert "it starts 2 requests (beef0001, beef0002)" in err
    assert "request prefix 'beef' is ambiguous" in err
    status, _, err = run(capsys, "answer", "cafe", "--db", store_url, "--allow")
    assert status == EXIT_NOT_FOUND
    assert "no request 'cafe'" in err


def test_a_person_answers_a_waiting_request_by_its_8_character_prefix(
    store_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    runs: list[dict[str, Any]] = []
    deploy = ChildTool(
        "deploy",
        "Deploy.",
        {"type": "object", "properties": {"env": {"type": "string"}}},
        lambda arguments: runs.append(arguments) or "deployed",
        approval="always",
    )
    asks = ModelReply(
        text="shipping", tool_calls=[ToolCall(id="c1", name="deploy", arguments={"env": "prod"})]
    )
    with SubagentControl.open(store_url) as control:
        control.providers.register(InProcessProvider(ScriptedModel([asks, "done"]), tools=[deploy]))
        parent = control.agents.register("p1")
        started = control.start_continuable(
            ContinuableStartSpec(
                provider="inprocess", label="ship", prompt=[TextBlock(text="go")], parent=parent
            )
        )
        waiting = control.tasks.wait(started.task_id, timeout=WAIT_S, requester=parent)
        assert waiting.request is not None

        status, out, err = run(
            capsys, "answer", waiting.request.id[:8], "--db", store_url, "--allow"
        )

        assert (status, err) == (EXIT_OK, "")
        assert f"request {waiting.request.id} (deploy) allowed" in out
        # A wait returns on input_required: poll until the answer has let it settle.
        eventually(
            lambda: control.tasks.get(started.task_id, requester=parent).status.is_terminal,
            "the answered Task settles",
        )
        done = control.tasks.get(started.task_id, requester=parent)
        assert done.status is TaskStatus.COMPLETED, done
    assert runs == [{"env": "prod"}]


def test_the_demos_8_character_child_ids_work_as_cli_arguments(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = f"sqlite:///{tmp_path}/state.db"
    demo = run_python("examples/quickstart.py", "--db", url, timeout=60)
    assert demo.returncode == 0, demo.stderr
    shown = dict(re.findall(r"^ +(research|summary) +child ([0-9a-f]{8}) ", demo.stdout, re.M))
    assert set(shown) == {"research", "summary"}, demo.stdout

    for label, prefix in shown.items():
        status, out, err = run(capsys, "transcript", prefix, "--db", url)
        assert (status, err) == (EXIT_OK, ""), label
        header = out.splitlines()[0]
        full = header.split()[1]
        assert full.startswith(prefix)
        uuid.UUID(full)  # the whole id, resolved


def test_tasks_shows_a_waiting_task_s_request_and_answer_takes_the_task_s_id(
    store_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    deploy = ChildTool(
        "deploy", "Deploy.", {"type": "object"}, lambda _arguments: "deployed", approval="always"
    )
    asks = ModelReply(tool_calls=[ToolCall(id="c1", name="deploy", arguments={})])
    with SubagentControl.open(store_url) as control:
        control.providers.register(InProcessProvider(ScriptedModel([asks, "done"]), tools=[deploy]))
        parent = control.agents.register("p1")
        started = control.start_continuable(
            ContinuableStartSpec(
                provider="inprocess", label="ship", prompt=[TextBlock(text="go")], parent=parent
            )
        )
        waiting = control.tasks.wait(started.task_id, timeout=WAIT_S, requester=parent)
        assert waiting.request is not None

        status, out, _ = run(capsys, "tasks", "--db", store_url)
        assert status == EXIT_OK
        (row,) = [line for line in out.splitlines() if line.startswith(started.task_id)]
        assert f"input_required deploy request={waiting.request.id}" in row

        status, out, err = run(capsys, "answer", started.task_id[:8], "--db", store_url, "--deny")
        assert (status, err) == (EXIT_OK, "")
        assert f"request {waiting.request.id} (deploy) denied" in out
        eventually(
            lambda: control.tasks.get(started.task_id, requester=parent).status.is_terminal,
            "the answered Task settles",
        )


def test_answer_with_a_task_that_waits_on_no_request_says_so(
    store_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with SubagentControl.open(store_url) as control:
        control.providers.register(InProcessProvider(ScriptedModel(["done"])))
        parent = control.agents.register("p1")
        started = control.start_continuable(
            ContinuableStartSpec(
                provider="inprocess", label="plain", prompt=[TextBlock(text="go")], parent=parent
            )
        )
        control.tasks.wait(started.task_id, timeout=WAIT_S, requester=parent)

    status, _, err = run(capsys, "answer", started.task_id, "--db", store_url, "--allow")
    assert status == EXIT_NOT_FOUND
    assert f"task {started.task_id} waits on no approval request" in err
