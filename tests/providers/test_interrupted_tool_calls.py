"""Tool calls across crashes: a call its turn left without a result is answered when the child
resumes, durably, before the model's first call, and where the model reads it.

A plain tool's call is answered as interrupted (it may or may not have run) and never run
again; an idempotent tool's call is run again and its real result written. The result is
read right after its call, before the new turn's prompt, in the live conversation and in
one rebuilt from the transcript alike. The end-to-end tests kill a real runtime process
(SIGKILL) while its child's tool runs, on SQLite and PostgreSQL.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest

from controlplane import (
    CancelSignal,
    ChildTool,
    ContinuableStartSpec,
    ErrorCode,
    EventKind,
    ForkProvider,
    InProcessProvider,
    ScriptedModel,
    SessionEvent,
    SubagentControl,
    SubagentControlError,
    TaskSnapshot,
    TaskStatus,
    TextBlock,
)
from controlplane.contract import TOOL_CALL as GATE_TOOL_CALL
from controlplane.contract import SpendGate
from controlplane.models import ChatMessage, ModelReply, ModelRequest, ToolCall
from controlplane.providers._chat_history import (
    INTERRUPTED_TOOL_CALL,
    UnansweredCall,
    chat_history,
    chat_history_with_unanswered,
)
from controlplane.providers._openai_wire import chat_payload
from tests.reliability.processes import LinesProcess, Reaper, reaping
from tests.support import WAIT_S, raises

from . import interrupted_tool_child as child_script
from .fakes import (
    COORDINATOR,
    HUMAN,
    ONE_TOOL_CALL,
    USER,
    FakeTranscript,
    Parent,
    Runs,
    Written,
    descriptor,
    events,
    new_child_id,
    resume_request,
)

INTERRUPTED_TEXT = f"error: {INTERRUPTED_TOOL_CALL}"
ANSWER = "here is what I found"
reaped = pytest.fixture(reaping, name="reaped")


def call(id_: str, name: str = "fetch") -> tuple[str, dict[str, Any]]:
    return ("tool/call", {"id": id_, "name": name, "arguments": {"url": "u"}})


def result(id_: str, **outcome: Any) -> tuple[str, dict[str, Any]]:
    return ("tool/result", {"id": id_, **outcome})


WRITTEN = "cut off when its process died; check before calling it again"
"""A late result's error: not the placeholder's words, so a test sees which one stands."""


def late(id_: str) -> tuple[str, dict[str, Any]]:
    """A result the resumed loop wrote for a plain tool's open call."""
    return result(id_, error=WRITTEN, interrupted=True)


def shape(history: list[ChatMessage]) -> list[tuple[str, str, str | None, list[str]]]:
    return [(m.role, m.text, m.tool_call_id, [c.id for c in m.tool_calls]) for m in history]


def assert_strictly_paired(history: list[ChatMessage]) -> None:
    """What a strict Chat Completions server demands of the messages it is sent: every
    assistant message with tool calls is followed at once by one tool message per call,
    answering those ids, before any other message; and no tool message answers nothing."""
    messages = chat_payload(ModelRequest(messages=history), "m")["messages"]
    at = 0
    while at < len(messages):
        message = messages[at]
        assert message["role"] != "tool", f"a tool message answers no call: {messages}"
        at += 1
        ids = [c["id"] for c in message.get("tool_calls") or []]
        answers = [m.get("tool_call_id") for m in messages[at : at + len(ids)]]
        assert sorted(answers) == sorted(ids), f"calls {ids} answered by {answers}: {messages}"
        at += len(ids)


# -- chat_history: a late result stands where the placeholder stood ------------------------


