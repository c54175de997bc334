"""The console over plain HTTP, in this process: what a POST must carry to change anything
(its own origin and the session's CSRF token), the token a non-loopback console asks,
the security headers, and ``/api/`` answering what the pages show.

A child of this process waits on an approval (SQLite in ``tmp_path``, and PostgreSQL when
its URL is set); every refused POST is checked against the store: nothing was answered,
nothing ran."""

from __future__ import annotations

import contextlib
import re
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from controlplane import (
    Budget,
    CancelSignal,
    ChildTool,
    ContinuableStartSpec,
    ErrorCode,
    InProcessProvider,
    ScriptedModel,
    SubagentControl,
    TaskStatus,
    TextBlock,
    Usage,
)
from controlplane.contract import ChildMeta, EventKind, NewEvent
from controlplane.fronts._console import ConsoleServer
from controlplane.fronts._console_guard import CSP
from controlplane.models import ModelReply, ModelRequest, ToolCall
from tests.support import WAIT_S, wait_published

pytestmark = pytest.mark.timeout(60)


class Waiting:
    """A control plane whose child waits on an approval for ``deploy``, and its console."""

    def __init__(self, url: str, *, token: str | None = None, usage: Usage | None = None) -> None:
        self.runs: list[dict[str, Any]] = []
        call = ToolCall(id="c1", name="deploy", arguments={"env": "prod"})
        first = ModelReply(text="shipping", tool_calls=[call], usage=usage)
        model = ScriptedModel([first, "shipped"])
        tool = ChildTool("deploy", "Deploy.", {"type": "object"}, self._run, approval="always")
        self.control = SubagentControl.open(url, approval_grace_s=60.0)
        self.control.providers.register(InProcessProvider(model, tools=[tool]))
        self.parent = self.control.agents.register("boss")
        started = self.control.start_continuable(
            ContinuableStartSpec(
                provider="inprocess",
                label="ship it",
                parent=self.parent,
                prompt=[TextBlock(text="ship")],
            )
        )
        self.child_id, self.task_id = started.child_id, started.task_id
        snap = self.control.tasks.wait(self.task_id, timeout=WAIT_S, requester=self.parent)
        assert snap.status is TaskStatus.INPUT_REQUIRED
        assert snap.request is not None
        self.request_id = snap.request.id
        self.console = ConsoleServer(self.control, token=token).start()

    def _run(self, arguments: dict[str, Any]) -> str:
        self.runs.append(arguments)
        return "deployed"

    def pending(self) -> bool:
        store = self.control.store
        assert store is not None
        _state, answer, _ = store.approvals.state(self.request_id)
        return answer is None

    def close(self) -> None:
        self.console.stop()
        self.control.close(timeout_s=10.0)


@pytest.fixture
def waiting(store_url: str) -> Iterator[Waiting]:
    opened = Waiting(store_url)
    yield opened
    opened.close()


def _session(url: str) -> tuple[httpx.Client, str]:
    """A client that opened the overview: its session cookie, and the page's CSRF token."""
    client = httpx.Client(base_url=url, timeout=WAIT_S)
    page = client.get("/")
    assert page.status_code == 200
    found = re.search(r'<meta name="csrf-token" content="([0-9a-f]+)">', page.text)
    assert found is not None
    return client, found.group(1)


def _answer(client: httpx.Client, waiting: Waiting, headers: dict[str, str]) -> httpx.Response:
    return client.post(
        f"/api/requests/{waiting.request_id}/answer", json={"allow": True}, headers=headers
    )


