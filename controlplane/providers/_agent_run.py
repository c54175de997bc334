"""One turn of the child agent loop (`AgentLoopRun`), the `SubagentRun` the loop providers
(`controlplane.providers._agent_loop`) start: ask the model, write its reply through the
activation's transcript writer, run the tools it called (writing each call and its result),
take any steered messages and ask again, until the model answers with no tool call and
nothing queued. Apart from the providers because the run is the loop's thread and its lock,
and the providers only build its history and hand it over.

Lock order: the control plane calls `AgentLoopRun.steer` while it holds the transcript
writer's lock (so a ``steering/message`` is recorded before the reply it causes). The loop
therefore never holds its own lock while it calls the writer, the model or a tool; the run
lock is only ever the inner lock.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence

from controlplane.contract import (
    MODEL_CALL,
    NO_RUN_TRACE,
    TOOL_ROUND,
    AgentHandle,
    ApprovalDesk,
    CancelSignal,
    ErrorCode,
    EventKind,
    MessageSource,
    RunTrace,
    SpendGate,
    StopReason,
    SubagentControlError,
    SubagentResult,
    TextBlock,
    TranscriptWriter,
    Usage,
    text_of,
    usage_data,
)
from controlplane.contract import TOOL_CALL as GATE_TOOL_CALL
from controlplane.providers._approval_calls import (
    Continuation,
    Parked,
    approved_call,
    taken_call,
)
from controlplane.providers._chat_history import (
    STEERING_SEEN,
    TOOL_CALL,
    TOOL_RESULT,
    UnansweredCall,
    counted_tool_result,
    tool_call_data,
    tool_message_text,
)
from controlplane.providers._child_tools import ChildTool, ToolOutcome
from controlplane.providers._loop_threads import LoopThread, loop_threads
from controlplane.providers._model import ChatMessage, ModelAdapter, ModelRequest, ToolCall
from controlplane.providers._recovery import answer_unanswered

__all__ = ["AgentLoopRun"]


_ONE_MODEL_CALL = Usage(model_calls=1)


def _unique_ids(calls: Sequence[ToolCall], salt: int) -> list[ToolCall]:
    """``calls`` with an id each, distinct within the reply (a result answers one id)."""
    seen: set[str] = set()
    out = []
    for n, call in enumerate(calls):
        if not call.id or call.id in seen:
            call = call.model_copy(update={"id": f"call_{salt}_{n}"})
        seen.add(call.id)
        out.append(call)
    return out


class AgentLoopRun:
    """One turn of a child agent loop: the `SubagentRun` the loop providers return.

    Attributes:
        child_id: The child this run belongs to.
        local_agent: The child's live agent, registered for this run, disposed by `dispose`.
    """

    def __init__(
        self,
        *,
        child_id: str,
        local_agent: AgentHandle,
        model: ModelAdapter,
        template: ModelRequest,
        transcript: TranscriptWriter,
        thread_name: str,
        stop_timeout_s: float,
        tools: Sequence[ChildTool] = (),
        gate: SpendGate | None = None,
        approvals: ApprovalDesk | None = None,
        continuation: Continuation | None = None,
        unread: Sequence[ChatMessage] = (),
        seen: int = 0,
        unanswered: Sequence[UnansweredCall] = (),
        trace: RunTrace = NO_RUN_TRACE,
    ) -> None:
        self.child_id = child_id
        self._trace = trace  # the activation's: its context is current on the loop's thread
        self.local_agent: AgentHandle | None = local_agent
        self.steer: Callable[[Sequence[TextBlock], MessageSource], None] | None = self._steer
        self._agent = local_agent
        self._model = model
        self._template = template
        self._transcript = transcript
        self._tools = {tool.name: tool for tool in tools}
        # Asked before every model call and tool call: its refusal ends the turn
        # before the call starts, and `result()` raises it (BUDGET_EXHAUSTED).
        self._gate = gate
        # Where a call that needs approval is asked; a continued turn goes on
        # with the call its parked run waited on, having read ``seen`` of the turn's
        # steering messages (``unread`` ones are read at the next model call).
        self._desk = approvals
        self._continuation = continuation
        self._seen_before = seen
        self._stop_timeout_s = stop_timeout_s
        self._unanswered = tuple(unanswered)  # answered before the first model call
        # The loop's own signal: aborted by the activation's signal or by `dispose`, and the
        # one the model sees, so either stops a model call in flight.
        self._signal = CancelSignal()
        self._lock = threading.Lock()
        self._queue: list[ChatMessage] = list(unread)
        self._closed = False
        self._done = threading.Event()
        self._result: SubagentResult | None = None
        self._error: Exception | None = None
        # On a pooled daemon thread (`_loop_threads`), named this while the loop runs.
        self._thread_name = thread_name
        self._thread: LoopThread | None = None
        self._started = False

    def result(self) -> SubagentResult:
        """Block until the turn ends and return its result.

        ``stop_reason`` is ``completed``, the model's own reason when it stopped otherwise
        (``max-tokens``, …), or ``aborted``; ``output`` is the turn's last non-empty reply.

        Raises:
            Exception: what the model or the transcript writer raised, which ended the turn.
        """
        self._done.wait()
        if self._error is not None:
            raise self._error
        assert self._result is not None
        return self._result

    def dispose(self) -> None:
        """Stop the loop if it still runs, wait for it to return, dispose the child's agent.

        Idempotent. After it returns the run is quiescent: its loop has returned and its
        thread bears its name no more (the thread is reused), no further writes.

        Raises:
            SubagentControlError: ``TIMEOUT`` when the model did not honour the abort and the
                thread is still running after the provider's ``stop_timeout_s``.
        """
        self._signal.abort("the run was disposed")
        self._close()
        loop = self._thread
        if loop is not None and loop.thread is not threading.current_thread():
            loop.join(self._stop_timeout_s)
        # The agent goes even when the thread is stuck, so the child can be resumed later.
        self._agent.dispose()
        if loop is not None and loop.running:
            raise SubagentControlError(
                ErrorCode.TIMEOUT,
                f"the agent loop of child {self.child_id} did not stop within "
                f"{self._stop_timeout_s}s after it was aborted; its model adapter ignores "
                "cancellation",
                child_id=self.child_id,
            )

    def _steer(self, message: Sequence[TextBlock], source: MessageSource) -> None:
        """Queue ``message`` for the model's next call in this turn.

        Raises:
            SubagentControlError: ``NOT_DELIVERED`` once the turn has settled (answered with
                nothing queued, aborted, failed or disposed).
        """
        chat = ChatMessage(role="user", text=text_of(message), source=source)
        with self._lock:
            if self._closed or self._signal.aborted:
                raise SubagentControlError(
                    ErrorCode.NOT_DELIVERED,
                    f"child {self.child_id} did not take the message: the turn has settled; "
                    "send it again to continue the child in a new turn",
                    child_id=self.child_id,
                )
            self._queue.append(chat)

    def _begin(self, activation: CancelSignal) -> None:
        activation.add_callback(self._signal.abort)
        self._started = True
        self._thread = loop_threads.start(self._traced, self._thread_name)

    def _traced(self) -> None:
        with self._trace.current():
            self._loop()

    def _loop(self) -> None:
        history = list(self._template.messages)
        output = ""
        stop_reason: str = StopReason.COMPLETED
        # This turn's steered messages the model has been shown, in delivery order.
        seen = self._seen_before
        try:
            answer_unanswered(
                self._unanswered,
                history,
                tools=self._tools,
                transcript=self._transcript,
                gate=self._gate,
                signal=self._signal,
            )  # a kill meanwhile: the first check below ends the turn
            if self._continuation is not None and not self._go_on(self._continuation, history):
                stop_reason = StopReason.ABORTED
            while stop_reason != StopReason.ABORTED:
                with self._lock:
                    history.extend(self._queue)
                    seen += len(self._queue)
                    self._queue.clear()
                if self._signal.aborted:
                    stop_reason = StopReason.ABORTED
                    break
                if self._gate is not None:
                    self._gate.check(MODEL_CALL)
                request = self._template.model_copy(update={"messages": list(history)})
                model = request.model.model if request.model is not None else None
                with self._trace.calling_model(model) as traced:
                    reply = self._model.complete(request, self._signal)
                    if reply.usage is not None:
                        traced.usage(reply.usage.input_tokens, reply.usage.output_tokens)
                if self._signal.aborted:
                    # A reply that lost the race with a kill is dropped, not written.
                    stop_reason = StopReason.ABORTED
                    break
                calls = _unique_ids(reply.tool_calls, len(history))
                # A message steered during the call is recorded before this reply, yet the
                # model reads it only at the next call: the reply says which it read, so a
                # resumed child's conversation is the one this model saw (`chat_history`).
                # The call's usage rides in the same event: durable with the message, never
                # a second write a crash could separate from it.
                data = {
                    "text": reply.text,
                    STEERING_SEEN: seen,
                    **usage_data(reply.usage, counted=_ONE_MODEL_CALL),
                }
                if reply.text:
                    output = reply.text
                if not calls:
                    # Whatever the reply's stop reason, a message the turn accepted meanwhile
                    # is answered in this turn: its sender heard `steered`. Deciding to end
                    # and refusing later steers is one step under the lock; the reply is
                    # then the turn's last event, written with the turn's end.
                    with self._lock:
                        ending = not self._queue
                        if ending:
                            self._closed = True
                    if ending:
                        self._transcript.append(EventKind.ASSISTANT_MESSAGE, data, last=True)
                        stop_reason = reply.stop_reason
                        break
                self._transcript.append(EventKind.ASSISTANT_MESSAGE, data)
                history.append(ChatMessage(role="assistant", text=reply.text, tool_calls=calls))
                if calls and not self._run_tools(calls, history, reason=reply.text):
                    stop_reason = StopReason.ABORTED
                    break
                # The model reads the tool results or the messages steered meanwhile.
        except Parked:
            # Waiting for an approval answer past the grace period: the run ends, its Task
            # stays input_required, and the answer continues the turn.
            stop_reason = StopReason.INPUT_REQUIRED
        except Exception as exc:  # result() re-raises it to the control plane
            self._close()  # a failed turn takes no further message
            if self._signal.aborted:
                stop_reason = StopReason.ABORTED  # the kill explains the failure
            else:
                self._error = exc
        except BaseException as exc:
            self._close()
            # Not re-raised: in a non-main thread it would only reach threading.excepthook.
            self._error = SubagentControlError(
                ErrorCode.CANCELLED,
                f"the agent loop of child {self.child_id} was interrupted by "
                f"{type(exc).__name__}; send a message to continue the child",
                child_id=self.child_id,
            )
        finally:
            self._close()
            self._result = SubagentResult(
                stop_reason=stop_reason, output=[TextBlock(text=output)] if output else []
            )
            self._done.set()

    def _run_tools(
        self,
        calls: Sequence[ToolCall],
        history: list[ChatMessage],
        *,
        reason: str | None,
        new_round: bool = True,
    ) -> bool:
        """Run each call in order, writing it and its result; False once the turn is killed.

        A result that lost the race with a kill is dropped, not written, like a reply.
        A call the gate refuses is neither written nor run. A call that needs approval is
        asked first (`approved_call`; ``reason``: what the model said with the calls).

        Raises:
            Parked: the run parked on an approval request.
        """
        gate = self._gate
        if gate is not None and new_round:
            gate.check(TOOL_ROUND)
        for index, call in enumerate(calls):
            if gate is not None:
                gate.check(GATE_TOOL_CALL)
            self._transcript.append(TOOL_CALL, tool_call_data(call))
            with self._trace.calling_tool(call.name):  # approval included
                outcome = approved_call(
                    self._tools,
                    call,
                    calls[index + 1 :],
                    desk=self._desk,
                    reason=reason,
                    signal=self._signal,
                )
            if not self._answer_call(call, outcome, history):
                return False
        return True

    def _answer_call(
        self, call: ToolCall, outcome: ToolOutcome, history: list[ChatMessage]
    ) -> bool:
        """Write a call's result and show it to the model; False once the turn is killed."""
        if self._signal.aborted:
            return False
        self._transcript.append(TOOL_RESULT, counted_tool_result(outcome.event_data(call.id)))
        text = tool_message_text(output=outcome.output, error=outcome.error)
        history.append(ChatMessage(role="tool", text=text, tool_call_id=call.id))
        return True

    def _go_on(self, continuation: Continuation, history: list[ChatMessage]) -> bool:
        """A continued turn: take the answer its parked run waited for (or wait again),
        act on it, then run the reply's calls left after it; False once killed.

        Raises:
            Parked: it parked again (nothing answered it yet).
        """
        desk = self._desk
        if desk is None:
            raise SubagentControlError(
                ErrorCode.NOT_RESUMABLE,
                f"child {self.child_id} waits on an approval request, and this run has no "
                "desk to take its answer at",
                child_id=self.child_id,
            )
        # The reply's calls not yet written belong to the same assistant message.
        _attach_calls(history, continuation.call.id, continuation.pending)
        with self._trace.calling_tool(continuation.call.name):
            outcome = taken_call(
                self._tools,
                continuation.call,
                continuation.request_id,
                desk=desk,
                signal=self._signal,
            )
        if not self._answer_call(continuation.call, outcome, history):
            return False
        return self._run_tools(
            continuation.pending, history, reason=continuation.reason, new_round=False
        )

    def _close(self) -> None:
        with self._lock:
            self._closed = True

    def __repr__(self) -> str:
        state = "done" if self._done.is_set() else "running" if self._started else "new"
        return f"<AgentLoopRun {self.child_id!r} {state}>"


def _attach_calls(history: list[ChatMessage], call_id: str, calls: Sequence[ToolCall]) -> None:
    """Add ``calls`` to the assistant message that made call ``call_id`` (a continued
    turn's history holds only the calls written before its run parked)."""
    if not calls:
        return
    for index in range(len(history) - 1, -1, -1):
        message = history[index]
        if message.role == "assistant" and any(c.id == call_id for c in message.tool_calls):
            history[index] = message.model_copy(
                update={"tool_calls": [*message.tool_calls, *calls]}
            )
            return
