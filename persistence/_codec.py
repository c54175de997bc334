"""Checking what callers hand the store, and turning stored rows back into models."""

from __future__ import annotations

import functools
import gc
import json
import threading
from collections.abc import Iterable, Iterator, Mapping, Sequence
from collections.abc import Set as AbstractSet
from contextlib import contextmanager
from datetime import datetime
from typing import Any, Final, NamedTuple, Protocol, TypeVar

import orjson
from pydantic import BaseModel, ValidationError

from controlplane.contract import (
    ChildMeta,
    ErrorCode,
    EventKind,
    JsonValue,
    MessageSource,
    NewEvent,
    SessionEvent,
    SubagentControlError,
    dumps,
    plain_json,
)
from persistence._times import utc_time

__all__ = [
    "EXACT_MARK",
    "PendingEvent",
    "RowCursor",
    "SteeringRecord",
    "Transcript",
    "check_child_id",
    "construct",
    "decode_events",
    "from_json",
    "gc_paused",
    "prepare_events",
    "prepare_meta",
    "session_event",
    "steering_record",
    "stored_events",
    "to_json",
]


class PendingEvent(NamedTuple):
    """An event checked and serialised, waiting for its ``seq`` (a tuple: built per event
    on the append path, where a frozen dataclass costs three times as much)."""

    kind: str
    turn: int
    data: JsonValue
    source: MessageSource | None
    data_json: str
    source_json: str | None


def check_child_id(child_id: object) -> str:
    """``child_id`` if it is a usable id, else ``INVALID_INPUT``."""
    if not isinstance(child_id, str) or not child_id:
        raise SubagentControlError(
            ErrorCode.INVALID_INPUT, f"child_id must be a non-empty string, not {child_id!r}"
        )
    _check_text(child_id, "child_id")
    return child_id


def prepare_meta(meta: object) -> ChildMeta:
    """A `ChildMeta` (or a mapping of its fields) checked for storage."""
    if isinstance(meta, Mapping):
        try:
            meta = ChildMeta.model_validate(dict(meta))
        except ValidationError as exc:
            raise _invalid(f"invalid child header: {_first_error(exc)}") from exc
    if not isinstance(meta, ChildMeta):
        raise _invalid(f"the child header must be a ChildMeta, not {type(meta).__name__}")
    _check_text(meta.child_id, "child_id")
    _check_text(meta.parent_session, "parent_session")
    if meta.label is not None:
        _check_text(meta.label, "label")
    if meta.created_at.utcoffset() is None:
        raise _invalid("the child header's created_at has no time zone; pass a UTC datetime")
    _check_int(meta.depth, "depth")
    _check_int(meta.seed_length, "seed_length")
    return meta


def prepare_events(events: object) -> list[PendingEvent]:
    """Check and serialise a batch; any bad event refuses the whole batch. A record
    `steering_record` made is taken as it is: it was checked when it was made.

    Raises:
        SubagentControlError: ``INVALID_INPUT`` naming the first bad event: not a
            `NewEvent` or mapping, a wrong key or type, or data that is not plain JSON.
    """
    if events.__class__ is list:  # the usual batch: skip the ABC checks below (~1 us)
        if len(events) == 1 and events[0].__class__ is SteeringRecord:
            return events
        return [_prepare(item, index) for index, item in enumerate(events)]
    if isinstance(events, str | bytes | bytearray | Mapping | NewEvent) or not isinstance(
        events, Iterable
    ):
        raise _invalid(
            f"events must be a list of NewEvent values or mappings, not {type(events).__name__}"
        )
    return [_prepare(item, index) for index, item in enumerate(events)]


class SteeringRecord(PendingEvent):
    """A ``steering/message`` record as `steering_record` checked and serialised it."""

    __slots__ = ()


def steering_record(
    turn: int, text: str, source: MessageSource, forwarded: str | None = None
) -> SteeringRecord:
    """The ``steering/message`` record of a steer (``data``: its ``text``, and the inbox id
    of a ``forwarded`` message), checked and serialised once, where the steer is taken:
    `SqlStore.append` then writes it as it is.

    It is refused as `prepare_events` refuses the same `NewEvent`, with the same error,
    but checks only what a record of this shape can get wrong (every value is text the
    record itself was built from, so there is no deep copy to make): the text and the
    inbox id must have a UTF-8 form (orjson refuses a lone surrogate), the source must
    be storable, the turn must fit the column.

    Raises:
        SubagentControlError: ``INVALID_INPUT``, as `SqlStore.append` would raise it.
    """
    data: dict[str, Any] = (
        {"text": text} if forwarded is None else {"text": text, "forwarded": forwarded}
    )
    if (
        text.__class__ is not str
        or (forwarded is not None and forwarded.__class__ is not str)
        or source.__class__ is not MessageSource
        or turn.__class__ is not int
        or not 0 <= turn <= MAX_INT
    ):
        return _refused_record(turn, data, source)
    try:
        data_json = orjson.dumps(data).decode()
    except orjson.JSONEncodeError:
        return _refused_record(turn, data, source)
    return SteeringRecord(
        EventKind.STEERING_MESSAGE, turn, data, source, data_json, _source_json(source)
    )