def test_a_late_result_replaces_the_interrupted_placeholder_right_after_its_call() -> None:
    history = chat_history(
        events(
            (EventKind.USER_MESSAGE, {"text": "fetch it"}, USER),
            (EventKind.ASSISTANT_MESSAGE, {"text": "fetching"}),
            call("c1"),
            (EventKind.TURN_END, {"status": "interrupted"}),
            (EventKind.USER_MESSAGE, {"text": "what happened?"}, COORDINATOR),
            late("c1"),
            (EventKind.ASSISTANT_MESSAGE, {"text": "it was cut off"}),
        )
    )
    assert shape(history) == [
        ("user", "fetch it", None, []),
        ("assistant", "fetching", None, ["c1"]),
        ("tool", f"error: {WRITTEN}", "c1", []),
        ("user", "what happened?", None, []),
        ("assistant", "it was cut off", None, []),
    ]
    assert_strictly_paired(history)


def test_an_idempotent_reruns_output_is_read_right_after_the_call() -> None:
    history = chat_history(
        events(
            (EventKind.USER_MESSAGE, {"text": "fetch it"}, USER),
            (EventKind.ASSISTANT_MESSAGE, {"text": ""}),
            call("c1"),
            call("c2"),
            result("c1", output="first"),
            (EventKind.TURN_END, {"status": "interrupted"}),
            (EventKind.USER_MESSAGE, {"text": "go on"}, COORDINATOR),
            result("c2", output="fetched again", rerun=True, **ONE_TOOL_CALL),
        )
    )
    assert shape(history) == [
        ("user", "fetch it", None, []),
        ("assistant", "", None, ["c1", "c2"]),
        ("tool", "first", "c1", []),
        ("tool", "fetched again", "c2", []),
        ("user", "go on", None, []),
    ]
    assert_strictly_paired(history)


def test_a_result_for_a_call_already_answered_is_ignored() -> None:
    history = chat_history(
        events(
            (EventKind.ASSISTANT_MESSAGE, {"text": ""}),
            call("c1"),
            call("c2"),
            result("c2", output="done"),
            (EventKind.USER_MESSAGE, {"text": "again"}, COORDINATOR),
            late("c1"),
            result("c1", output="a second answer"),
            result("c2", output="a late duplicate"),
        )
    )
    assert [(m.role, m.text, m.tool_call_id) for m in history][1:3] == [
        ("tool", "done", "c2"),
        ("tool", f"error: {WRITTEN}", "c1"),
    ]
    assert len(history) == 4


def test_an_id_reused_in_a_later_turn_keeps_each_result_with_its_own_call() -> None:
    # Scripted (and some real) models repeat ids across turns: a late result answers the
    # open call it was written for, and the next call of that id gets its own result.
    history = chat_history(
        events(
            (EventKind.USER_MESSAGE, {"text": "one"}, USER),
            (EventKind.ASSISTANT_MESSAGE, {"text": ""}),
            call("c1"),
            (EventKind.USER_MESSAGE, {"text": "two"}, COORDINATOR),
            result("c1", output="rerun", rerun=True),
            (EventKind.ASSISTANT_MESSAGE, {"text": ""}),
            call("c1"),
            result("c1", output="fresh"),
            (EventKind.ASSISTANT_MESSAGE, {"text": "both"}),
        )
    )
    assert [(m.role, m.text) for m in history] == [
        ("user", "one"),
        ("assistant", ""),
        ("tool", "rerun"),
        ("user", "two"),
        ("assistant", ""),
        ("tool", "fresh"),
        ("assistant", "both"),
    ]
    assert_strictly_paired(history)


def test_the_unanswered_calls_are_listed_in_call_order_where_their_placeholders_stand() -> None:
    history, unanswered = chat_history_with_unanswered(
        events(
            (EventKind.USER_MESSAGE, {"text": "one"}, USER),
            (EventKind.ASSISTANT_MESSAGE, {"text": ""}),
            call("a"),
            call("b", "other"),
            result("a", output="ok"),
            (EventKind.USER_MESSAGE, {"text": "two"}, COORDINATOR),
            (EventKind.ASSISTANT_MESSAGE, {"text": ""}),
            call("c"),
            (EventKind.USER_MESSAGE, {"text": "three"}, COORDINATOR),
            late("c"),
        )
    )
    assert unanswered == [
        UnansweredCall(call=ToolCall(id="b", name="other", arguments={"url": "u"}), at=3),
    ]
    assert history[3] == ChatMessage(role="tool", text=INTERRUPTED_TEXT, tool_call_id="b")
    assert shape(history)[-3:] == [  # c's late result stands right after its call
        ("assistant", "", None, ["c"]),
        ("tool", f"error: {WRITTEN}", "c", []),
        ("user", "three", None, []),
    ]


