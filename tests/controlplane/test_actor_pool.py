"""An actor whose loop runs on a reused worker thread behaves exactly as pykka's own.

Each pykka rule is checked on every kind of actor — one on a thread of its own, one on
the pool (`actors._pool`), one that holds a worker only while its mailbox has messages
(`actors._parking`) — with the same assertions: a ``BaseException`` stops every
actor, a stop answers what is queued behind it with `pykka.ActorDeadError`, a ``tell``
racing a stop is handled before it or dropped. Then what only the pool does: a freed worker
runs the next actor (with nothing of the last one left on it), a worker that a loop escaped
is never reused, idle workers are bounded and end, and none keeps the process alive.
"""

from __future__ import annotations

import contextvars
import gc
import subprocess
import sys
import textwrap
import threading
import weakref
from collections.abc import Iterator
from typing import Any

import pykka
import pytest

from actors._base import Actor
from actors._parking import ParkingActor
from actors._pool import LoopPool
from actors.activation import ActivationActor
from actors.root import RootActor
from actors.supervisor import ChildSupervisor
from tests.support import WAIT_S, eventually, run_python

_var: contextvars.ContextVar[str] = contextvars.ContextVar("test_actor_pool", default="unset")
_probes: dict[str, _Probe] = {}
"""Every probe of the running test by URN (an `ActorRef` holds its actor weakly)."""


@pytest.fixture(autouse=True)
def _forget_probes() -> Iterator[None]:
    yield
    _probes.clear()


class _Probe(Actor):
    """Records where and how it runs; ``gate`` holds a ``"wait"`` message."""

    use_daemon_thread = True

    def __init__(self, gate: threading.Event | None = None) -> None:
        super().__init__()
        self.gate = gate or threading.Event()
        self.entered = threading.Event()
        self.handled: list[str] = []
        self.thread: threading.Thread | None = None
        self.seen_var = ""
        self.stopped_with: list[str] = []
        _probes[self.actor_urn] = self

    def on_start(self) -> None:
        self.thread = threading.current_thread()
        self.seen_var = _var.get()
        _var.set(f"set by {self.actor_urn}")  # must not reach the next actor on this thread

    def on_receive(self, message: Any) -> Any:
        if message == "wait":
            self.entered.set()
            assert self.gate.wait(WAIT_S)
        elif message == "exit":
            raise SystemExit("a BaseException in a handler")
        elif message == "fail":
            raise ValueError("an Exception in a handler")
        self.handled.append(message)
        return message

    def on_stop(self) -> None:
        self.stopped_with = list(self.handled)


class _OwnThread(_Probe):
    pooled_loop = False


class _Pooled(_Probe):
    pooled_loop = True


class _PooledNonDaemon(_Probe):
    use_daemon_thread = False
    pooled_loop = True


class _Parking(ParkingActor, _Probe):
    """Holds a worker only while its mailbox has messages (`actors._parking`)."""


@pytest.fixture(
    params=[_OwnThread, _Pooled, _PooledNonDaemon, _Parking],
    ids=["own-thread", "pooled", "pooled-non-daemon", "parking"],
)
def kind(request: pytest.FixtureRequest) -> type[_Probe]:
    cls: type[_Probe] = request.param
    return cls


def _actor(ref: pykka.ActorRef[Any]) -> _Probe:
    return _probes[ref.actor_urn]


def _stopped(ref: pykka.ActorRef[Any]) -> bool:
    return ref.actor_stopped.wait(WAIT_S)


# -- pykka's rules, on both kinds ---------------------------------------------------------------


def test_a_base_exception_in_a_handler_stops_every_actor(kind: type[_Probe]) -> None:
    bystander = _OwnThread.start()
    other_kind = _Pooled.start()
    ref = kind.start()

    ref.tell("exit")

    assert _stopped(ref)
    assert _stopped(bystander)
    assert _stopped(other_kind)
    assert pykka.ActorRegistry.get_all() == []


def test_an_exception_in_an_ask_goes_to_the_asker_and_the_actor_lives_on(
    kind: type[_Probe],
) -> None:
    ref = kind.start()

    with pytest.raises(ValueError, match="an Exception in a handler"):
        ref.ask("fail", timeout=WAIT_S)

    assert ref.ask("after", timeout=WAIT_S) == "after"
    ref.stop(timeout=WAIT_S)


