"""`OpenAIChatModel`, a model adapter over the Chat Completions API (public as
`controlplane.models.OpenAIChatModel`).

Works with any server that speaks Chat Completions (OpenAI, vLLM, Ollama, llama.cpp,
LiteLLM, …). The ``openai`` package is an optional extra, imported when the adapter is
built: ``pip install 'subagent-control[openai]'``.

A kill must not wait for a generation to finish. Each HTTP call therefore runs on a worker
thread while the child's loop thread waits for it *or* for the abort, whichever comes first;
the abort also shuts the streaming connection's socket, so the server sees the client go at
once and the worker is freed. (Closing an HTTP response from another thread does not wake a
thread blocked reading it; shutting its socket does.) A worker pool keeps the hop cheap.
"""

from __future__ import annotations

import os
import queue
import socket
import threading
from collections.abc import Callable
from contextlib import suppress
from typing import Any

import tenacity

from controlplane.contract import CancelSignal, ErrorCode, SubagentControlError
from controlplane.providers._extras import require_extra
from controlplane.providers._model import ModelReply, ModelRequest
from controlplane.providers._openai_wire import (
    StreamedReply,
    chat_payload,
    failure_of,
    is_retryable,
    reply_of,
    retry_after_s,
)

__all__ = ["OpenAIChatModel"]

WORKER_PREFIX = "subagent-model-call"
"""Every worker thread's name starts with this."""


class OpenAIChatModel:
    """A `ModelAdapter` that asks a Chat Completions server for each reply.

    The child's persona is sent as the system message and its tools as ``function`` tools;
    a request's `ModelSelector` (the descriptor's, else the parent's) names the model, else
    ``model``. Finish reasons map to stop reasons: ``stop`` and ``tool_calls`` →
    ``completed``, ``length`` → ``max-tokens``, ``content_filter`` → ``refusal``. Each
    reply carries the server's token usage (`ModelReply.usage`; streamed replies ask for it
    with ``stream_options.include_usage``), or None when the server sends none.

    A rate limit (429), a server error (5xx), a timeout or a dropped connection is retried
    (tenacity: at most ``max_retries`` more attempts within ``retry_budget_s``, waiting what
    the server's ``Retry-After`` asks, capped at ``max_retry_wait_s``; the waits end at once
    on a kill). Any other failure ends the child's turn with the server's own words.

    Args:
        model: The default model name.
        base_url: The server's base URL (e.g. ``http://127.0.0.1:8000/v1``); None for the
            SDK's default (``OPENAI_BASE_URL`` or OpenAI).
        api_key: The API key; None for ``OPENAI_API_KEY``, or a placeholder that local
            servers ignore.
        client: An ``openai.OpenAI`` client to use instead (its own retries are turned off).
        stream: Stream replies (the default). Without streaming a kill still ends the turn
            at once, but the connection stays open until the server answers.
        max_retries: Retries after the first attempt.
        retry_budget_s: No retry starts after this long.
        max_retry_wait_s: The longest wait between two attempts.
        retry_base_s: The first backoff when the server names no wait (doubling, jittered).
        **request_options: Passed to every ``chat.completions.create`` call
            (``temperature``, ``max_tokens``, ``timeout``, ``extra_body``, …).

    Raises:
        ImportError: the ``openai`` extra is not installed.
    """

    def __init__(
        self,
        model: str,
        *,
        base_url: str | None = None,
        api_key: str | None = None,
        client: Any = None,
        stream: bool = True,
        max_retries: int = 3,
        retry_budget_s: float = 60.0,
        max_retry_wait_s: float = 20.0,
        retry_base_s: float = 0.5,
        **request_options: Any,
    ) -> None:
        self._openai = require_extra("openai", extra="openai", needed_by="OpenAIChatModel")
        if not model:
            raise SubagentControlError(ErrorCode.INVALID_INPUT, "OpenAIChatModel needs a model")
        if client is None:
            key = api_key or os.environ.get("OPENAI_API_KEY") or "unused-by-local-servers"
            client = self._openai.OpenAI(base_url=base_url, api_key=key, max_retries=0)
        else:
            client = client.with_options(max_retries=0)
        self._client = client
        self._model = model
        self._stream = stream
        self._stream_options = dict(request_options.pop("stream_options", None) or {})
        self._options = request_options
        self._base_url = str(client.base_url)
        self._workers = _Workers()
        self._retrying = tenacity.Retrying(
            stop=tenacity.stop_after_attempt(max_retries + 1)
            | tenacity.stop_after_delay(retry_budget_s),
            wait=_ServerWait(retry_base_s, max_retry_wait_s),
            retry=tenacity.retry_if_exception(lambda exc: is_retryable(exc, self._openai)),
            reraise=True,
        )

    @property
    def model(self) -> str:
        """The default model name."""
        return self._model

    @property
    def base_url(self) -> str:
        """The server's base URL."""
        return self._base_url

    def complete(self, request: ModelRequest, signal: CancelSignal) -> ModelReply:
        """Ask the server for the reply to ``request``.

        Raises:
            SubagentControlError: ``CANCELLED`` once ``signal`` aborts (returns at once);
                ``INVALID_INPUT`` when the server refused the request (4xx), ``TIMEOUT``, or
                ``INTERNAL`` for an unreachable or failing server, each with its words.
        """
        payload = {**chat_payload(request, self._model), **self._options}
        if self._stream:
            # A stream reports usage only when asked, in one last chunk; the caller's own
            # ``stream_options`` (``include_usage=False`` for a server that refuses the
            # field) win over ours.
            payload["stream_options"] = {"include_usage": True, **self._stream_options}
        retrying = self._retrying.copy(sleep=lambda seconds: _sleep(signal, seconds))
        try:
            for attempt in retrying:
                with attempt:
                    return self._attempt(payload, signal)
        except self._openai.OpenAIError as exc:
            raise failure_of(exc, self._openai, self._base_url) from exc
        raise AssertionError("unreachable: tenacity either returns or re-raises")

    def _attempt(self, payload: dict[str, Any], signal: CancelSignal) -> ModelReply:
        _raise_if_aborted(signal)
        call = _Call(lambda: self._call(payload, call))
        signal.add_callback(call.abort)
        self._workers.submit(call.run)
        call.done.wait()
        _raise_if_aborted(signal)
        return call.outcome()

    def _call(self, payload: dict[str, Any], call: _Call) -> ModelReply:
        completions = self._client.chat.completions
        if not self._stream:
            return reply_of(completions.create(**payload))
        stream = completions.create(**payload, stream=True)
        try:
            if not call.hold(stream.response):
                return ModelReply()  # aborted before the headers came; nobody reads this
            reply = StreamedReply()
            for chunk in stream:
                reply.add(chunk)
            return reply.reply()
        finally:
            stream.close()

    def __repr__(self) -> str:
        return f"<OpenAIChatModel {self._model!r} at {self._base_url}>"


