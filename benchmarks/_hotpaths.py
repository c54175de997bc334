"""``--profile``: cProfile reports of the hot paths, across all the threads they cross."""

from __future__ import annotations

from pathlib import Path

from benchmarks._harness import PARENT_SESSION, seed_child, sqlite_url
from benchmarks._profile import profile_threads
from benchmarks._provider import PROVIDER_NAME, BenchProvider
from benchmarks._routes import Plane
from benchmarks._task_rows import fill_settled_tasks
from controlplane import ContinuableStartSpec, MessageSource, SubagentControl, TextBlock
from persistence import SqlStore

__all__ = ["profile_hot_paths"]

_MESSAGE = [TextBlock(text="Also check the migration for the events table; keep seq gapless.")]
_STEERS = 2000
_RESUMES = 5
_LENGTH = 10_000
_WARM_RESUMES = 300
_STORED_TASKS = 100_000
_GETS = 2000
_OURS = r"persistence|controlplane/_tasks|actors/(supervisor|activation|_transcript)"


def profile_hot_paths(workdir: Path) -> str:
    """Profile steers into one running child, cold resumes of a long child, warm resumes
    of a short one, and `tasks.get` of Tasks only the store holds."""
    reports: list[str] = []
    url = sqlite_url(workdir / "profile-steer.db")
    source = MessageSource(kind="coordinator", sender_session_id=PARENT_SESSION)
    with profile_threads(reports):
        control = SubagentControl.open(url)
        provider = BenchProvider()
        control.providers.register(provider)
        parent = control.agents.register(PARENT_SESSION)
        spec = ContinuableStartSpec(
            provider=PROVIDER_NAME, label="bench", prompt=_MESSAGE, parent=parent
        )
        child_id = control.start_continuable(spec).child_id
        for _ in range(_STEERS):
            control.send_message(parent, child_id, _MESSAGE, source)
        provider.release_all()
        control.close()
    url = sqlite_url(workdir / "profile-resume.db")
    store = SqlStore(url)
    child_id = seed_child(store, _LENGTH)
    store.close()
    with profile_threads(reports, sort="cumtime"):
        for _ in range(_RESUMES):
            control = SubagentControl.open(url)
            provider = BenchProvider()
            control.providers.register(provider)
            parent = control.agents.register(PARENT_SESSION)
            result = control.send_message(parent, child_id, _MESSAGE)
            _called, run, _request = provider.wait_resumed(child_id)
            run.release()
            control.tasks.wait(result.task_id, timeout=60.0, requester=parent)
            control.close()
    _profile_tasks(workdir, reports)
    return (
        f"== {_STEERS} steers into one running child (all threads, by own time) ==\n"
        f"{reports[0]}\n"
        f"== {_RESUMES} cold resumes of a {_LENGTH:,}-message child (all threads, "
        f"cumulative) ==\n{reports[1]}\n"
        f"== {_WARM_RESUMES} resumes of an idle 10-message child, each Task admitted and "
        f"settled; open to close (all threads, cumulative, the store's and the Task "
        f"service's functions only) ==\n{reports[2]}\n"
        f"== {_GETS} tasks.get of Tasks only the store holds ({_STORED_TASKS:,} settled "
        f"Tasks; cumulative) ==\n{reports[3]}"
    )


def _profile_tasks(workdir: Path, reports: list[str]) -> None:
    """The two Task paths of `benchmarks.tasks`: the resume route, and a stored read."""
    # Open to close: the supervisor's thread, which admits each Task, starts inside. Only
    # the store's and the Task service's own functions: thread waits would fill the top.
    with profile_threads(reports, sort="cumtime", only=_OURS):
        plane = Plane.open(sqlite_url(workdir / "profile-route.db"))
        try:
            store = plane.control.store
            assert store is not None
            child_id = seed_child(store, 10)
            for _ in range(_WARM_RESUMES):
                plane.resume(child_id)
        finally:
            plane.close()
    stored = fill_settled_tasks(workdir / "profile-tasks.db", _STORED_TASKS)
    control = SubagentControl.open(stored.url)
    try:
        picks = stored.sample
        with profile_threads(reports, sort="cumtime"):
            for i in range(_GETS):
                task_id, owner = picks[i % len(picks)]
                control.tasks.get(task_id, requester=owner)
    finally:
        control.close()
