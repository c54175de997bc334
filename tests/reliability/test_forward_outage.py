"""SPEC §9 "Outages": a send whose outcome the store could not confirm never reports a
failure for a message that was delivered.

A forwarded send's sender (this process) polls for the holder's answer while a private
PostgreSQL server (`pg_fault.PostgresServer`) is crashed and started again; the holder is
another OS process (``slow_holder.py``) whose run takes the message only once the server
is down, so its steering record and answer commit after the restart. The sender's retry
budget is shorter than the outage: its reads fail while it waits. Before, the send raised
``STORE_UNAVAILABLE`` although the holder had the message and its record was in the
transcript; a caller that retried duplicated it.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from controlplane import ErrorCode, SubagentControl, SubagentControlError
from persistence import RetryPolicy
from tests.reliability.pg_fault import PostgresServer, TcpProxy
from tests.reliability.processes import LinesProcess, Reaper, reaping
from tests.support import WAIT_S, eventually, in_thread, inbound, text

pytestmark = [pytest.mark.postgres, pytest.mark.slow]

HOLDER = Path(__file__).with_name("slow_holder.py")
PARENT = "outage-parent"
OUTAGE_S = 1.5
SENDER_BUDGET_S = 1.0
"""Shorter than the outage: the sender's reads fail while it waits for the answer."""

reaped = pytest.fixture(reaping, name="reaped")


def holder_of_a_child(
    pg_server: PostgresServer, reaped: Reaper, *args: str
) -> tuple[str, LinesProcess, dict[str, str]]:
    """A fresh database's URL, and a holder process running one child there (``READY``)."""
    url = pg_server.new_database()
    holder = reaped.add(LinesProcess(HOLDER, url, *args, name="holder"))
    return url, holder, json.loads(holder.expect("READY "))


def test_a_forwarded_steer_answered_across_a_server_restart_is_steered_not_a_store_failure(
    pg_server: PostgresServer, reaped: Reaper
) -> None:
    url, holder, ready = holder_of_a_child(pg_server, reaped)
    child_id = ready["child_id"]
    policy = RetryPolicy(max_total_s=SENDER_BUDGET_S)
    with SubagentControl.open(url, retry=policy) as control:
        parent = control.agents.register(PARENT)
        sending = in_thread(
            lambda: control.send_message(parent, child_id, text("through the restart"))
        )
        holder.expect("STEERING")  # taken: the holder's run is about to take it
        pg_server.crash()
        holder.say("go")  # its steering record and answer wait for the server
        time.sleep(OUTAGE_S)  # the outage itself, not a synchronisation
        pg_server.start()

        result = sending.result(timeout=WAIT_S)

        assert (result.route, result.task_id) == ("steered", ready["task_id"])
        assert control.store is not None
        stored = control.store.load(child_id).events
        assert len(inbound(stored, "through the restart")) == 1


def test_a_forwarded_steer_whose_outcome_the_store_cannot_confirm_in_time_is_durability_failed(
    pg_server: PostgresServer, reaped: Reaper
) -> None:
    # The server stays down past the sender's bound (TAKE_S plus its retry budget): it
    # cannot know whether the holder took the message, so it never says it did not.
    url, holder, ready = holder_of_a_child(pg_server, reaped)
    child_id = ready["child_id"]
    with SubagentControl.open(url, retry=RetryPolicy(max_total_s=0.3)) as control:
        parent = control.agents.register(PARENT)
        sending = in_thread(lambda: control.send_message(parent, child_id, text("unconfirmed")))
        holder.expect("STEERING")
        pg_server.crash()
        holder.say("go")  # the run has it; its record waits for the server

        with pytest.raises(SubagentControlError) as unconfirmed:
            sending.result(timeout=WAIT_S)

        assert unconfirmed.value.code is ErrorCode.DURABILITY_FAILED, unconfirmed.value
        assert "transcript" in unconfirmed.value.message
        pg_server.start()
        store = control.store
        assert store is not None
        eventually(  # the holder rides through: its record lands once the server is back
            lambda: len(inbound(store.load(child_id).events, "unconfirmed")) == 1,
            "the holder's steering record is in the transcript",
        )


def test_a_holder_answers_its_refusal_once_the_server_is_back_however_short_its_budget(
    pg_server: PostgresServer, reaped: Reaper
) -> None:
    # The holder's budget is shorter than the outage: its answer fails, and it must answer
    # all the same, or the sender waits for it as long as the holder lives.
    url, holder, ready = holder_of_a_child(pg_server, reaped, "0.3", "refuse")
    with SubagentControl.open(url) as control:
        parent = control.agents.register(PARENT)
        sending = in_thread(lambda: control.send_message(parent, ready["child_id"], text("no")))
        holder.expect("STEERING")
        pg_server.crash()
        holder.say("go")  # refused: the answer waits for the server
        time.sleep(OUTAGE_S)  # the outage itself, not a synchronisation
        pg_server.start()

        with pytest.raises(SubagentControlError) as refused:
            sending.result(timeout=WAIT_S)

        assert refused.value.code is ErrorCode.NOT_DELIVERED, refused.value
        assert "refused it" in refused.value.message


def test_a_forwarded_steer_posted_while_the_holder_listens_again_is_delivered_not_refused(
    pg_server: PostgresServer, reaped: Reaper, tcp_proxy_factory: Callable[[int], TcpProxy]
) -> None:
    # The holder's connections go through a proxy that resets them: its listener is
    # between two connections (it listens again after a pause) when the message is
    # posted, so the notification is lost. Before, the sender took it back after TAKE_S:
    # NOT_DELIVERED, a steer failed by a blip shorter than any retry budget.
    proxy = tcp_proxy_factory(pg_server.port)
    url = pg_server.new_database()
    holder = reaped.add(LinesProcess(HOLDER, proxy.url(url), name="holder"))
    ready = json.loads(holder.expect("READY "))
    holder.say("go")  # its run takes every message at once
    with SubagentControl.open(url) as control:
        parent = control.agents.register(PARENT)
        proxy.reset()

        result = control.send_message(parent, ready["child_id"], text("after the blip"))

        assert (result.route, result.task_id) == ("steered", ready["task_id"])
        assert control.store is not None
        stored = control.store.load(ready["child_id"]).events
        assert len(inbound(stored, "after the blip")) == 1