class _Call:
    """One HTTP attempt, run by a worker; the loop thread waits on ``done``."""

    def __init__(self, body: Callable[[], ModelReply]) -> None:
        self.done = threading.Event()
        self._body = body
        self._lock = threading.Lock()
        self._aborted = False
        self._response: Any = None
        self._reply: ModelReply | None = None
        self._error: BaseException | None = None

    def run(self) -> None:
        try:
            self._reply = self._body()
        except BaseException as exc:  # handed to the waiting loop thread, which raises it
            self._error = exc
        finally:
            self.done.set()

    def hold(self, response: Any) -> bool:
        """Keep the streaming response so an abort can cut it; False if already aborted."""
        with self._lock:
            if self._aborted:
                _cut(response)
                return False
            self._response = response
            return True

    def abort(self, _reason: str) -> None:
        with self._lock:
            self._aborted = True
            response = self._response
        if response is not None:
            _cut(response)
        self.done.set()

    def outcome(self) -> ModelReply:
        if self._error is not None:
            raise self._error
        assert self._reply is not None
        return self._reply


class _Workers:
    """Daemon threads for blocking HTTP calls; idle ones are reused, and retire when unused.

    Daemon, because a server that never answers must not keep the process alive at exit.
    """

    def __init__(self, *, idle_s: float = 30.0) -> None:
        self._jobs: queue.SimpleQueue[Callable[[], None]] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._idle = 0  # workers waiting for a job, minus jobs queued for them
        self._idle_s = idle_s
        self._count = 0

    def submit(self, job: Callable[[], None]) -> None:
        with self._lock:
            if self._idle > 0:
                self._idle -= 1
                self._jobs.put(job)
                return
            self._count += 1
            name = f"{WORKER_PREFIX}-{self._count}"
        threading.Thread(target=self._work, args=(job,), name=name, daemon=True).start()

    def _work(self, job: Callable[[], None]) -> None:
        while True:
            job()
            with self._lock:
                self._idle += 1
            while True:
                try:
                    job = self._jobs.get(timeout=self._idle_s)
                    break
                except queue.Empty:
                    with self._lock:
                        if self._idle > 0:  # no queued job counts on this worker
                            self._idle -= 1
                            return


class _ServerWait(tenacity.wait.wait_base):
    """Wait what the server asked (``Retry-After``), else a jittered doubling backoff."""

    def __init__(self, base_s: float, max_s: float) -> None:
        self._backoff = tenacity.wait_random_exponential(multiplier=base_s, max=max_s)
        self._max_s = max_s

    def __call__(self, retry_state: tenacity.RetryCallState) -> float:
        outcome = retry_state.outcome
        asked = retry_after_s(outcome.exception()) if outcome is not None else None
        if asked is not None:
            return min(asked, self._max_s)
        return float(self._backoff(retry_state))


def _cut(response: Any) -> None:
    """End a streaming response now: shut its socket so a blocked read returns."""
    extensions = getattr(response, "extensions", None) or {}
    network = extensions.get("network_stream")
    sock = network.get_extra_info("socket") if network is not None else None
    if isinstance(sock, socket.socket):
        with suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)
        return
    with suppress(Exception):  # no socket to shut: closing is the best left
        response.close()


def _sleep(signal: CancelSignal, seconds: float) -> None:
    signal.wait(seconds)


def _raise_if_aborted(signal: CancelSignal) -> None:
    if signal.aborted:
        raise SubagentControlError(
            ErrorCode.CANCELLED, f"the model call was cancelled: {signal.reason}"
        )