def _refused_record(turn: object, data: dict[str, Any], source: object) -> SteeringRecord:
    """What `prepare_events` makes of the record `steering_record` could not vouch for:
    its refusal, worded as for any batch (or, should it pass, its checked record)."""
    try:
        event = NewEvent.model_validate(
            {"kind": EventKind.STEERING_MESSAGE, "turn": turn, "data": data, "source": source},
            strict=True,
        )
    except ValidationError as exc:
        raise _invalid(f"event 0 is invalid: {_first_error(exc)}") from exc
    return SteeringRecord(*_prepare(event, 0))


def _prepare(item: object, index: int) -> PendingEvent:
    if item.__class__ is SteeringRecord:
        return item
    if isinstance(item, NewEvent):
        event = item
    elif isinstance(item, Mapping):
        try:
            # Strict: a turn of "3" or True is a caller's bug, not a number to coerce.
            event = NewEvent.model_validate(dict(item), strict=True)
        except ValidationError as exc:
            raise _invalid(f"event {index} is invalid: {_first_error(exc)}") from exc
    else:
        raise _invalid(
            f"event {index} must be a NewEvent or a mapping with kind, turn, data and "
            f"optional source, not {type(item).__name__}"
        )
    data = plain_json(event.data, code=ErrorCode.INVALID_INPUT, what=_data_what(index))
    data_json = to_json(data)
    source_json = None if event.source is None else _source_json(event.source)
    _check_text(event.kind, f"event {index} kind")
    _check_int(event.turn, f"event {index} turn")
    if not data_json.isascii():  # JSON escapes NUL; only lone surrogates can slip through
        _check_unicode(data_json, f"event {index} data")
    return PendingEvent(event.kind, event.turn, data, event.source, data_json, source_json)


@functools.lru_cache(maxsize=64)
def _data_what(index: int) -> str:
    # What a refusal calls the data; formatted once per index, not once per event.
    return f"event {index} data"


# Exact-path marker: JSON allows leading whitespace, so any reader still reads the text,
# and ours knows it must not use orjson on it.
EXACT_MARK: Final = " "


def to_json(value: JsonValue) -> str:
    """The stored text of event data: orjson's compact UTF-8 JSON (several times faster
    than the standard library on both ends), or — for integers beyond 64 bits, which
    orjson cannot write and would read back as floats — the contract's `dumps` behind a
    leading space that routes the text to the exact decoder (`from_json`).
    """
    try:
        return orjson.dumps(value).decode()
    except orjson.JSONEncodeError:
        return EXACT_MARK + dumps(value)


_EXACT_MARKS = (EXACT_MARK, EXACT_MARK.encode())


def from_json(text: str | bytes) -> JsonValue:
    """Decode stored event data written by `to_json`."""
    if text[:1] in _EXACT_MARKS:
        return json.loads(text)
    return orjson.loads(text)


@functools.lru_cache(maxsize=256)
def _source_json(source: MessageSource) -> str:
    # A handful of distinct sources recur across a process (frozen, so hashable).
    text = dumps(source.model_dump())
    _check_unicode(text, "event source")
    return text


def stored_events(
    pending: list[PendingEvent], first_seq: int, created_at: datetime
) -> list[SessionEvent]:
    """The events as stored, built from what was written (no read back)."""
    if len(pending) == 1:  # the common case, without the comprehension's frame
        p = pending[0]
        return [session_event(first_seq, p.turn, p.kind, p.data, p.source, created_at)]
    return [
        session_event(first_seq + offset, p.turn, p.kind, p.data, p.source, created_at)
        for offset, p in enumerate(pending)
    ]


_NO_STAMP = object()
_EVENT_FIELDS = frozenset(SessionEvent.model_fields)
_new_object = object.__new__
# The slots pydantic keeps on every model, set through their descriptors: a bound
# `__set__` is called directly, where `object.__setattr__` would look the name up first.
_set_dict = BaseModel.__dict__["__dict__"].__set__
_set_fields_set = BaseModel.__dict__["__pydantic_fields_set__"].__set__
_set_extra = BaseModel.__dict__["__pydantic_extra__"].__set__
_set_private = BaseModel.__dict__["__pydantic_private__"].__set__

