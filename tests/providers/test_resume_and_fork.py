"""Resumed and forked children: the history a turn opens with, and what it must not contain."""

from __future__ import annotations

from controlplane import (
    EventKind,
    ForkProvider,
    InProcessProvider,
    ModelSelector,
    ScriptedModel,
    SubagentProvider,
    TextBlock,
)
from controlplane.contract import CancelSignal
from controlplane.models import ChatMessage

from .fakes import (
    COORDINATOR,
    HUMAN,
    USER,
    FakeTranscript,
    Parent,
    Runs,
    descriptor,
    events,
    new_child_id,
    resume_request,
    start_request,
)

TIMEOUT_S = 5.0

# The child's own events from an earlier turn, as the store holds them.
EARLIER_TURN = events(
    (EventKind.TURN_START, {"turn": 1}),
    (EventKind.USER_MESSAGE, {"text": "first task"}, USER),
    (EventKind.DESCRIPTOR, {"version": 1, "provider": "inprocess"}),
    (EventKind.ASSISTANT_MESSAGE, {"text": "first answer"}),
    (EventKind.STEERING_MESSAGE, {"text": "a steer"}, HUMAN),
    ("tool/call", {"text": "not a chat message"}),
    (EventKind.ASSISTANT_MESSAGE, {"text": "second answer"}),
    (EventKind.ASSISTANT_MESSAGE, {"no": "text"}),
    (EventKind.TURN_END, {"stop_reason": "completed"}),
)

EARLIER_CHAT = [
    ChatMessage(role="user", text="first task", source=USER),
    ChatMessage(role="assistant", text="first answer"),
    ChatMessage(role="user", text="a steer", source=HUMAN),
    ChatMessage(role="assistant", text="second answer"),
]

SEED = events(
    (EventKind.USER_MESSAGE, {"text": "parent task"}, USER),
    (EventKind.ASSISTANT_MESSAGE, {"text": "parent reasoning"}),
)

SEED_CHAT = [
    ChatMessage(role="user", text="parent task", source=USER),
    ChatMessage(role="assistant", text="parent reasoning"),
]


def test_a_resumed_turn_opens_with_the_earlier_chat_then_the_new_prompt(runs: Runs) -> None:
    model = ScriptedModel(["third answer"])
    transcript = FakeTranscript(turn=2)
    request = resume_request(
        Parent(), transcript, child_id=new_child_id(), events=EARLIER_TURN, prompt="next"
    )
    run = runs.add(InProcessProvider(model).resume(request, CancelSignal()))
    assert run.result().output == [TextBlock(text="third answer")]
    assert model.calls[0].messages == [
        *EARLIER_CHAT,
        ChatMessage(role="user", text="next", source=COORDINATOR),
    ]
    # The resumed turn writes only its own reply: nothing of the earlier turn is rewritten.
    assert transcript.texts(EventKind.ASSISTANT_MESSAGE) == ["third answer"]
    assert [w.kind for w in transcript.written] == [EventKind.ASSISTANT_MESSAGE]


def test_a_resumed_child_gets_its_persona_and_model_selector_back(runs: Runs) -> None:
    model = ScriptedModel(["ok"])
    desc = descriptor(persona="You are the auditor.", agent_provider="p", agent_model="m")
    parent = Parent(model=ModelSelector(provider="other", model="other"))
    request = resume_request(
        parent, FakeTranscript(turn=2), child_id=new_child_id(), events=EARLIER_TURN, desc=desc
    )
    runs.add(InProcessProvider(model).resume(request, CancelSignal())).result()
    (call,) = model.calls
    assert call.system == "You are the auditor."
    assert call.model == ModelSelector(provider="p", model="m")