def test_a_post_without_the_csrf_token_or_from_another_origin_changes_nothing(
    waiting: Waiting,
) -> None:
    url = waiting.console.url
    origin = url.rstrip("/")
    client, csrf = _session(url)
    other, other_csrf = _session(url)
    with contextlib.closing(client), contextlib.closing(other):
        refused = {
            "no token": _answer(client, waiting, {"origin": origin}),
            "wrong token": _answer(client, waiting, {"origin": origin, "x-csrf-token": "0" * 40}),
            "another session's token": _answer(
                client, waiting, {"origin": origin, "x-csrf-token": other_csrf}
            ),
            "no origin": _answer(client, waiting, {"x-csrf-token": csrf}),
            "another origin": _answer(
                client, waiting, {"origin": "http://127.0.0.1:1", "x-csrf-token": csrf}
            ),
            "a foreign host": _answer(
                client, waiting, {"origin": "http://evil.example", "x-csrf-token": csrf}
            ),
        }
        assert {why: r.status_code for why, r in refused.items()} == dict.fromkeys(refused, 403)
        assert waiting.pending()
        assert waiting.runs == []
        kill = client.post(f"/api/tasks/{waiting.task_id}/kill", headers={"origin": origin})
        assert kill.status_code == 403
        store = waiting.control.store
        assert store is not None
        assert store.ledger.get(waiting.task_id).status is TaskStatus.INPUT_REQUIRED

        allowed = _answer(client, waiting, {"origin": origin, "x-csrf-token": csrf})
        assert allowed.status_code == 200, allowed.text
        done = waiting.control.tasks.wait(waiting.task_id, timeout=WAIT_S, requester=waiting.parent)
        again = _answer(client, waiting, {"origin": origin, "x-csrf-token": csrf})
    assert done.status is TaskStatus.COMPLETED
    assert waiting.runs == [{"env": "prod"}]
    assert again.status_code == 409
    assert again.json()["error"] == "REQUEST_CLOSED"


def test_every_answer_carries_the_policy_and_the_api_says_what_the_page_shows(
    waiting: Waiting,
) -> None:
    with httpx.Client(base_url=waiting.console.url, timeout=WAIT_S) as client:
        page = client.get("/")
        overview = client.get("/api/overview").json()
        child = client.get(f"/api/children/{waiting.child_id}").json()
        runtimes = client.get("/api/runtimes").json()
        missing = client.get("/api/children/nobody")
        script = client.get("/static/console.js")
    assert page.headers["content-security-policy"] == CSP
    assert "'unsafe-inline'" not in CSP
    assert "script-src 'self'" in CSP
    assert "<script>" not in page.text  # only <script src=…>
    assert page.headers["x-frame-options"] == "DENY"
    for words in ("Needs you", "Working", "Completed"):
        assert words in page.text
    [needing] = overview["groups"]["needs"]
    assert (needing["child_id"], needing["status"]) == (waiting.child_id, "input_required deploy")
    assert (needing["provider"], needing["model"]) == ("inprocess", None)
    assert "<td>inprocess:-</td>" in page.text
    assert child["provider"] == "inprocess"
    assert child["request"]["id"] == waiting.request_id
    assert child["request"]["arguments"] == {"env": "prod"}
    assert [e["kind"] for e in child["events"]][:2] == ["turn/start", "user/message"]
    assert waiting.control.runtime_id in [r["runtime_id"] for r in runtimes["runtimes"]]
    assert missing.status_code == 404
    assert script.headers["content-type"].startswith("text/javascript")


def test_a_message_from_the_console_steers_the_waiting_turn_as_a_person(
    waiting: Waiting,
) -> None:
    url = waiting.console.url
    client, csrf = _session(url)
    headers = {"origin": url.rstrip("/"), "x-csrf-token": csrf}
    with contextlib.closing(client):
        sent = client.post(
            f"/api/children/{waiting.child_id}/messages",
            json={"message": "use the blue cluster"},
            headers=headers,
        )
        budget = client.post(
            f"/api/children/{waiting.child_id}/budget",
            json={"budget-tokens": "5000"},
            headers=headers,
        )
        empty = client.post(
            f"/api/children/{waiting.child_id}/messages", json={"message": " "}, headers=headers
        )
    assert sent.status_code == 200, sent.text
    assert sent.json()["route"] == "steered"
    assert sent.json()["task_id"] == waiting.task_id
    assert budget.status_code == 200, budget.text
    assert empty.status_code == 400
    store = waiting.control.store
    assert store is not None
    steers = [e for e in store.load(waiting.child_id).events if e.kind == "steering/message"]
    assert [(e.data["text"], e.source.kind if e.source else None) for e in steers] == [
        ("use the blue cluster", "human")
    ]
    assert store.spend.read([f"child:{waiting.child_id}"])[f"child:{waiting.child_id}"].budget == {
        "tokens": 5000
    }