Model = TypeVar("Model", bound=BaseModel)


def construct(
    cls: type[Model], values: dict[str, Any], fields_set: AbstractSet[str] | None = None
) -> Model:
    """``cls.model_construct(**values)`` for values the store itself checked, with every
    field given in declaration order: the same object (a test holds them equal) at a
    quarter of the cost, which matters because `load` builds one per stored row.
    ``fields_set``: the fields not left at their default (all of ``values`` if None).
    """
    model = _new_object(cls)
    _set_dict(model, values)
    _set_fields_set(model, set(values if fields_set is None else fields_set))
    _set_extra(model, None)
    _set_private(model, None)
    return model


def session_event(
    seq: int,
    turn: int,
    kind: str,
    data: JsonValue,
    source: MessageSource | None,
    created_at: datetime,
) -> SessionEvent:
    """A `SessionEvent` from values the store itself checked, without validating again."""
    return construct(
        SessionEvent,
        {
            "seq": seq,
            "turn": turn,
            "kind": kind,
            "data": data,
            "source": source,
            "created_at": created_at,
        },
    )


_gc_lock = threading.Lock()
_gc_pausers = 0
_gc_was_enabled = False


@contextmanager
def gc_paused() -> Iterator[None]:
    """Pause the cyclic garbage collector while a transcript is decoded (opt-in:
    ``SqlStore(url, pause_gc_on_load=True)``; the collector is process-wide).

    A 10,000-event load allocates tens of thousands of acyclic containers; each few hundred
    would otherwise trigger a collection that scans them again (and now and then a full
    one over the whole process), about a sixth of the load's time. Nested and concurrent
    pauses share one count, so the collector is restored only when the last one ends, and
    only if it was enabled before the first.
    """
    global _gc_pausers, _gc_was_enabled
    with _gc_lock:
        if _gc_pausers == 0:
            _gc_was_enabled = gc.isenabled()
            gc.disable()
        _gc_pausers += 1
    try:
        yield
    finally:
        with _gc_lock:
            _gc_pausers -= 1
            if _gc_pausers == 0 and _gc_was_enabled:
                gc.enable()


_CHUNK_ROWS: Final = 64
"""Rows fetched at a time while decoding: freeing each chunk before the next one arrives
keeps the driver's row strings in the same, cache-warm memory, where one ``fetchall`` of
a long transcript would hold every row at once and then free them all. A segment row
holds a whole turn, so a few dozen rows are already hundreds of events."""


class RowCursor(Protocol):
    """What `decode_events` reads: a DBAPI cursor's ``fetchmany``."""

    def fetchmany(self, size: int = ..., /) -> Sequence[Any]: ...


class Transcript(list[SessionEvent]):
    """Decoded events, with what the decoder noted on its way through them.

    A resume needs the child's highest turn and its descriptor events. Found afterwards,
    each is a walk over every event, and right after a long load those are cold in the CPU
    cache: at 14,000 events the two walks took about a tenth as long as the load. The
    decoder sees each event while it is hot, so it notes both for a few nanoseconds each.
    """

    __slots__ = ("_descriptor_indexes", "_last_turn", "_length", "sealed_upto", "stored_bytes")

    def __init__(self) -> None:
        super().__init__()
        self._last_turn = 0
        self._descriptor_indexes: list[int] = []
        self._length = 0
        self.sealed_upto = 0
        """The last ``seq`` the decoder found in a sealed segment (0: none)."""
        self.stored_bytes = 0
        """The length of the stored JSON the events were decoded from (a sealed segment
        counted whole, even where only its later events were kept): what a cache of
        decoded transcripts weighs them by."""

    def joined(self, later: Transcript) -> Transcript:
        """These events then ``later``'s, with what was noted of both (a new transcript)."""
        joined = Transcript()
        joined.extend(self)
        joined.extend(later)
        joined._last_turn = max(self._last_turn, later._last_turn)
        joined._descriptor_indexes = self._descriptor_indexes + [
            len(self) + index for index in later._descriptor_indexes
        ]
        joined._length = len(joined)
        joined.sealed_upto = max(self.sealed_upto, later.sealed_upto)
        joined.stored_bytes = self.stored_bytes + later.stored_bytes
        return joined

    def copy(self) -> Transcript:
        """The same events in a list of their own, with what was noted of them."""
        return Transcript().joined(self)

    def noted(self) -> tuple[int, list[int]] | None:
        """The highest ``turn`` (0 for none, as `LoadedSession.last_turn` computes it) and
        the positions of the ``subagent/descriptor`` events, oldest first, as decoded; None
        once events were added or removed since."""
        if len(self) != self._length:
            return None
        return self._last_turn, self._descriptor_indexes