def test_a_resumed_child_registers_its_agent_again_and_can_be_steered(runs: Runs) -> None:
    model = ScriptedModel(["one", "two"], gated=True)
    parent = Parent()
    transcript = FakeTranscript(turn=2)
    request = resume_request(parent, transcript, child_id=new_child_id(), events=EARLIER_TURN)
    run = runs.add(InProcessProvider(model).resume(request, CancelSignal()))
    assert run.local_agent is parent.registry.get(request.child_id)
    assert model.wait_for_calls(1, TIMEOUT_S)
    transcript.deliver(run, "more")
    model.release(2)
    assert run.result().output == [TextBlock(text="two")]
    assert model.calls[1].messages[-1].text == "more"


def test_the_inprocess_provider_opens_a_fresh_conversation_without_the_seed(
    runs: Runs,
) -> None:
    model = ScriptedModel(["ok"])
    request = start_request(Parent(), FakeTranscript(), prompt="task", seed=SEED)
    runs.add(InProcessProvider(model).start(request, CancelSignal())).result()
    assert [m.text for m in model.calls[0].messages] == ["task"]


def test_fork_provider_is_a_subagent_provider_named_fork() -> None:
    provider = ForkProvider(ScriptedModel())
    assert isinstance(provider, SubagentProvider)
    assert provider.name == "fork"


def test_a_forked_child_opens_with_its_seed_then_its_prompt(runs: Runs) -> None:
    model = ScriptedModel(["forked answer"])
    transcript = FakeTranscript()
    request = start_request(
        Parent(), transcript, prompt="explore option B", seed=SEED, desc=descriptor("fork")
    )
    run = runs.add(ForkProvider(model).start(request, CancelSignal()))
    assert run.result().output == [TextBlock(text="forked answer")]
    assert model.calls[0].messages == [
        *SEED_CHAT,
        ChatMessage(role="user", text="explore option B", source=USER),
    ]
    # The seed is the control plane's to store; the child writes only its reply.
    assert [w.kind for w in transcript.written] == [EventKind.ASSISTANT_MESSAGE]


def test_a_resumed_fork_opens_with_the_stored_seed_once_then_its_own_turns(runs: Runs) -> None:
    model = ScriptedModel(["ok"])
    request = resume_request(
        Parent(),
        FakeTranscript(turn=2),
        child_id=new_child_id(),
        events=EARLIER_TURN,
        seed=SEED,
        prompt="next",
        desc=descriptor("fork"),
    )
    runs.add(ForkProvider(model).resume(request, CancelSignal())).result()
    assert model.calls[0].messages == [
        *SEED_CHAT,
        *EARLIER_CHAT,
        ChatMessage(role="user", text="next", source=COORDINATOR),
    ]


def test_a_fork_resumed_after_its_first_turn_sees_the_seed_exactly_once(runs: Runs) -> None:
    # The seed comes from the stored copy every turn; the own events never repeat it.
    model = ScriptedModel(["ok"])
    parent = Parent()
    child_id = new_child_id()
    provider = ForkProvider(model)
    first = start_request(parent, FakeTranscript(), child_id=child_id, seed=SEED, prompt="go")
    first_run = runs.add(provider.start(first, CancelSignal()))
    first_run.result()
    first_run.dispose()
    later = resume_request(
        parent,
        FakeTranscript(turn=2),
        child_id=child_id,
        events=events(
            (EventKind.USER_MESSAGE, {"text": "go"}, USER),
            (EventKind.ASSISTANT_MESSAGE, {"text": "ok"}),
        ),
        seed=SEED,
        prompt="again",
    )
    runs.add(provider.resume(later, CancelSignal())).result()
    texts = [m.text for m in model.calls[1].messages]
    assert texts == ["parent task", "parent reasoning", "go", "ok", "again"]


def test_a_fork_with_an_empty_seed_behaves_like_an_inprocess_child(runs: Runs) -> None:
    model = ScriptedModel(["ok"])
    request = start_request(Parent(), FakeTranscript(), prompt="task", desc=descriptor("fork"))
    runs.add(ForkProvider(model).start(request, CancelSignal())).result()
    assert [m.text for m in model.calls[0].messages] == ["task"]