def test_a_stop_handles_what_came_before_it_and_fails_what_came_after(
    kind: type[_Probe],
) -> None:
    ref = kind.start()
    probe = _actor(ref)
    ref.tell("wait")
    assert probe.entered.wait(WAIT_S)
    before = ref.ask("before", block=False)
    stopping = ref.stop(block=False)
    after = ref.ask("after", block=False)

    probe.gate.set()

    assert before.get(timeout=WAIT_S) == "before"
    stopping.get(timeout=WAIT_S)
    with pytest.raises(pykka.ActorDeadError):
        after.get(timeout=WAIT_S)
    assert probe.stopped_with == ["wait", "before"]
    assert probe.handled == ["wait", "before"]


@pytest.mark.parametrize("round_", range(30))
def test_a_tell_racing_a_stop_is_handled_before_it_or_dropped(
    kind: type[_Probe], round_: int
) -> None:
    ref = kind.start()
    probe = _actor(ref)
    barrier = threading.Barrier(2)
    told: list[str] = []

    def tell() -> None:
        barrier.wait(WAIT_S)
        try:
            ref.tell("raced")
            told.append("queued")
        except pykka.ActorDeadError:
            told.append("refused")

    teller = threading.Thread(target=tell)
    teller.start()
    barrier.wait(WAIT_S)
    ref.stop(timeout=WAIT_S)
    teller.join(WAIT_S)

    assert told in (["queued"], ["refused"])
    # Never handled after the stop: on_stop saw everything the actor ever handled.
    assert probe.handled == probe.stopped_with
    assert probe.handled in ([], ["raced"])
    if told == ["refused"]:
        assert probe.handled == []


def test_an_exception_in_on_start_stops_the_actor(kind: type[_Probe]) -> None:
    class Failing(kind):  # type: ignore[valid-type, misc]
        def on_start(self) -> None:
            raise ValueError("on_start failed")

    ref = Failing.start()

    assert _stopped(ref)
    with pytest.raises(pykka.ActorDeadError):
        ref.tell("anything")


# -- what only the pool does --------------------------------------------------------------------


@pytest.fixture
def pool(monkeypatch: pytest.MonkeyPatch) -> Iterator[LoopPool]:
    """A pool of the test's own for pooled actors, starting with no worker."""
    own = LoopPool(max_idle=1, idle_s=WAIT_S)
    monkeypatch.setattr("actors._base.pool_for", lambda *, daemon: own)
    monkeypatch.setattr("actors._parking.pool_for", lambda *, daemon: own)
    yield own
    own.drain()


def test_a_worker_runs_the_next_actor_after_its_actor_stopped_with_nothing_of_it_left(
    pool: LoopPool,
) -> None:
    first = _Pooled.start()
    first_thread = _actor(first).thread
    first.stop(timeout=WAIT_S)
    assert pool.wait_idle(1, WAIT_S)

    second = _Pooled.start()

    probe = _actor(second)
    assert second.ask("hello", timeout=WAIT_S) == "hello"
    assert probe.thread is first_thread  # the same thread, not a new one
    assert probe.seen_var == "unset"  # a fresh context, as a new thread would have
    assert probe.thread is not None
    assert probe.thread.name.startswith("_Pooled-")
    assert probe.thread.daemon
    second.stop(timeout=WAIT_S)


def test_an_idle_worker_keeps_nothing_of_the_first_actor_it_ran(pool: LoopPool) -> None:
    # The worker's thread was started for its first actor: what the thread was started
    # with must not keep that actor (its plan, request, threads, inbox) alive while the
    # worker idles. Before, `Thread._args` held the first job, and with it the actor, for
    # as long as the worker lived.
    first = _Pooled.start()
    finished = weakref.ref(_probes.pop(first.actor_urn))
    first.stop(timeout=WAIT_S)
    del first  # an ActorRef may keep its actor (pykka 4.1 does): only the pool's hold counts
    assert pool.wait_idle(1, WAIT_S)
    gc.collect()
    assert finished() is None, gc.get_referrers(finished())