def test_with_a_token_every_request_shows_it_and_a_browser_keeps_it_in_a_cookie(
    sqlite_url: str,
) -> None:
    opened = Waiting(sqlite_url, token="s3cret-token")
    try:
        url = opened.console.url
        with httpx.Client(base_url=url, timeout=WAIT_S) as client:
            assert client.get("/").status_code == 401
            assert client.get("/api/overview").status_code == 401
            assert client.get("/?token=wrong").status_code == 401
            entered = client.get("/?token=s3cret-token")
            assert entered.status_code == 303
            assert entered.headers["location"] == "/"
            assert client.get("/").status_code == 200  # the cookie now
        with httpx.Client(base_url=url, timeout=WAIT_S) as script:
            bearer = {"authorization": "Bearer s3cret-token"}
            assert script.get("/api/overview", headers=bearer).status_code == 200
    finally:
        opened.close()


def test_a_child_stopped_by_its_budget_needs_you_until_the_console_raises_it(
    sqlite_url: str,
) -> None:
    look = ModelReply(tool_calls=[ToolCall(id="c1", name="look", arguments={})])
    model = ScriptedModel(
        [look, look, "done", "again"], usage=Usage(input_tokens=50, output_tokens=10)
    )
    control = SubagentControl.open(sqlite_url)
    try:
        tool = ChildTool("look", "Look.", {"type": "object"}, lambda _arguments: "seen")
        control.providers.register(InProcessProvider(model, tools=[tool]))
        parent = control.agents.register("boss")
        started = control.start_continuable(
            ContinuableStartSpec(
                provider="inprocess",
                label="look around",
                parent=parent,
                prompt=[TextBlock(text="look")],
                budget=Budget(tokens=100),
            )
        )
        stopped = control.tasks.wait(started.task_id, timeout=WAIT_S, requester=parent)
        assert stopped.outcome is not None
        assert stopped.outcome.code is ErrorCode.BUDGET_EXHAUSTED
        with ConsoleServer(control) as console:
            client, csrf = _session(console.url)
            headers = {"origin": console.url.rstrip("/"), "x-csrf-token": csrf}
            with contextlib.closing(client):
                before = client.get("/api/overview").json()["groups"]
                refused = client.post(
                    f"/api/children/{started.child_id}/messages",
                    json={"message": "more"},
                    headers=headers,
                )
                raised = client.post(
                    f"/api/children/{started.child_id}/budget",
                    json={"budget-tokens": "1000"},
                    headers=headers,
                )
                sent = client.post(
                    f"/api/children/{started.child_id}/messages",
                    json={"message": "more"},
                    headers=headers,
                )
            resumed = control.tasks.wait(sent.json()["task_id"], timeout=WAIT_S, requester=parent)
    finally:
        control.close(timeout_s=10.0)

    [needing] = before["needs"]
    assert (needing["child_id"], needing["status"]) == (started.child_id, "stopped by budget")
    assert refused.status_code == 409
    assert refused.json()["error"] == "BUDGET_EXHAUSTED"
    assert raised.status_code == 200
    assert sent.json()["route"] == "started"
    assert resumed.status is TaskStatus.COMPLETED


def test_pages_open_on_one_view_share_one_read_of_the_store_per_change(sqlite_url: str) -> None:
    control = SubagentControl.open(sqlite_url, lease_ttl_s=600.0)  # no heartbeat meanwhile
    try:
        control.providers.register(InProcessProvider(ScriptedModel(["done", "again"])))
        parent = control.agents.register("boss")
        started = control.start_continuable(
            ContinuableStartSpec(
                provider="inprocess", label="one", parent=parent, prompt=[TextBlock(text="go")]
            )
        )
        control.tasks.wait(started.task_id, timeout=WAIT_S, requester=parent)
        streams: list[_Stream] = []
        try:
            with ConsoleServer(control) as console:
                page = f"{console.url}events/children/{started.child_id}"
                streams = [_Stream(page) for _ in range(5)]
                for stream in streams:
                    stream.wait_for("event: live")
                before, seen = console.feed.view_reads, console.feed.changes
                sent = control.send_message(parent, started.child_id, [TextBlock(text="more")])
                control.tasks.wait(sent.task_id, timeout=WAIT_S, requester=parent)
                for stream in streams:
                    stream.wait_for("again")  # the new turn's reply, in the timeline region
                reads = console.feed.view_reads - before
                changes = console.feed.changes - seen
        finally:  # the console has stopped: it ended every stream
            for stream in streams:
                stream.close()
    finally:
        control.close(timeout_s=10.0)

    # At most one read per change the watcher saw, for five pages (not five).
    assert 1 <= reads <= changes, (reads, changes)


