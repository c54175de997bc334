"""`subagent-control children` and `transcript`: offline views of a real store."""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest
import sqlalchemy as sa

from controlplane import ChildMeta, MessageSource, NewEvent, SessionEvent
from controlplane.cli import main
from controlplane.cli._exit_status import EXIT_NOT_FOUND, EXIT_OK, EXIT_UNREACHABLE, EXIT_USAGE
from persistence import SqlStore
from tests.persistence.conftest import as_version_1, raw_engine
from tests.support import run_python

# Port 9 (discard) on loopback: nothing listens, every connection is refused at once.
UNREACHABLE_PG = "postgresql+psycopg://postgres@127.0.0.1:9/test"


@dataclass(frozen=True)
class Populated:
    url: str
    talker: str  # parent-1, two turns of conversation
    quiet: str  # parent-1, header and descriptor only
    other: str  # parent-2


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    status = main(list(argv))
    out, err = capsys.readouterr()
    return status, out, err


@pytest.fixture
def populated(store_url: str) -> Populated:
    ids = [str(uuid.uuid4()) for _ in range(3)]
    store = SqlStore(store_url)
    try:
        for child_id, parent in zip(ids, ["parent-1", "parent-1", "parent-2"], strict=True):
            store.create_child(
                ChildMeta(child_id=child_id, parent_session=parent, depth=1, label=f"job {parent}")
            )
            store.append(
                child_id,
                [
                    NewEvent(
                        kind="subagent/descriptor", turn=1, data={"version": 1, "provider": "p"}
                    )
                ],
            )
        user = MessageSource(kind="user")
        human = MessageSource(kind="human", sender_session_id="parent-1")
        store.append(
            ids[0],
            [
                NewEvent(kind="turn/start", turn=1, data={"task_id": "t1"}),
                NewEvent(kind="user/message", turn=1, data={"text": "hello\nworld"}, source=user),
                NewEvent(kind="steering/message", turn=1, data={"text": "faster"}, source=human),
                NewEvent(kind="assistant/message", turn=1, data={"text": "hi there"}),
                NewEvent(kind="turn/end", turn=1, data=None),
                NewEvent(kind="user/message", turn=2, data={"text": "again"}, source=user),
            ],
        )
    finally:
        store.close()
    return Populated(url=store_url, talker=ids[0], quiet=ids[1], other=ids[2])


def test_children_lists_every_child_with_parent_depth_and_label(
    populated: Populated, capsys: pytest.CaptureFixture[str]
) -> None:
    status, out, err = run(capsys, "children", "--db", populated.url)
    assert (status, err) == (EXIT_OK, "")
    lines = out.splitlines()
    assert lines[0].split() == [
        "CHILD", "PARENT", "DEPTH", "CREATED", "TOKENS", "CALLS", "COST", "LABEL"
    ]  # fmt: skip
    rows = {line.split()[0]: line.split() for line in lines[1:]}
    assert set(rows) == {populated.talker, populated.quiet, populated.other}
    assert rows[populated.other][1:3] == ["parent-2", "1"]
    assert rows[populated.other][-2:] == ["job", "parent-2"]


def test_offline_views_read_an_older_store_without_migrating_it(
    populated: Populated, capsys: pytest.CaptureFixture[str]
) -> None:
    # A version-1 store, perhaps still in use by a process of that version.
    as_version_1(populated.url)
    engine = raw_engine(populated.url)

    listed = run(capsys, "children", "--db", populated.url)
    shown = run(capsys, "transcript", populated.talker, "--db", populated.url)

    assert (listed[0], shown[0]) == (EXIT_OK, EXIT_OK)
    assert populated.talker in listed[1]
    assert "faster" in shown[1]
    with engine.connect() as conn:
        assert conn.execute(sa.text("SELECT version FROM subagent_schema")).scalar() == 1
    engine.dispose()


def test_children_filters_by_parent(
    populated: Populated, capsys: pytest.CaptureFixture[str]
) -> None:
    status, out, _ = run(capsys, "children", "--db", populated.url, "--parent", "parent-2")
    assert status == EXIT_OK
    assert [line.split()[0] for line in out.splitlines()[1:]] == [populated.other]
    status, out, _ = run(capsys, "children", "--db", populated.url, "--parent", "nobody")
    assert (status, out) == (EXIT_OK, "(no children of parent nobody)\n")


def test_children_json_prints_one_child_meta_per_line(
    populated: Populated, capsys: pytest.CaptureFixture[str]
) -> None:
    status, out, _ = run(capsys, "children", "--db", populated.url, "--json")
    assert status == EXIT_OK
    records = [json.loads(line) for line in out.splitlines()]
    assert all(record.pop("usage")["cost"] is None for record in records)  # spent nothing
    metas = [ChildMeta.model_validate(record) for record in records]
    assert {m.child_id: m.parent_session for m in metas} == {
        populated.talker: "parent-1",
        populated.quiet: "parent-1",
        populated.other: "parent-2",
    }