def test_a_worker_that_a_loop_escaped_dies_like_its_own_thread_and_is_not_reused(
    pool: LoopPool, monkeypatch: pytest.MonkeyPatch
) -> None:
    escaped: list[BaseException | None] = []
    reported = threading.Event()

    def hook(args: threading.ExceptHookArgs) -> None:
        escaped.append(args.exc_value)
        reported.set()

    monkeypatch.setattr(threading, "excepthook", hook)

    class Interrupted(_Pooled):
        def on_start(self) -> None:
            super().on_start()
            raise KeyboardInterrupt  # pykka catches only Exception around on_start

    ref = Interrupted.start()
    assert reported.wait(WAIT_S)
    thread = _actor(ref).thread
    assert thread is not None
    thread.join(WAIT_S)

    assert not thread.is_alive()
    assert len(escaped) == 1
    assert isinstance(escaped[0], KeyboardInterrupt)
    assert pool.idle() == 0
    # pykka leaves such an actor registered and "alive" on its own thread too.
    ref.actor_stopped.set()
    pykka.ActorRegistry.unregister(ref)


def test_a_pooled_actor_runs_on_a_worker_that_is_a_daemon_thread_as_it_asks() -> None:
    assert ActivationActor.pooled_loop
    assert ActivationActor.use_daemon_thread
    # A cold resume starts a supervisor first; daemon too, so a script that never calls
    # close() still exits (the close at exit stops it in order).
    assert ChildSupervisor.pooled_loop
    assert ChildSupervisor.use_daemon_thread
    assert RootActor.use_daemon_thread
    daemon, non_daemon = _Pooled.start(), _PooledNonDaemon.start()

    assert daemon.ask("x", timeout=WAIT_S) == "x"
    assert non_daemon.ask("x", timeout=WAIT_S) == "x"
    daemon_thread, non_daemon_thread = _actor(daemon).thread, _actor(non_daemon).thread
    assert daemon_thread is not None
    assert daemon_thread.daemon
    assert non_daemon_thread is not None
    assert not non_daemon_thread.daemon
    daemon.stop(timeout=WAIT_S)
    non_daemon.stop(timeout=WAIT_S)


def _gated_jobs(pool: LoopPool, count: int) -> tuple[threading.Event, list[threading.Thread]]:
    gate = threading.Event()
    threads: list[threading.Thread] = []
    running = threading.Barrier(count + 1)

    def job() -> None:
        threads.append(threading.current_thread())
        running.wait(WAIT_S)
        assert gate.wait(WAIT_S)

    for _ in range(count):
        pool.run(job, "job")
    running.wait(WAIT_S)
    return gate, threads


def test_workers_freed_beyond_max_idle_end() -> None:
    pool = LoopPool(max_idle=1, idle_s=WAIT_S)
    gate, threads = _gated_jobs(pool, 3)

    gate.set()
    assert pool.wait_idle(1, WAIT_S)
    eventually(lambda: sum(t.is_alive() for t in threads) == 1, "two of three workers ended")

    assert len(set(threads)) == 3
    assert pool.idle() == 1
    pool.drain()


def test_an_idle_worker_ends_after_idle_s_and_drain_ends_the_rest() -> None:
    pool = LoopPool(max_idle=4, idle_s=0.01)
    gate, (short_lived,) = _gated_jobs(pool, 1)
    gate.set()
    short_lived.join(WAIT_S)
    assert not short_lived.is_alive()
    assert pool.idle() == 0

    waiting = LoopPool(max_idle=4, idle_s=WAIT_S)
    gate, threads = _gated_jobs(waiting, 2)
    gate.set()
    assert waiting.wait_idle(2, WAIT_S)
    waiting.drain()
    for thread in threads:
        thread.join(WAIT_S)
        assert not thread.is_alive()
    assert waiting.idle() == 0


def test_a_job_handed_over_as_a_worker_gives_up_waiting_still_runs() -> None:
    # Many rounds with a worker whose wait is about to run out: the hand-over and the
    # give-up race, and every job must still run exactly once.
    pool = LoopPool(max_idle=2, idle_s=0.0005)
    for _ in range(300):
        done = threading.Event()
        pool.run(done.set, "job")
        assert done.wait(WAIT_S)
    pool.drain()