class _Stream:
    """An event stream read on a thread of its own; `wait_for` a text in what came."""

    def __init__(self, url: str) -> None:
        self._client = httpx.Client(timeout=WAIT_S)
        self._seen = ""
        self._cond = threading.Condition()
        self._response = self._client.send(self._client.build_request("GET", url), stream=True)
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        with contextlib.suppress(httpx.HTTPError):
            for chunk in self._response.iter_text():
                with self._cond:
                    self._seen += chunk
                    self._cond.notify_all()

    def wait_for(self, text: str) -> None:
        with self._cond:
            assert self._cond.wait_for(lambda: text in self._seen, WAIT_S), self._seen[-500:]
            self._seen = self._seen[self._seen.index(text) + len(text) :]

    def close(self) -> None:
        """Once the server ended the stream: the reader has seen its end."""
        self._thread.join(WAIT_S)
        assert not self._thread.is_alive(), "the stream did not end"
        self._response.close()
        self._client.close()


def test_a_tasks_tokens_on_its_childs_page_are_its_turns_while_it_waits_and_once_settled(
    store_url: str,
) -> None:
    spent = Usage(input_tokens=1800, output_tokens=450, model_calls=1)
    waiting = Waiting(store_url, usage=spent)
    try:
        url = waiting.console.url
        with httpx.Client(base_url=url, timeout=WAIT_S) as client:
            asked = client.get(f"/api/children/{waiting.child_id}").json()
            page = client.get(f"/children/{waiting.child_id}").text
            client.get("/")  # a session, for the answer's CSRF token
            csrf = re.search(r'name="csrf-token" content="([0-9a-f]+)"', page)
            assert csrf is not None
            headers = {"origin": url.rstrip("/"), "x-csrf-token": csrf.group(1)}
            allowed = _answer(client, waiting, headers)
            assert allowed.status_code == 200, allowed.text
            waiting.control.tasks.wait(waiting.task_id, timeout=WAIT_S, requester=waiting.parent)
            settled = client.get(f"/api/children/{waiting.child_id}").json()

        for shown in (asked, settled):
            [task] = shown["tasks"]
            total = shown["usage"]["total"]
            assert (total["input_tokens"], total["output_tokens"]) == (1800, 450)
            assert (task["usage"]["input_tokens"], task["usage"]["output_tokens"]) == (1800, 450)
        assert asked["tasks"][0]["status"] == "input_required"
        assert settled["tasks"][0]["status"] == "completed"
        row = re.search(r'<tr class="task">(.*?)</tr>', page)
        assert row is not None
        assert "<td>2,250</td>" in row.group(1), row.group(1)
        assert "2,250 tokens (1,800 in, 450 out)" in page
    finally:
        waiting.close()


class _HeldModel:
    """A model whose call waits (bounded) until ``go`` or its run is cancelled."""

    def __init__(self) -> None:
        self.called = threading.Event()
        self.go = threading.Event()

    def complete(self, request: ModelRequest, signal: CancelSignal) -> ModelReply:
        del request
        self.called.set()
        deadline = time.monotonic() + WAIT_S
        while not self.go.is_set() and not signal.wait(0.02):
            assert time.monotonic() < deadline, "the model was never let go"
        signal.raise_if_aborted()
        return ModelReply(text="carried on")


