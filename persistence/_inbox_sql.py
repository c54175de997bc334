"""The statements of the forwarding inbox (`inbox_table`), compiled for PostgreSQL (the
inbox is PostgreSQL's only) and run on the raw cursor by `persistence._inbox`.

A post's or a forget's RETURNING turns the WAL flush off for its own transaction (see
`persistence._inbox`). No write notifies: a write returns whom to wake, and the wake-up
(`InboxStatements.notify`, `InboxStatements.wake`) is a statement of its own, sent once
the write has committed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

from sqlalchemy import (
    ARRAY,
    Text,
    bindparam,
    exists,
    func,
    literal_column,
    or_,
    select,
    true,
    update,
)
from sqlalchemy import cast as sql_cast

from persistence._children_sql import EVENT_INSERT, EVENT_NAMES
from persistence._dialect import SqlDialect, constant, params
from persistence._runtime_sql import runtime_table
from persistence._schema import inbox_table as _inbox_table

__all__ = ["CHANNEL_HEX", "CHANNEL_PREFIX", "InboxStatements", "inbox_table"]

inbox_table: Final = _inbox_table

CHANNEL_PREFIX: Final = "subagent_"
CHANNEL_HEX: Final = 40
_ROW: Final = (
    "inbox_id", "kind", "child_id", "target_runtime", "sender_runtime", "parent_session",
    "message", "source",
)  # fmt: skip
_STEERED: Final = ("reply", "inbox_id")


@dataclass(frozen=True, slots=True)
class InboxStatements:
    """The inbox's statements, compiled for PostgreSQL."""

    notify: str
    """Notify a channel (takes channel, payload): writes nothing, no flush to wait for."""
    wake: str
    """Notify many channels in one statement (takes the channels and their payloads, as
    two lists): the wake-ups of answers, sent once their write has committed."""
    post: str
    """Write a ``pending`` row (RETURNING a row when written: notify its target then)."""
    take_carried: str
    take_carried_again: str
    """A retry of `take_carried`: our first attempt may have committed unheard."""
    take_back: str
    take: str
    answer: str
    """A retry finds its own answer there: the same reply, answered again (RETURNING the
    sender runtime to wake)."""
    answer_steered: str
    """Inside the steering record's transaction, which waits for its flush (RETURNING the
    sender runtime to wake)."""
    inserting: str
    """One event's INSERT with `answer_steered` run in the same statement, first (takes
    the answer's parameters, then the event's): a data-modifying WITH runs to
    completion once, whatever reads it; the RETURNING names the sender it answered."""
    abandon: str
    state: str
    forget: str
    forget_decided: str
    """`forget`, keeping the rows their senders gave up (``abandoned``)."""
    expire: str
    """A sender (or target) gone: named dead for good, or no longer in the store."""

    @classmethod
    def build(cls, dialect: SqlDialect) -> InboxStatements:
        compile_ = dialect.compile
        i = inbox_table.c
        by_id = i.inbox_id == bindparam("inbox_id")
        no_flush = func.set_config(constant("synchronous_commit"), constant("off"), true())
        item = (i.kind, i.child_id, i.sender_runtime, i.parent_session, i.message, i.source)

        def row(state: str) -> Any:
            return dialect.insert(inbox_table).values(
                **params(*_ROW), state=constant(state), created_at=func.now()
            )

        taken, abandoned = row("taken"), row("abandoned")
        answered = (
            update(inbox_table)
            .values(state=constant("answered"), **params("reply"))
            .where(by_id, i.state == constant("taken"))
            .returning(i.sender_runtime)
        )
        answered_cte = answered.cte("answered")
        gone_sender = ~exists().where(runtime_table.c.runtime_id == i.sender_runtime)
        gone_target = ~exists().where(runtime_table.c.runtime_id == i.target_runtime)
        wakeups = (
            func.unnest(
                sql_cast(bindparam("channels"), ARRAY(Text)),
                sql_cast(bindparam("payloads"), ARRAY(Text)),
            )
            .table_valued("c", "p")
            .render_derived(name="w")
        )
        by_ids = i.inbox_id == func.any(bindparam("ids"))
        return cls(
            notify=compile_(
                select(dialect.notify(bindparam("channel"), bindparam("payload"))),
                "channel",
                "payload",
            ),
            wake=compile_(
                select(dialect.notify(wakeups.c.c, wakeups.c.p)).select_from(wakeups),
                "channels",
                "payloads",
            ),
            post=compile_(row("pending").on_conflict_do_nothing().returning(no_flush), *_ROW),
            take_carried=compile_(
                taken.on_conflict_do_nothing(index_elements=[i.inbox_id]).returning(*item), *_ROW
            ),
            take_carried_again=compile_(
                taken.on_conflict_do_update(
                    index_elements=[i.inbox_id],
                    set_={"state": constant("taken")},
                    where=(i.state == constant("taken"))
                    & (i.target_runtime == taken.excluded.target_runtime),
                ).returning(*item),
                *_ROW,
            ),
            take_back=compile_(
                abandoned.on_conflict_do_update(
                    index_elements=[i.inbox_id],
                    set_={"state": constant("abandoned")},
                    where=i.state.in_([constant("pending"), constant("abandoned")]),
                ).returning(literal_column("1")),
                *_ROW,
            ),
            take=compile_(
                update(inbox_table)
                .values(state=constant("taken"))
                .where(
                    by_id,
                    i.target_runtime == bindparam("target"),
                    i.state.in_([bindparam("state_a"), bindparam("state_b")]),
                )
                .returning(*item),
                "inbox_id",
                "target",
                "state_a",
                "state_b",
            ),
            answer=compile_(
                update(inbox_table)
                .values(state=constant("answered"), **params("reply"))
                .where(
                    by_id,
                    or_(
                        i.state == constant("taken"),
                        (i.state == constant("answered")) & (i.reply == bindparam("same_reply")),
                    ),
                )
                .returning(i.sender_runtime),
                "reply",
                "inbox_id",
                "same_reply",
            ),
            answer_steered=compile_(answered, *_STEERED),
            inserting=compile_(
                EVENT_INSERT.add_cte(answered_cte).returning(
                    select(answered_cte.c.sender_runtime).scalar_subquery()
                ),
                *_STEERED,
                *EVENT_NAMES,
            ),
            abandon=compile_(
                update(inbox_table)
                .values(state=constant("abandoned"))
                .where(by_id, i.state.in_([bindparam("state"), constant("abandoned")])),
                "inbox_id",
                "state",
            ),
            state=compile_(select(i.state, i.reply).where(by_id), "inbox_id"),
            forget=compile_(inbox_table.delete().where(by_ids).returning(no_flush), "ids"),
            forget_decided=compile_(
                inbox_table.delete()
                .where(by_ids, i.state != constant("abandoned"))
                .returning(no_flush),
                "ids",
            ),
            expire=compile_(
                inbox_table.delete().where(
                    or_(i.sender_runtime == func.any(bindparam("senders")), gone_sender),
                    or_(
                        i.state != constant("abandoned"),
                        i.target_runtime == func.any(bindparam("targets")),
                        gone_target,
                    ),
                ),
                "senders",
                "targets",
            ),
        )