@pytest.mark.parametrize(
    "stored",
    [
        # a late result, steering held across it, a second reply's calls
        [
            (EventKind.USER_MESSAGE, {"text": "go"}, USER),
            (EventKind.ASSISTANT_MESSAGE, {"text": "", "steering_seen": 0}),
            call("c1"),
            (EventKind.STEERING_MESSAGE, {"text": "hurry"}, HUMAN),
            (EventKind.TURN_END, {"status": "interrupted"}),
            (EventKind.USER_MESSAGE, {"text": "again"}, COORDINATOR),
            (EventKind.STEERING_MESSAGE, {"text": "and quickly"}, HUMAN),
            late("c1"),
            (EventKind.ASSISTANT_MESSAGE, {"text": "", "steering_seen": 1}),
            call("c2"),
            result("c2", output="2"),
            (EventKind.ASSISTANT_MESSAGE, {"text": "done", "steering_seen": 1}),
        ],
        # two turns cut off in a row, the second before it could answer the first
        [
            (EventKind.USER_MESSAGE, {"text": "go"}, USER),
            (EventKind.ASSISTANT_MESSAGE, {"text": ""}),
            call("c1"),
            call("c2"),
            (EventKind.USER_MESSAGE, {"text": "again"}, COORDINATOR),
            late("c1"),
            (EventKind.USER_MESSAGE, {"text": "and again"}, COORDINATOR),
            result("c2", output="2", rerun=True),
            (EventKind.ASSISTANT_MESSAGE, {"text": "there"}),
        ],
    ],
)
def test_every_call_is_answered_before_any_other_message_as_a_strict_server_demands(
    stored: list[tuple[Any, ...]],
) -> None:
    history = chat_history(events(*stored))
    assert_strictly_paired(history)
    answers = {m.tool_call_id: m.text for m in history if m.role == "tool"}
    assert answers == {"c1": f"error: {WRITTEN}", "c2": "2"}


# -- ChildTool(idempotent=) ---------------------------------------------------------------------


def test_idempotent_is_keyword_only_false_by_default_and_must_be_a_bool() -> None:
    assert ChildTool("t", "x", {}, lambda args: "").idempotent is False
    assert ChildTool("t", "x", {}, lambda args: "", idempotent=True).idempotent is True
    with pytest.raises(TypeError):
        ChildTool("t", "x", {}, lambda args: "", True)  # type: ignore[call-arg]
    for bad in (1, "yes", None):
        with raises(ErrorCode.INVALID_INPUT, match="idempotent"):
            ChildTool("t", "x", {}, lambda args: "", idempotent=bad)  # type: ignore[arg-type]


# -- the resumed loop answers open calls before its first model call ---------------------------


EARLIER = events(
    (EventKind.TURN_START, {"turn": 1}),
    (EventKind.USER_MESSAGE, {"text": "fetch it"}, USER),
    (EventKind.ASSISTANT_MESSAGE, {"text": "", "steering_seen": 0}),
    call("c1"),
    (EventKind.TURN_END, {"status": "interrupted"}),
)
"""A child's first turn, cut off while its one tool call ran."""


class Counting:
    """A tool handler that counts its runs and answers ``answer``."""

    def __init__(self, answer: str = "fetched") -> None:
        self.answer = answer
        self.runs = 0

    def __call__(self, arguments: dict[str, Any]) -> str:
        self.runs += 1
        return self.answer


