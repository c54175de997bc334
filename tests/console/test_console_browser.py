"""The console in Chromium (Playwright), as a person uses it.

- A harness process whose child waits on an approval, the console in another process, on
  one PostgreSQL store: the person finds the child under "Needs you", sends a message,
  allows the call, and the page shows the turn finishing without a reload; the store has
  the message (source human) and the answer once, and the tool ran once.
- Kill from the page, the Task running in the harness process.
- A transcript holding ``<script>``/``onerror`` payloads shows them as text and runs
  nothing, also when they arrive over the live stream.
- 1,000 children render.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from controlplane import (
    ContinuableStartSpec,
    EventKind,
    InProcessProvider,
    MessageSource,
    ScriptedModel,
    SubagentControl,
    TaskStatus,
    TextBlock,
)
from controlplane.fronts._console import ConsoleServer
from persistence import SqlStore
from tests.console.support import ConsoleProcess, Harness, populate
from tests.reliability.processes import Reaper
from tests.support import WAIT_S

pytestmark = [pytest.mark.timeout(180), pytest.mark.slow]

expect: Any = pytest.importorskip("playwright.sync_api").expect


def test_a_person_finds_answers_and_steers_a_waiting_child_without_a_reload(
    reaped: Reaper, pg_url: str, page: Any, tmp_path: Path
) -> None:
    runs = tmp_path / "runs.log"
    harness = reaped.add(Harness(pg_url, runs, "approval", stderr=tmp_path / "harness.err"))
    ids = harness.ready()
    console = reaped.add(ConsoleProcess(pg_url, stderr=tmp_path / "console.err"))
    url = console.ready()

    page.goto(url)
    needs = page.locator("section.group-needs")
    expect(needs.get_by_role("heading")).to_contain_text("Needs you")
    needs.get_by_role("link", name="approval job").click()
    page.wait_for_url(f"**/children/{ids['child_id']}")
    page.evaluate("window.__sameDocument = true")  # gone if the page reloads

    state = page.locator("#region-state")
    expect(state).to_contain_text("deploy")
    expect(state).to_contain_text('"env": "prod"')
    page.get_by_label("Message").fill("use the blue cluster")
    page.get_by_role("button", name="Send").click()
    expect(page.locator("#send-result")).to_contain_text("steered the running turn")
    timeline = page.locator("#region-timeline")
    expect(timeline.locator("li.ev-steering-message")).to_contain_text("use the blue cluster")

    page.get_by_label("Note").fill("go ahead")
    page.get_by_role("button", name="Allow").click()
    expect(timeline.locator("li.ev-turn-end")).to_have_count(1, timeout=WAIT_S * 1000)
    expect(timeline).to_contain_text("shipped")
    expect(state).to_contain_text("Idle")
    assert page.evaluate("window.__sameDocument") is True

    with SqlStore(pg_url, read_only=True) as store:
        events = store.load(ids["child_id"]).events
        task = store.ledger.get(ids["task_id"])
    steers = [e for e in events if e.kind == EventKind.STEERING_MESSAGE]
    answers = [e for e in events if e.kind == EventKind.APPROVAL_ANSWER]
    assert [(e.data["text"], e.source.kind if e.source else None) for e in steers] == [
        ("use the blue cluster", "human")
    ]
    assert [(e.data["allow"], e.data["note"]) for e in answers] == [(True, "go ahead")]
    assert answers[0].source is not None
    assert answers[0].source.kind == "human"
    assert runs.read_text(encoding="utf-8").splitlines() == ['{"env": "prod"}']
    assert task is not None
    assert task.status is TaskStatus.COMPLETED


def test_kill_from_the_page_ends_a_task_running_in_another_process(
    reaped: Reaper, pg_url: str, page: Any, tmp_path: Path
) -> None:
    harness = reaped.add(
        Harness(pg_url, tmp_path / "runs.log", "slow", stderr=tmp_path / "harness.err")
    )
    ids = harness.ready()
    console = reaped.add(ConsoleProcess(pg_url, stderr=tmp_path / "console.err"))
    url = console.ready()

    page.goto(url)
    working = page.locator("section.group-working")
    expect(working.get_by_role("heading")).to_contain_text("Working")
    working.get_by_role("link", name="slow job").click()
    page.on("dialog", lambda dialog: dialog.accept())
    page.get_by_role("button", name="Kill").click()
    expect(page.locator("#region-state")).to_contain_text("last Task killed", timeout=WAIT_S * 1000)

    with SqlStore(pg_url, read_only=True) as store:
        task = store.ledger.get(ids["task_id"])
    assert task is not None
    assert task.status is TaskStatus.KILLED
    page.goto(url)
    expect(page.locator("section.group-completed")).to_contain_text("slow job")


PAYLOADS = (
    "<script>window.__pwned = 'script'</script>",
    "<img src=x onerror=\"window.__pwned = 'img'\">",
    '"><svg onload="window.__pwned = \'svg\'">',
)


def test_markup_in_a_transcript_shows_as_text_and_runs_nothing(sqlite_url: str, page: Any) -> None:
    hostile = " ".join(PAYLOADS)
    control = SubagentControl.open(sqlite_url)
    try:
        control.providers.register(InProcessProvider(ScriptedModel([hostile, hostile])))
        parent = control.agents.register("parent <b>")
        started = control.start_continuable(
            ContinuableStartSpec(
                provider="inprocess",
                label=f"label {PAYLOADS[1]}",
                parent=parent,
                prompt=[TextBlock(text=hostile)],
            )
        )
        control.tasks.wait(started.task_id, timeout=WAIT_S, requester=parent)
        with ConsoleServer(control) as console:
            page.goto(console.url)
            expect(page.locator("section.group-completed")).to_contain_text(PAYLOADS[1])
            page.goto(f"{console.url}children/{started.child_id}")
            timeline = page.locator("#region-timeline")
            expect(timeline.locator("li.ev-assistant-message")).to_contain_text(PAYLOADS[0])
            expect(page.locator("#live")).to_have_text("live")
            # Over the stream too: a resumed turn's events arrive as a region update.
            sent = control.send_message(
                parent, started.child_id, [TextBlock(text=hostile)], MessageSource(kind="human")
            )
            control.tasks.wait(sent.task_id, timeout=WAIT_S, requester=parent)
            expect(timeline.locator("li.ev-turn-end")).to_have_count(2)
            for payload in PAYLOADS:
                expect(timeline).to_contain_text(payload)
            assert page.evaluate("window.__pwned") is None
            assert page.locator("main img, main script, main [onerror], main [onload]").count() == 0
            assert page.locator("script").count() == 1  # /static/console.js only
    finally:
        control.close(timeout_s=10.0)


def test_a_thousand_children_render(sqlite_url: str, page: Any) -> None:
    ids = populate(sqlite_url, children=1000, tasks=2000)
    control = SubagentControl.open(sqlite_url)
    try:
        with ConsoleServer(control) as console:
            page.goto(console.url)
            completed = page.locator("section.group-completed")
            expect(completed.locator("tr.child")).to_have_count(1000)
            expect(page.locator("#region-tree li")).to_have_count(1000 + 7)  # + its sessions
            page.get_by_label("Filter").fill("job 999")
            expect(completed.locator("tr.child:visible")).to_have_count(1)
            completed.get_by_role("link", name="job 999").click()
            page.wait_for_url(f"**/children/{ids[999]}")
            expect(page.locator("#region-head")).to_contain_text(ids[998])  # its parent
    finally:
        control.close(timeout_s=10.0)