def test_a_recovered_task_and_one_waiting_for_its_provider_say_so_on_every_page(
    store_url: str,
) -> None:
    """SPEC §9 "Recovery" on the console: a runtime closes mid-turn (it hands the turn
    over); a console without providers shows the Task waiting for a runtime with its
    provider; a runtime with it carries the turn on, and the pages say ``recovered ×1``
    with the ``task/recovered`` event in the timeline."""
    first = _HeldModel()
    worker = SubagentControl.open(store_url)
    worker.providers.register(InProcessProvider(first))
    parent = worker.agents.register("boss")
    started = worker.start_continuable(
        ContinuableStartSpec(
            provider="inprocess", label="long job", parent=parent, prompt=[TextBlock(text="go")]
        )
    )
    assert first.called.wait(WAIT_S)
    wait_published(worker, started.child_id)  # a start not yet published is killed on close
    worker.close(timeout_s=WAIT_S)  # hands the running turn over
    bare = SubagentControl.open(store_url)  # a console's control plane: no providers
    second = _HeldModel()
    rescuer: SubagentControl | None = None
    try:
        with (
            ConsoleServer(bare) as console,
            httpx.Client(base_url=console.url, timeout=WAIT_S) as client,
        ):
            waiting_api = client.get("/api/overview").json()["groups"]["working"]
            waiting_page = client.get("/").text
            waiting_child = client.get(f"/api/children/{started.child_id}").json()

            rescuer = SubagentControl.open(store_url)
            rescuer.providers.register(InProcessProvider(second))
            assert second.called.wait(WAIT_S), "no runtime carried the turn on"
            console.feed.poke()  # as its watcher does on the store's change: pages read anew
            recovered_api = client.get("/api/overview").json()["groups"]["working"]
            recovered_page = client.get("/").text
            child_api = client.get(f"/api/children/{started.child_id}").json()
            child_page = client.get(f"/children/{started.child_id}").text
        second.go.set()
        done = rescuer.tasks.wait(started.task_id, timeout=WAIT_S, requester="boss")
    finally:
        second.go.set()
        if rescuer is not None:
            rescuer.close(timeout_s=10.0)
        bare.close(timeout_s=10.0)

    waits = "running · waits for a runtime with provider &#x27;inprocess&#x27;"
    [row] = waiting_api
    assert (row["child_id"], row["status"]) == (
        started.child_id,
        "running · waits for a runtime with provider 'inprocess'",
    )
    assert (row["waits_for_runtime"], row["waits_for_provider"], row["recoveries"]) == (
        True,
        "inprocess",
        0,
    )
    assert waits in waiting_page
    assert waiting_child["waits_for_provider"] == "inprocess"

    [row] = recovered_api
    assert (row["status"], row["recoveries"], row["waits_for_runtime"]) == (
        "running · recovered ×1",
        1,
        False,
    )
    assert "running · recovered ×1</span>" in recovered_page
    assert "waits for a runtime" not in recovered_page
    assert child_api["tasks"][0]["recoveries"] == 1
    assert child_api["waits_for_provider"] is None
    [event] = [e for e in child_api["events"] if e["kind"] == EventKind.TASK_RECOVERED]
    assert event["data"]["runtime_id"] == rescuer.runtime_id
    assert "running · recovered ×1</span></h2>" in child_page  # the state region
    assert "<th>Recoveries</th>" in child_page
    task_row = re.search(r'<tr class="task">(.*?)</tr>', child_page)
    assert task_row is not None
    assert "<td>1</td>" in task_row.group(1), task_row.group(1)
    assert (
        f'<span class="kind">recovered</span><pre>recovered by runtime {rescuer.runtime_id} '
        f"from runtime {worker.runtime_id}"
    ) in child_page
    assert (done.status, done.recoveries) == (TaskStatus.COMPLETED, 1)


def test_a_task_recovered_event_shows_as_text(store_url: str) -> None:
    hostile = "<script>alert(1)</script>"
    control = SubagentControl.open(store_url)
    try:
        store = control.store
        assert store is not None
        meta = ChildMeta(child_id="c-hostile", parent_session="s", depth=1, label="x")
        data = {"task_id": "t1", "runtime_id": hostile, "from_runtime": '"><img onerror=x>',
                "recovery": 1}  # fmt: skip
        store.create_child(
            meta,
            [
                NewEvent(kind=EventKind.TURN_START, turn=1, data={"task_id": "t1"}),
                NewEvent(kind=EventKind.TASK_RECOVERED, turn=1, data=data),
            ],
        )
        with (
            ConsoleServer(control) as console,
            httpx.Client(base_url=console.url, timeout=WAIT_S) as client,
        ):
            page = client.get("/children/c-hostile").text
    finally:
        control.close(timeout_s=10.0)
    assert hostile not in page
    assert "<img" not in page
    assert (
        "recovered by runtime &lt;script&gt;alert(1)&lt;/script&gt; from runtime "
        "&quot;&gt;&lt;img onerror=x&gt; (recovery 1, task t1)"
    ) in page