def test_transcript_prints_each_event_with_seq_turn_kind_source_and_text(
    populated: Populated, capsys: pytest.CaptureFixture[str]
) -> None:
    status, out, err = run(capsys, "transcript", populated.talker, "--db", populated.url)
    assert (status, err) == (EXIT_OK, "")
    lines = out.splitlines()
    assert lines[0].startswith(f"child {populated.talker}  parent=parent-1  depth=1")
    assert "events=7  turns=2" in lines[0]
    assert lines[1].split() == ["SEQ", "TURN", "KIND", "SOURCE", "TEXT"]
    body = [line.split(maxsplit=4) for line in lines[2:]]
    assert [row[0] for row in body] == [str(n) for n in range(1, 8)]
    assert body[2] == ["3", "1", "user/message", "user", "hello\\nworld"]
    assert body[3] == ["4", "1", "steering/message", "human", "faster"]
    assert body[4] == ["5", "1", "assistant/message", "-", "hi there"]
    assert body[6] == ["7", "2", "user/message", "user", "again"]
    assert body[0][2:] == ["subagent/descriptor", "-", '{"version":1,"provider":"p"}']


def test_transcript_json_prints_the_stored_events_one_per_line(
    populated: Populated, capsys: pytest.CaptureFixture[str]
) -> None:
    status, out, _ = run(capsys, "transcript", populated.talker, "--db", populated.url, "--json")
    assert status == EXIT_OK
    events = [SessionEvent.model_validate_json(line) for line in out.splitlines()]
    store = SqlStore(populated.url)
    try:
        assert events == store.load(populated.talker).events
    finally:
        store.close()


def test_transcript_of_an_unknown_child_exits_not_found_naming_it(
    populated: Populated, capsys: pytest.CaptureFixture[str]
) -> None:
    status, out, err = run(capsys, "transcript", "no-such-child", "--db", populated.url)
    assert (status, out) == (EXIT_NOT_FOUND, "")
    assert "no-such-child" in err
    assert "CHILD_NOT_FOUND" in err
    assert "Traceback" not in err


@pytest.mark.parametrize("url", ["not a url", "state.db", "://nothing"])
def test_a_malformed_db_url_exits_with_the_usage_code(
    capsys: pytest.CaptureFixture[str], url: str
) -> None:
    status, out, err = run(capsys, "children", "--db", url)
    assert (status, out) == (EXIT_USAGE, "")
    assert "is not a database URL" in err


def test_a_db_url_of_an_unknown_kind_exits_with_the_usage_code(
    capsys: pytest.CaptureFixture[str],
) -> None:
    status, _, err = run(capsys, "children", "--db", "nosuchdb://host/db")
    assert status == EXIT_USAGE
    assert err.startswith("subagent-control: ")
    assert "Traceback" not in err


def test_a_sqlite_url_naming_no_file_exits_not_found_and_creates_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / "typo.db"
    status, _, err = run(capsys, "children", "--db", f"sqlite:///{missing}")
    assert status == EXIT_NOT_FOUND
    assert f"no SQLite store at {missing}" in err
    assert not missing.exists()


@pytest.mark.slow  # measured: 20 s under load (--durations)
def test_an_unreachable_database_server_exits_unreachable(
    capsys: pytest.CaptureFixture[str],
) -> None:
    status, _, err = run(capsys, "children", "--db", UNREACHABLE_PG)
    assert status == EXIT_UNREACHABLE
    assert "Traceback" not in err


@pytest.mark.parametrize("verbose", [[], ["-v"]], ids=["quiet", "verbose"])
@pytest.mark.slow  # measured: 42 s under load (--durations)
def test_an_unreachable_database_is_one_line_on_stderr_unless_verbose(verbose: list[str]) -> None:
    done = run_python(
        "-m", "controlplane.cli", *verbose, "children", "--db", UNREACHABLE_PG, timeout=60
    )
    assert done.returncode == EXIT_UNREACHABLE
    lines = done.stderr.splitlines()
    assert lines[-1].startswith("subagent-control: [STORE_UNAVAILABLE]")
    assert "Traceback" not in done.stderr
    if verbose:
        assert any("retrying" in line for line in lines[:-1])
    else:
        assert len(lines) == 1, done.stderr


def test_offline_views_start_no_actor_and_load_neither_actors_nor_the_facade(
    populated: Populated,
) -> None:
    script = (
        "import sys\n"
        "from controlplane.cli import main\n"
        f"assert main(['children', '--db', {populated.url!r}]) == 0\n"
        f"assert main(['transcript', {populated.talker!r}, '--db', {populated.url!r}]) == 0\n"
        "loaded = sorted(m for m in sys.modules if m in ('actors', 'pykka', "
        "'controlplane.runtime._facade'))\n"
        "print('LOADED', loaded, file=sys.stderr)\n"
        "sys.exit(1 if loaded else 0)\n"
    )
    done = run_python("-c", script, timeout=60)
    assert done.returncode == 0, done.stderr


def test_readable_views_escape_control_characters_so_stored_text_cannot_drive_the_terminal(
    sqlite_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    hostile = "clear\x1b[2J\rfake\u202eevil\nSEQ 99"
    child_id = str(uuid.uuid4())
    with SqlStore(sqlite_url) as store:
        store.create_child(
            ChildMeta(child_id=child_id, parent_session="p\x07", depth=1, label=hostile)
        )
        store.append(child_id, [NewEvent(kind="assistant/message", turn=1, data={"text": hostile})])
    escaped = "clear\\x1b[2J\\rfake\\u202eevil\\nSEQ 99"

    assert main(["children", "--db", sqlite_url]) == EXIT_OK
    out = capsys.readouterr().out
    assert out.splitlines()[1].endswith(escaped)
    assert "p\\x07" in out
    assert main(["transcript", child_id, "--db", sqlite_url]) == EXIT_OK
    out = capsys.readouterr().out
    assert out.splitlines()[-1].endswith(escaped)
    assert len(out.splitlines()) == 3  # header, column names, one event
    assert not {"\x1b", "\u202e", "\r"} & set(out)
