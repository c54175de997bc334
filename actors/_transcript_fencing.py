"""How an activation's transcript (`actors._transcript.ActivationTranscript`) is fenced:
every store call on the activation's path runs registered, so that when the runtime
fences the activation (it lost the child's claim, or could not renew its lease) a call
still waiting for the store is abandoned at once, and every later one is refused without
a store call; a write refused so ends the turn and cancels the activation. Apart from the
writer's ordering because it is the part that must work when the store does not answer.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar

from controlplane.contract import CancelSignal, ErrorCode, SubagentControlError

if TYPE_CHECKING:
    from persistence import SqlStore

_R = TypeVar("_R")

__all__ = ["TranscriptFencing"]


class TranscriptFencing:
    """The fenced half of `actors._transcript.ActivationTranscript`, which holds the state
    named here (set in its ``__init__``) and defines `_end`."""

    _store: SqlStore
    _child_id: str
    _signal: CancelSignal | None
    _writers: set[int]
    _writers_lock: threading.Lock
    _refusal: SubagentControlError | None

    if TYPE_CHECKING:

        def _end(self) -> None: ...

    def _fenced_call(self, call: Callable[[], bool]) -> bool:
        result: list[bool] = []
        self._fenced(lambda: result.append(call()))
        return result[0]

    def _fenced(self, write: Callable[[], object]) -> None:
        """Run a write; one refused because this runtime lost the claim ends the turn.

        Once the runtime fences the activation, a write still waiting for the store is
        abandoned at once (`_on_fence`) and retried no more: the activation must be
        quiescent before the lease can lapse in another runtime's eyes, and a
        write on a silent network would hold it for the store's whole deadline.
        """
        me = threading.get_ident()
        with self._writers_lock:
            self._writers.add(me)
        try:
            signal = self._signal
            if signal is not None and signal.fenced:  # `refuse_if_fenced`, inline: per write
                raise self._fenced_error()
            with self._store.abandoning(self._is_fenced):
                write()
        except SubagentControlError as exc:
            if exc.code is not ErrorCode.FENCED and self._is_fenced():
                fenced = self._fenced_error()  # abandoned: it failed because it was cut
                self._refused(fenced)
                raise fenced from exc
            self._refused(exc)
            raise
        finally:
            with self._writers_lock:
                self._writers.discard(me)

    def fenced_read(self, read: Callable[[], _R]) -> _R:
        """Run a store read on the activation's path (its budget gate's) as the writes
        run: refused once the runtime fenced the activation, and abandoned at once if it
        is waiting when the fence comes (`_fenced`). A read refused is not a write
        refused: the transcript stays as it was."""
        me = threading.get_ident()
        with self._writers_lock:
            self._writers.add(me)
        try:
            self.refuse_if_fenced()
            with self._store.abandoning(self._is_fenced):
                return read()
        except SubagentControlError as exc:
            if exc.code is not ErrorCode.FENCED and self._is_fenced():
                raise self._fenced_error() from exc  # abandoned: it failed because it was cut
            raise
        finally:
            with self._writers_lock:
                self._writers.discard(me)

    def _on_fence(self, _reason: str) -> None:
        with self._writers_lock:
            writers = set(self._writers)
        if writers:
            self._store.abandon_waits(writers)

    def _is_fenced(self) -> bool:
        signal = self._signal
        return signal is not None and signal.fenced

    def refuse_if_fenced(self) -> None:
        """Refuse a write here, without a store call, once the control plane fenced the
        activation (its runtime lost the claim, or could not renew its lease and may be
        cut off from the store: a write would wait out the store's deadlines)."""
        if self._is_fenced():
            raise self._fenced_error()

    def _fenced_error(self) -> SubagentControlError:
        reason = self._signal.reason if self._signal is not None else None
        return SubagentControlError(
            ErrorCode.FENCED,
            f"child {self._child_id}: {reason}; nothing was written",
            child_id=self._child_id,
        )

    def _refused(self, exc: SubagentControlError) -> None:
        """A write refused because this runtime lost the claim (FENCED) ends the turn: the
        activation is cancelled (its Task settles ``interrupted``), and this writer refuses
        everything after it."""
        if exc.code is ErrorCode.FENCED:
            self._refusal = self._refusal or exc
            self._end()
            if self._signal is not None:
                self._signal.abort(exc.message, cause=ErrorCode.FENCED)