def test_a_reused_worker_starts_each_loop_with_the_threading_hooks() -> None:
    pool = LoopPool(max_idle=1, idle_s=WAIT_S)
    seen: list[object] = []
    ran = threading.Semaphore(0)

    def job() -> None:
        seen.append(sys.getprofile())
        sys.setprofile(None)  # the hook below does nothing, but need not run on
        ran.release()

    pool.run(job, "job")
    assert ran.acquire(timeout=WAIT_S)
    assert pool.wait_idle(1, WAIT_S)

    def hook(*_args: Any) -> None:
        return None

    threading.setprofile(hook)
    try:
        pool.run(job, "job")
        assert ran.acquire(timeout=WAIT_S)
    finally:
        threading.setprofile(None)  # type: ignore[arg-type, unused-ignore]
    pool.drain()

    assert seen == [None, hook]


_EXIT_PRELUDE = """
    import threading
    from typing import Any
    from actors._base import Actor
    from actors._pool import non_daemon_actor_threads

    class Lasting(Actor):
        pooled_loop = True
        use_daemon_thread = False  # as pykka's actors are by default (ours are daemon)

        def on_receive(self, message: Any) -> Any:
            return message
"""


def _exit_of(scenario: str) -> subprocess.CompletedProcess[str]:
    # Well under the 30 s an idle worker would otherwise wait before it ends by itself.
    code = textwrap.dedent(_EXIT_PRELUDE) + textwrap.dedent(scenario)
    return run_python("-c", code, timeout=20.0)


def test_an_idle_non_daemon_worker_does_not_keep_the_process_alive() -> None:
    scenario = """
        ref = Lasting.start()
        assert ref.ask("x", timeout=10.0) == "x"
        ref.stop(timeout=10.0)
        assert non_daemon_actor_threads.wait_idle(1, 10.0)
        print("main ends with an idle non-daemon worker")
    """
    done = _exit_of(scenario)

    assert done.returncode == 0, done.stdout + done.stderr
    assert "main ends with an idle non-daemon worker" in done.stdout


def test_a_running_non_daemon_pooled_actor_keeps_the_process_alive_until_stopped() -> None:
    # pykka's rule for a non-daemon actor: the interpreter waits for it at exit. A watcher
    # sees the main thread end while the actor still runs, then stops it; only then does
    # the process exit.
    scenario = """
        ref = Lasting.start()
        assert ref.ask("x", timeout=10.0) == "x"

        def watch() -> None:
            threading.main_thread().join()
            print("after main: actor alive =", ref.is_alive(), flush=True)
            ref.stop(timeout=10.0)

        threading.Thread(target=watch, daemon=True).start()
    """
    done = _exit_of(scenario)

    assert done.returncode == 0, done.stdout + done.stderr
    assert "after main: actor alive = True" in done.stdout


def test_the_process_exits_after_close_with_no_non_daemon_thread_left() -> None:
    # Activations ran on pooled daemon workers, which still wait for work after close(); a
    # pooled non-daemon actor's idle worker ends as the interpreter exits. Nothing is left
    # that keeps the process alive, so it exits at once (the 30 s an idle worker would
    # otherwise wait is beyond the timeout).
    scenario = """
        import tempfile
        from actors._pool import actor_threads
        from controlplane import ContinuableStartSpec, SubagentControl, TextBlock
        from tests.fakes import FakeProvider

        control = SubagentControl.open(f"sqlite:///{tempfile.mkdtemp()}/state.db")
        control.providers.register(FakeProvider())
        parent = control.agents.register("parent-1")
        spec = ContinuableStartSpec(
            provider="fake", label="x", prompt=[TextBlock(text="go")], parent=parent
        )
        started = control.start_continuable(spec)
        control.tasks.wait(started.task_id, timeout=10.0, requester=parent)
        for n in range(3):
            sent = control.send_message(parent, started.child_id, [TextBlock(text=str(n))])
            control.tasks.wait(sent.task_id, timeout=10.0, requester=parent)
        control.close()
        assert actor_threads.wait_idle(1, 10.0), "no worker was kept"
        print("closed; workers waiting:", actor_threads.idle(), flush=True)
    """
    done = run_python("-c", textwrap.dedent(scenario), timeout=20.0)

    assert done.returncode == 0, done.stdout + done.stderr
    assert "closed; workers waiting:" in done.stdout