def decode_events(cursor: RowCursor, after: int = 0) -> Transcript:
    """The rows of ``seq, turn, kind, data, source, created_at`` left in ``cursor``, as
    events, read `_CHUNK_ROWS` at a time. A row whose ``turn`` is NULL is a sealed
    segment: ``data`` holds its events as one JSON array of rows of the same shape; its
    events up to ``seq`` ``after`` are left out (a later load's, which has them). The
    highest turn and the descriptors are noted on the way (`Transcript.noted`).

    The per-event work is decoding the data and what `construct` does, inlined:
    timestamps repeat within a batch and sources across a transcript, so each distinct
    value is decoded once. The events of one load share one fields-set: the models are
    frozen, so pydantic never changes it in place (``model_copy`` copies it first), and
    a set per event is an allocation the garbage collector would also have to scan.
    """
    # `from_json`, inlined with its callees bound: this loop runs once per stored event.
    loads, exact, fromisoformat = orjson.loads, json.loads, datetime.fromisoformat
    new, fields = _new_object, set(_EVENT_FIELDS)
    set_dict, set_fields_set, set_extra, set_private = (
        _set_dict,
        _set_fields_set,
        _set_extra,
        _set_private,
    )
    events = Transcript()
    add = events.append
    descriptor_kind, descriptors, last_turn = EventKind.DESCRIPTOR, events._descriptor_indexes, 0
    sources: dict[str, MessageSource] = {}
    last_stamp: object = _NO_STAMP
    created_at = datetime.min
    sealed_upto = stored_bytes = 0
    while rows := cursor.fetchmany(_CHUNK_ROWS):
        for row in rows:
            # A segment's events are decoded whole, data and all; an open row is a list of
            # one, its data still text.
            opened = row[1] is not None
            records: Sequence[Any]
            if opened:
                records = (row,)
            else:
                text = row[3]
                stored_bytes += len(text)
                records = exact(text) if text[:1] in _EXACT_MARKS else loads(text)
                if records:
                    sealed_upto = records[-1][0]
                    if row[0] <= after:
                        records = [record for record in records if record[0] > after]
            for seq, turn, kind, data, source_json, stamp in records:
                if opened:
                    stored_bytes += len(data)
                    data = exact(data) if data[:1] in _EXACT_MARKS else loads(data)
                if turn > last_turn:
                    last_turn = turn
                if kind == descriptor_kind:
                    descriptors.append(len(events))
                if stamp != last_stamp:
                    last_stamp = stamp
                    created_at = fromisoformat(stamp) if stamp.__class__ is str else utc_time(stamp)
                if source_json is None:
                    source = None
                else:
                    source = sources.get(source_json)
                    if source is None:
                        source = sources[source_json] = MessageSource.model_validate_json(
                            source_json
                        )
                event = new(SessionEvent)
                set_dict(
                    event,
                    {
                        "seq": seq,
                        "turn": turn,
                        "kind": kind,
                        "data": data,
                        "source": source,
                        "created_at": created_at,
                    },
                )
                set_fields_set(event, fields)
                set_extra(event, None)
                set_private(event, None)
                add(event)
    events._last_turn, events._length, events.sealed_upto = last_turn, len(events), sealed_upto
    events.stored_bytes = stored_bytes
    return events


MAX_INT: Final = 2**31 - 1
"""The largest turn, depth or seed length: the columns are 32-bit on PostgreSQL."""


def _check_int(value: int, what: str) -> None:
    if value > MAX_INT:
        raise _invalid(f"{what} is {value}, above the store's limit of {MAX_INT}")


def _check_text(value: str, what: str) -> None:
    # Both databases refuse these at write time, with driver-specific errors.
    if "\x00" in value:
        raise _invalid(f"{what} contains a NUL character, which the store cannot keep")
    if not value.isascii():
        _check_unicode(value, what)


def _check_unicode(value: str, what: str) -> None:
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise _invalid(f"{what} is not valid Unicode text ({exc.reason})") from exc


def _first_error(exc: ValidationError) -> str:
    error = exc.errors()[0]
    where = ".".join(str(part) for part in error["loc"]) or "value"
    return f"{where}: {error['msg']}"


def _invalid(message: str) -> SubagentControlError:
    return SubagentControlError(ErrorCode.INVALID_INPUT, message)
