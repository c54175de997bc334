"""Screenshots of the console for the docs: ``docs/console-overview.png`` and
``docs/console-child.png``.

Usage::

    .venv/bin/python -m benchmarks.console_screens

Runs real children in this process on a scratch SQLite store (one waiting on an approval,
one working, a few completed, one resumed by a message), serves the console, and has
Chromium (Playwright) take the pictures.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from controlplane import (
    ChildTool,
    ContinuableStartSpec,
    InProcessProvider,
    MessageSource,
    ScriptedModel,
    SubagentControl,
    TaskStatus,
    TextBlock,
    Usage,
)
from controlplane.fronts._console import ConsoleServer
from controlplane.models import ModelReply, ToolCall

DOCS = Path(__file__).resolve().parents[1] / "docs"


def _reply(text: str, tokens: int, calls: Sequence[ToolCall] = ()) -> ModelReply:
    usage = Usage(input_tokens=tokens, output_tokens=tokens // 4, model_calls=1)
    return ModelReply(text=text, tool_calls=list(calls), usage=usage)


def _stage(control: SubagentControl) -> str:
    """Start the children; the id of the one waiting on an approval."""

    def deploy(arguments: dict[str, Any]) -> str:
        return f"deployed {arguments['service']} to {arguments['env']}"

    def wait(arguments: dict[str, Any], signal: Any) -> str:
        signal.wait(600)
        return "waited"

    schema = {"type": "object", "properties": {"service": {}, "env": {}}}
    deploy_call = ToolCall(id="c1", name="deploy",
                           arguments={"service": "payments-api", "env": "prod"})  # fmt: skip
    shipper = ScriptedModel([
        _reply("Tests pass on main; deploying payments-api to prod.", 1800, [deploy_call]),
        _reply("Deployed; error rate flat after 5 minutes.", 900),
    ])  # fmt: skip
    control.providers.register(InProcessProvider(
        shipper, name="shipper",
        tools=[ChildTool("deploy", "Deploy a service.", schema, deploy, approval="always")],
    ))  # fmt: skip
    scanner = ScriptedModel([_reply("", 2400, [ToolCall(id="w1", name="scan", arguments={})])])
    control.providers.register(InProcessProvider(
        scanner, name="scanner", tools=[ChildTool("scan", "Scan.", {"type": "object"}, wait)]
    ))  # fmt: skip
    writer = ScriptedModel([
        _reply("Summary: the outage began at 09:12 when the cache evicted hot keys.", 3100),
        _reply("Three vendors renew in Q1; two have price increases over 8%.", 5200),
        _reply("Added the timeline you asked for.", 1400),
        _reply("Drafted release notes for 2.4 (12 changes).", 2600),
    ])  # fmt: skip
    control.providers.register(InProcessProvider(writer, name="writer"))
    lead = control.agents.register("lead-agent")
    ops = control.agents.register("ops-agent")

    def start(parent: Any, provider: str, label: str) -> Any:
        return control.start_continuable(ContinuableStartSpec(
            provider=provider, label=label, parent=parent, prompt=[TextBlock(text=label)]
        ))  # fmt: skip

    incident = start(lead, "writer", "summarise incident 4182")
    control.tasks.wait(incident.task_id, timeout=30, requester=lead)
    vendors = start(lead, "writer", "review vendor contracts")
    control.tasks.wait(vendors.task_id, timeout=30, requester=lead)
    more = control.send_message(lead, incident.child_id, [TextBlock(text="add a timeline")],
                                MessageSource(kind="human", sender_session_id="dana"))  # fmt: skip
    control.tasks.wait(more.task_id, timeout=30, requester=lead)
    notes = start(lead, "writer", "draft release notes 2.4")
    control.tasks.wait(notes.task_id, timeout=30, requester=lead)
    start(ops, "scanner", "scan dependencies for CVEs")
    ship = start(ops, "shipper", "ship payments-api")
    waiting = control.tasks.wait(ship.task_id, timeout=30, requester=ops)
    assert waiting.status is TaskStatus.INPUT_REQUIRED, waiting
    return str(ship.child_id)


def main() -> int:
    from playwright.sync_api import sync_playwright

    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        print("install chromium first (apt-get install -y chromium)", file=sys.stderr)
        return 2
    scratch = Path(tempfile.mkdtemp(prefix="console-screens-"))
    try:
        control = SubagentControl.open(f"sqlite:///{scratch}/state.db", approval_grace_s=600)
        try:
            waiting = _stage(control)
            with ConsoleServer(control) as console, sync_playwright() as playwright:
                browser = playwright.chromium.launch(executable_path=chromium,
                                                     args=["--no-sandbox"])  # fmt: skip
                page = browser.new_page(viewport={"width": 1200, "height": 820})
                page.goto(console.url)
                page.wait_for_selector("#live.on")
                page.screenshot(path=str(DOCS / "console-overview.png"), full_page=True)
                page.goto(f"{console.url}children/{waiting}")
                page.wait_for_selector("#live.on")
                page.get_by_label("Note").fill("ok after the 14:00 freeze lifts")
                page.screenshot(path=str(DOCS / "console-child.png"), full_page=True)
                browser.close()
        finally:
            control.close(timeout_s=10.0)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    print(f"wrote {DOCS / 'console-overview.png'} and {DOCS / 'console-child.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
