"""``--profile``: cProfile reports of the two hot paths, across all the threads they cross."""

from __future__ import annotations

from pathlib import Path

from benchmarks._harness import PARENT_SESSION, seed_child, sqlite_url
from benchmarks._profile import profile_threads
from benchmarks._provider import PROVIDER_NAME, BenchProvider
from controlplane import ContinuableStartSpec, MessageSource, SubagentControl, TextBlock
from persistence import SqlStore

__all__ = ["profile_hot_paths"]

_MESSAGE = [TextBlock(text="Also check the migration for the events table; keep seq gapless.")]
_STEERS = 2000
_RESUMES = 5
_LENGTH = 10_000


def profile_hot_paths(workdir: Path) -> str:
    """Profile steers into one running child, then cold resumes of a long child."""
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
    return (
        f"== {_STEERS} steers into one running child (all threads, by own time) ==\n"
        f"{reports[0]}\n"
        f"== {_RESUMES} cold resumes of a {_LENGTH:,}-message child (all threads, "
        f"cumulative) ==\n{reports[1]}"
    )
