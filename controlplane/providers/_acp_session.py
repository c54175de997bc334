"""The session methods of one ACP activation: what the agent advertises, and how it is used.

An agent says in its ``initialize`` answer which session methods it serves beyond
``session/new`` and ``session/prompt``; each is used only when advertised:

- ``session/resume`` (``agentCapabilities.sessionCapabilities.resume``): continue a session
  without replaying its history. Preferred for a resume.
- ``session/load`` (``agentCapabilities.loadSession``): continue it, with a replay of its
  history as ``session/update`` notifications (which the recorder does not record again).
- ``session/close`` (``agentCapabilities.sessionCapabilities.close``): free the session;
  sent when the run ends, before the process is ended, bounded.
- ``_session/steering``, an extension method (ACP extension methods start with ``_``),
  advertised with ``_meta.steering.supported`` in the ``initialize`` answer (as
  claude-agent-acp serves it): inject a message into the running turn. Asked with
  ``idleBehavior: promptRequired``, the agent answers ``injected`` or declines
  (``promptRequired``: no turn runs); it never starts a turn of its own for it.

A resume that none of them can serve (or that the agent refuses: an unknown session) opens
a new session whose prompt opens with the child's transcript (`primer`).

Each session opened is recorded (an ``acp/session`` event) with the method that reopens it
(``reopen``: ``session/resume``, ``session/load`` or null, as the agent advertised), so a
runtime that did not start the agent knows, before it spawns one, whether a turn its dead
runtime left open can be carried on (`recovery_refusal`). A carried-on turn reopens the
session the same way and sends the turn's messages again (`open_prompt`): the agent died
mid-prompt, so the prompt never got its answer. The ``session/inject``
draft (mid-turn input, ACP v2) is not used: it needs the v2 protocol, which the
``agent-client-protocol`` package does not speak yet.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Coroutine, Sequence
from dataclasses import dataclass
from typing import Any

from controlplane.contract import (
    CancelSignal,
    ErrorCode,
    EventKind,
    ResumeRequest,
    SessionEvent,
    StartRequest,
    SubagentControlError,
    text_of,
)
from controlplane.providers._acp_client import SESSION_EVENT, primer

__all__ = [
    "SETTLED",
    "STEERING_METHOD",
    "Capabilities",
    "SteerWaiter",
    "close_session",
    "open_prompt",
    "open_session",
    "recorded_session",
    "recovery_refusal",
    "steer_session",
]

STEERING_METHOD = "_session/steering"
"""The steering extension's method name on the wire."""
SETTLED = "the turn has settled"
"""Why a steer was refused once the turn is over."""


@dataclass(frozen=True)
class Capabilities:
    """The session methods an agent advertised in its ``initialize`` answer."""

    load: bool = False
    resume: bool = False
    close: bool = False
    steering: bool = False

    @property
    def reopen(self) -> str | None:
        """The method a later agent process reopens a session with: ``session/resume``,
        else ``session/load``; None when the agent offers neither."""
        if self.resume:
            return "session/resume"
        return "session/load" if self.load else None

    @classmethod
    def of(cls, init: Any) -> Capabilities:
        """Read them from an ``acp.schema.InitializeResponse``."""
        agent = getattr(init, "agent_capabilities", None)
        sessions = getattr(agent, "session_capabilities", None)
        metas = (getattr(init, "field_meta", None), getattr(agent, "field_meta", None))
        return cls(
            load=bool(getattr(agent, "load_session", False)),
            resume=getattr(sessions, "resume", None) is not None,
            close=getattr(sessions, "close", None) is not None,
            steering=any(_steering_meta(meta) for meta in metas),
        )


def _steering_meta(meta: Any) -> bool:
    steering = meta.get("steering") if isinstance(meta, dict) else None
    return isinstance(steering, dict) and steering.get("supported") is True


def recorded_session(events: Sequence[SessionEvent]) -> dict[str, Any] | None:
    """The newest ``acp/session`` record in ``events`` (its ``session_id``, and ``reopen``
    when it was recorded with it); None when there is none."""
    for event in reversed(events):
        data = event.data
        is_session = event.kind == SESSION_EVENT and isinstance(data, dict)
        if is_session and isinstance(data.get("session_id"), str):
            return dict(data)
    return None


def _events_of(request: StartRequest | ResumeRequest) -> list[SessionEvent]:
    if not isinstance(request, ResumeRequest):
        return []
    return [*request.events, *request.open_turn]


def recovery_refusal(events: Sequence[SessionEvent], command: str) -> str | None:
    """Why a new agent process cannot carry on the open turn of the child whose own events
    these are (the agent that ran it died with its runtime), or None when it can: the
    child's session was recorded with a method that reopens it."""
    recorded = recorded_session(events)
    if recorded is None:
        return (
            f"its ACP agent {command!r} never had its session recorded, so a new agent "
            "process has no session to reopen"
        )
    if "reopen" not in recorded:
        return (
            f"its ACP agent {command!r} had its session recorded without what reopens it, "
            "so it is not known to offer session/resume or session/load"
        )
    if recorded["reopen"] is None:
        return (
            f"its ACP agent {command!r} offers neither session/resume nor session/load, so "
            "a new agent process cannot reopen the session the turn ran in"
        )
    return None