def resume(
    runs: Runs,
    model: ScriptedModel,
    tools: list[ChildTool],
    transcript: FakeTranscript,
    *,
    gate: SpendGate | None = None,
    **fields: Any,
) -> Any:
    request = resume_request(
        Parent(), transcript, child_id=new_child_id(), events=EARLIER, prompt="go on", **fields
    ).model_copy(update={"gate": gate})
    return runs.add(InProcessProvider(model, tools=tools).resume(request, CancelSignal()))


def live_equals_rebuilt(model: ScriptedModel, transcript: FakeTranscript) -> None:
    """The conversation rebuilt from every stored event is the one the model was last sent,
    with its answer."""
    stored = [*((e.kind, e.data, e.source) for e in EARLIER)]
    stored += [(EventKind.USER_MESSAGE, {"text": "go on"}, COORDINATOR)]
    stored += [(w.kind, w.data, w.source) for w in transcript.written]
    last = model.calls[-1].messages
    rebuilt = chat_history(events(*stored))
    assert rebuilt[: len(last)] == last
    assert [m.role for m in rebuilt[len(last) :]] == ["assistant"]


def test_a_plain_tools_open_call_is_answered_as_interrupted_before_the_first_model_call(
    runs: Runs,
) -> None:
    handler = Counting()
    model = ScriptedModel(["it was cut off"])
    transcript = FakeTranscript(turn=2)
    resume(runs, model, [ChildTool("fetch", "x", {}, handler)], transcript).result()

    assert handler.runs == 0
    assert transcript.written[0] == Written(
        "tool/result", {"id": "c1", "error": INTERRUPTED_TOOL_CALL, "interrupted": True}, None
    )
    assert [w.kind for w in transcript.written] == ["tool/result", EventKind.ASSISTANT_MESSAGE]
    assert "may or may not have run" in INTERRUPTED_TOOL_CALL
    assert "check its effects" in INTERRUPTED_TOOL_CALL
    assert shape(model.calls[0].messages) == [
        ("user", "fetch it", None, []),
        ("assistant", "", None, ["c1"]),
        ("tool", INTERRUPTED_TEXT, "c1", []),
        ("user", "go on", None, []),
    ]
    live_equals_rebuilt(model, transcript)


def test_an_idempotent_tools_open_call_is_run_again_and_its_real_result_written(
    runs: Runs,
) -> None:
    handler = Counting("fetched again")
    model = ScriptedModel(["got it"])
    transcript = FakeTranscript(turn=2)
    tool = ChildTool("fetch", "x", {}, handler, idempotent=True)
    resume(runs, model, [tool], transcript).result()

    assert handler.runs == 1
    assert transcript.written[0] == Written(
        "tool/result", {"id": "c1", "output": "fetched again", "rerun": True, **ONE_TOOL_CALL}, None
    )
    assert model.calls[0].messages[2] == ChatMessage(
        role="tool", text="fetched again", tool_call_id="c1"
    )
    live_equals_rebuilt(model, transcript)


def test_an_idempotent_tool_that_needs_approval_is_never_run_again_unasked(
    runs: Runs,
) -> None:
    handler = Counting("fetched again")
    model = ScriptedModel(["got it"])
    transcript = FakeTranscript(turn=2)
    tool = ChildTool("fetch", "x", {}, handler, idempotent=True, approval="always")
    resume(runs, model, [tool], transcript).result()

    assert handler.runs == 0
    (written, *_rest) = transcript.written
    assert written.kind == "tool/result"
    assert written.data["interrupted"] is True


def test_a_message_steered_while_a_rerun_runs_is_read_after_it_live_and_rebuilt_alike(
    runs: Runs,
) -> None:
    entered, go = threading.Event(), threading.Event()

    def handler(arguments: dict[str, Any]) -> str:
        entered.set()
        assert go.wait(WAIT_S)
        return "fetched again"

    model = ScriptedModel(["got it"])
    transcript = FakeTranscript(turn=2)
    tool = ChildTool("fetch", "x", {}, handler, idempotent=True)
    run = resume(runs, model, [tool], transcript)
    assert entered.wait(WAIT_S)
    transcript.deliver(run, "hurry")  # recorded before the late result it waits behind
    go.set()
    run.result()

    assert [w.kind for w in transcript.written] == [
        "steering/message",
        "tool/result",
        EventKind.ASSISTANT_MESSAGE,
    ]
    assert shape(model.calls[0].messages)[1:] == [
        ("assistant", "", None, ["c1"]),
        ("tool", "fetched again", "c1", []),
        ("user", "go on", None, []),
        ("user", "hurry", None, []),
    ]
    live_equals_rebuilt(model, transcript)