def open_prompt(request: StartRequest | ResumeRequest) -> list[str]:
    """The texts this activation prompts with: its message; for a turn carried on after
    its runtime ended (``open_turn``), the turn's messages so far — its prompt and the
    steering messages it took, in order, each once — then the message sent with it."""
    texts: list[str] = []
    if isinstance(request, ResumeRequest):
        for event in request.open_turn:
            if event.kind in (EventKind.USER_MESSAGE, EventKind.STEERING_MESSAGE):
                text = event.data.get("text") if isinstance(event.data, dict) else None
                if isinstance(text, str):
                    texts.append(text)
    if request.prompt or not texts:
        texts.append(text_of(request.prompt))
    return texts


async def open_session(
    conn: Any, caps: Capabilities, request: StartRequest | ResumeRequest, cwd: str
) -> tuple[str, list[Any]]:
    """Open the session this activation prompts, and the prompt's content blocks.

    A resume (or a turn carried on) continues the recorded session by ``session/resume``,
    else ``session/load``; when neither is advertised, or the agent refuses both, a new
    session is opened (and recorded) and the prompt opens with the child's transcript.
    """
    import acp

    blocks = [acp.text_block(text) for text in open_prompt(request)]
    recorded = recorded_session(_events_of(request))
    if recorded is not None:
        earlier = recorded["session_id"]
        reopened = False
        if caps.resume:
            with contextlib.suppress(acp.RequestError):  # unknown to the agent: try on
                await conn.resume_session(cwd=cwd, session_id=earlier, mcp_servers=[])
                reopened = True
        if caps.load and not reopened:
            with contextlib.suppress(acp.RequestError):
                await conn.load_session(cwd=cwd, session_id=earlier, mcp_servers=[])
                reopened = True
        if reopened:
            if recorded.get("reopen", False) != caps.reopen:  # the agent changed: say so
                request.transcript.append(
                    SESSION_EVENT, {"session_id": earlier, "reopen": caps.reopen}
                )
            return earlier, blocks
    session = await conn.new_session(cwd=cwd, mcp_servers=[])
    request.transcript.append(
        SESSION_EVENT, {"session_id": session.session_id, "reopen": caps.reopen}
    )
    if isinstance(request, ResumeRequest) and request.events:
        blocks.insert(0, acp.text_block(primer(request.events)))
    return session.session_id, blocks


async def close_session(conn: Any, session_id: str, timeout_s: float) -> None:
    """Send ``session/close``; an agent that errors or does not answer in time is let be
    (the process is ended next anyway)."""
    with contextlib.suppress(Exception):
        await asyncio.wait_for(conn.close_session(session_id=session_id), timeout_s)


async def steer_session(conn: Any, session_id: str, text: str) -> str | None:
    """Ask the agent to inject ``text`` into the running turn.

    Returns:
        None when it was injected, else the agent's reason for declining it.
    """
    params = {
        "sessionId": session_id,
        "prompt": [{"type": "text", "text": text}],
        "_meta": {"steering": {"idleBehavior": "promptRequired"}},
    }
    try:
        # The SDK prefixes the extension's name with the "_" that marks it on the wire.
        answer = await conn.ext_method(STEERING_METHOD[1:], params)
    except Exception as exc:
        return f"it answered the steering request with an error ({exc})"
    outcome = answer.get("outcome") if isinstance(answer, dict) else None
    if outcome == "injected":
        return None
    reason = answer.get("reason") if isinstance(answer, dict) else None
    return f"it declined the message ({outcome or answer!r}{f', {reason}' if reason else ''})"


class SteerWaiter:
    """Hands steers from the callers' threads to the run's loop, and waits for each answer.

    Bounded: a steer waits at most its timeout, and no longer than the loop lives (`end`).
    """

    def __init__(self, child_id: str) -> None:
        self._child_id = child_id
        self._ended = CancelSignal()

    def ask(
        self,
        loop: asyncio.AbstractEventLoop,
        steer: Coroutine[Any, Any, str | None],
        timeout_s: float,
    ) -> None:
        """Run ``steer`` on ``loop``; return once the agent took the message.

        Raises:
            SubagentControlError: ``NOT_DELIVERED``, saying why (`refused`).
        """
        if self._ended.aborted:
            steer.close()
            raise self.refused(SETTLED)
        try:
            asked = asyncio.run_coroutine_threadsafe(steer, loop)
        except RuntimeError:  # the loop closed meanwhile: the turn is over
            steer.close()
            raise self.refused(SETTLED) from None
        answered = threading.Event()
        asked.add_done_callback(lambda _asked: answered.set())
        self._ended.add_callback(lambda _reason: answered.set())
        answered.wait(timeout_s)
        if not asked.done():
            if self._ended.aborted:
                raise self.refused(SETTLED)
            asked.cancel()
            raise self.refused(f"the agent did not say within {timeout_s}s that it took it")
        if asked.cancelled():
            raise self.refused(SETTLED)
        error = asked.exception()
        refusal = asked.result() if error is None else f"the steer failed ({error})"
        if refusal is not None:
            raise self.refused(refusal)

    def refused(self, why: str) -> SubagentControlError:
        """The error a steer that did not reach the turn raises."""
        return SubagentControlError(
            ErrorCode.NOT_DELIVERED,
            f"child {self._child_id} did not take the message: {why}; send it again to "
            "continue the child in a new turn",
            child_id=self._child_id,
        )

    def end(self) -> None:
        """The loop is gone: answer every steer still waiting, refuse every later one."""
        self._ended.abort("the run's loop ended")