@pytest.mark.parametrize("where", ["gone", "filtered out"])
def test_an_open_call_of_a_tool_the_child_no_longer_has_is_answered_as_interrupted(
    runs: Runs, where: str
) -> None:
    handler = Counting()
    tools = [ChildTool("other", "x", {}, handler, idempotent=True)]
    desc = descriptor()
    if where == "filtered out":
        tools.append(ChildTool("fetch", "x", {}, handler, idempotent=True))
        desc = descriptor(tool_filter={"deny": ["fetch"]})
    transcript = FakeTranscript(turn=2)
    resume(runs, ScriptedModel(["ok"]), tools, transcript, desc=desc).result()

    assert handler.runs == 0
    assert transcript.written[0].data == {
        "id": "c1",
        "error": INTERRUPTED_TOOL_CALL,
        "interrupted": True,
    }


def test_a_forked_child_answers_its_own_open_calls_never_its_seeds(runs: Runs) -> None:
    handler = Counting()
    seed = events(
        (EventKind.USER_MESSAGE, {"text": "parent's task"}, USER),
        (EventKind.ASSISTANT_MESSAGE, {"text": ""}),
        call("p1"),
    )
    own = events(
        (EventKind.USER_MESSAGE, {"text": "fork's task"}, COORDINATOR),
        (EventKind.ASSISTANT_MESSAGE, {"text": ""}),
        call("c1"),
    )
    transcript = FakeTranscript(turn=2)
    model = ScriptedModel(["again"])
    request = resume_request(
        Parent(),
        transcript,
        child_id=new_child_id(),
        events=own,
        seed=seed,
        desc=descriptor("fork"),
    )
    tools = [ChildTool("fetch", "x", {}, handler, idempotent=True)]
    runs.add(ForkProvider(model, tools=tools).resume(request, CancelSignal())).result()

    assert handler.runs == 1  # its own call, not the seed's
    assert [(w.kind, w.data.get("id")) for w in transcript.written] == [
        ("tool/result", "c1"),
        (EventKind.ASSISTANT_MESSAGE, None),
    ]
    assert shape(model.calls[0].messages)[2:] == [
        ("tool", INTERRUPTED_TEXT, "p1", []),  # the seed's placeholder, as it was
        ("user", "fork's task", None, []),
        ("assistant", "", None, ["c1"]),
        ("tool", "fetched", "c1", []),
        ("user", "continue", None, []),
    ]


class RefusingGate:
    """A `SpendGate` whose tool-call budget is spent."""

    def __init__(self) -> None:
        self.checked: list[str] = []

    def check(self, call: str) -> None:
        self.checked.append(call)
        if call == GATE_TOOL_CALL:
            raise SubagentControlError(ErrorCode.BUDGET_EXHAUSTED, "tool call budget spent")


def test_a_rerun_the_gate_refuses_is_neither_run_nor_answered(runs: Runs) -> None:
    handler = Counting()
    model = ScriptedModel(["never"])
    transcript = FakeTranscript(turn=2)
    gate = RefusingGate()
    tool = ChildTool("fetch", "x", {}, handler, idempotent=True)
    run = resume(runs, model, [tool], transcript, gate=gate)

    with raises(ErrorCode.BUDGET_EXHAUSTED):
        run.result()
    assert gate.checked == [GATE_TOOL_CALL]
    assert handler.runs == 0
    assert model.call_count == 0
    assert transcript.written == []


def test_a_kill_during_a_rerun_writes_nothing_and_the_next_resume_runs_it_again(
    runs: Runs,
) -> None:
    entered = threading.Event()
    answers = iter(["blocked", "second try"])

    def handler(arguments: dict[str, Any], signal: CancelSignal) -> str:
        answer = next(answers)
        if answer == "blocked":
            entered.set()
            signal.wait(WAIT_S)
        return answer

    tool = ChildTool("fetch", "x", {}, handler, idempotent=True)
    model = ScriptedModel(["back"])
    first = FakeTranscript(turn=2)
    run = resume(runs, model, [tool], first)
    assert entered.wait(WAIT_S)
    run.dispose()
    assert run.result().stop_reason == "aborted"
    assert first.written == []
    assert model.call_count == 0

    second = FakeTranscript(turn=3)
    resume(runs, model, [tool], second).result()
    assert second.written[0].data == {
        "id": "c1",
        "output": "second try",
        "rerun": True,
        **ONE_TOOL_CALL,
    }


# -- through the control plane: a killed turn, then a SIGKILLed process ------------------------


def test_a_call_whose_turn_was_killed_is_answered_on_resume_and_not_run_again(
    tmp_path: Path,
) -> None:
    entered = threading.Event()
    runs_of: list[str] = []

    def blocking(arguments: dict[str, Any], signal: CancelSignal) -> str:
        runs_of.append("run")
        entered.set()
        signal.wait(WAIT_S)
        return "too late"

    fetch = ModelReply(tool_calls=[ToolCall(id="c1", name="fetch", arguments={"url": "u"})])
    model = ScriptedModel([fetch, "checked, it is not there"])
    with SubagentControl.open(f"sqlite:///{tmp_path}/state.db") as control:
        tools = [ChildTool("fetch", "x", {}, blocking)]
        control.providers.register(InProcessProvider(model, tools=tools))
        parent = control.agents.register("parent-1")
        started = control.start_continuable(
            ContinuableStartSpec(
                provider="inprocess", label="f", prompt=[TextBlock(text="go")], parent=parent
            )
        )
        assert entered.wait(WAIT_S)
        control.tasks.kill(started.task_id, requester=parent)
        killed = control.tasks.wait(started.task_id, timeout=WAIT_S, requester=parent)
        assert killed.status is TaskStatus.KILLED

        again = control.send_message(parent, started.child_id, [TextBlock(text="well?")])
        done = control.tasks.wait(again.task_id, timeout=WAIT_S, requester=parent)
        assert done.status is TaskStatus.COMPLETED
        assert control.store is not None
        stored = control.store.load(started.child_id).events

    assert runs_of == ["run"]
    results = [e for e in stored if e.kind == "tool/result"]
    assert [(e.turn, e.data) for e in results] == [
        (2, {"id": "c1", "error": INTERRUPTED_TOOL_CALL, "interrupted": True})
    ]
    assert shape(model.calls[1].messages)[1:] == [
        ("assistant", "", None, ["c1"]),
        ("tool", INTERRUPTED_TEXT, "c1", []),
        ("user", "well?", None, []),
    ]


@pytest.fixture
def runs_file(tmp_path: Path) -> Path:
    """One line per run of the tool's handler, in any process."""
    path = tmp_path / "runs.txt"
    path.touch()
    return path


def crash_mid_call(url: str, runs_file: Path, reaped: Reaper, *, idempotent: bool) -> str:
    """Run the child script until its child is inside the tool call, SIGKILL it, reap it;
    the child's id."""
    mode = "idempotent" if idempotent else "plain"
    process = reaped.add(
        LinesProcess(
            Path(child_script.__file__), url, str(runs_file), mode, name="interrupted-tool child"
        )
    )
    child_id = process.expect("READY ").split()[0]
    process.proc.kill()
    process.proc.wait(WAIT_S)
    assert runs_file.read_text().count("killed-process") == 1
    return child_id


def follow_up(
    url: str, child_id: str, runs_file: Path, *, idempotent: bool
) -> tuple[ScriptedModel, list[SessionEvent], TaskSnapshot]:
    """Open the store in a new runtime and send the child a follow-up; the model, the
    stored events, and the follow-up's Task snapshot."""

    def handler(arguments: dict[str, Any]) -> str:
        child_script.record_run(runs_file, "new-runtime")
        return f"fetched {arguments['url']} again"

    model = ScriptedModel([ANSWER])
    # The interrupted path: with recovery on, this runtime would carry the dead runtime's
    # Task on in its own turn (tests/reliability/test_recovery.py) and refuse the send.
    with SubagentControl.open(url, recover=False) as control:
        tool = child_script.fetch_tool(handler, idempotent=idempotent)
        control.providers.register(InProcessProvider(model, tools=[tool]))
        parent = control.agents.register(child_script.PARENT)
        sent = control.send_message(parent, child_id, [TextBlock(text="what happened?")])
        assert sent.route == "started"
        done = control.tasks.wait(sent.task_id, timeout=WAIT_S, requester=parent)
        assert control.store is not None
        stored = control.store.load(child_id).events
    return model, stored, done


def assert_seen_in_place(model: ScriptedModel, stored: list[SessionEvent], text: str) -> None:
    """The model read the call's result right after the call, before the new prompt; and
    the conversation rebuilt from the store is the one it saw."""
    assert model.call_count == 1
    seen = model.calls[0].messages
    assert shape(seen) == [
        ("user", child_script.PROMPT, None, []),
        ("assistant", "", None, [child_script.CALL_ID]),
        ("tool", text, child_script.CALL_ID, []),
        ("user", "what happened?", None, []),
    ]
    assert chat_history(stored) == [*seen, ChatMessage(role="assistant", text=ANSWER)]
    assert_strictly_paired(seen)


def results_of(stored: list[SessionEvent]) -> list[SessionEvent]:
    return [
        e for e in stored if e.kind == "tool/result" and e.data.get("id") == child_script.CALL_ID
    ]


@pytest.mark.slow
def test_a_call_cut_off_by_sigkill_is_answered_once_as_interrupted_and_never_run_again(
    store_url: str, runs_file: Path, reaped: Reaper
) -> None:
    child_id = crash_mid_call(store_url, runs_file, reaped, idempotent=False)

    model, stored, done = follow_up(store_url, child_id, runs_file, idempotent=False)

    assert done.status is TaskStatus.COMPLETED
    assert runs_file.read_text().splitlines()[0].startswith("killed-process")
    assert len(runs_file.read_text().splitlines()) == 1  # not run again
    (answer,) = results_of(stored)
    assert answer.turn == 2
    assert answer.data == {
        "id": child_script.CALL_ID,
        "error": INTERRUPTED_TOOL_CALL,
        "interrupted": True,
    }
    assert "interrupted" in answer.data["error"]
    assert "may or may not have run" in answer.data["error"]
    ends = [(e.turn, e.data["status"]) for e in stored if e.kind == EventKind.TURN_END]
    assert ends == [(1, "interrupted"), (2, "completed")]
    assert_seen_in_place(model, stored, INTERRUPTED_TEXT)


@pytest.mark.slow
def test_an_idempotent_call_cut_off_by_sigkill_is_run_again_once_and_its_rerun_is_the_result(
    store_url: str, runs_file: Path, reaped: Reaper
) -> None:
    child_id = crash_mid_call(store_url, runs_file, reaped, idempotent=True)

    model, stored, done = follow_up(store_url, child_id, runs_file, idempotent=True)

    assert done.status is TaskStatus.COMPLETED
    assert [line.split()[0] for line in runs_file.read_text().splitlines()] == [
        "killed-process",
        "new-runtime",
    ]
    (answer,) = results_of(stored)
    assert answer.turn == 2
    rerun = f"fetched {child_script.ARGUMENTS['url']} again"
    assert answer.data == {
        "id": child_script.CALL_ID,
        "output": rerun,
        "rerun": True,
        **ONE_TOOL_CALL,
    }
    assert_seen_in_place(model, stored, rerun)
