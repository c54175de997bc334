"""The console's pages as HTML: pure functions of the views, no I/O.

Every piece of text from the store (labels, messages, tool arguments and results, notes,
ids) goes through `_e` (HTML-escaped, quotes too), so a transcript holding markup shows it
as text; the page has no inline script or style (the Content-Security-Policy forbids
both), only ``/static/console.js`` and ``/static/console.css``. A page is a frame and
named regions (``id="region-…"``); the page's event stream sends a region again, whole,
when it changed.
"""

from __future__ import annotations

import html
import json
from collections.abc import Iterable
from datetime import datetime
from typing import Any, Final

from controlplane.contract import EventKind, MessageSource, SessionEvent, TaskSnapshot, utcnow
from controlplane.fronts._console_views import (
    GROUP_TITLES,
    ChildPage,
    ChildRowView,
    Overview,
    RuntimesPage,
    TurnUsage,
    recovery_note,
)

__all__ = [
    "child_regions",
    "overview_regions",
    "page",
    "runtimes_regions",
    "tokens_chart",
]

_TEXT_CLIP: Final = 20_000
"""The longest text an event shows in full on the page (the rest is under /api/)."""


def _e(value: object) -> str:
    return html.escape(str(value), quote=True)


def page(
    *, title: str, csrf: str, stream: str, regions: dict[str, str], body: str, nav: str
) -> str:
    """A whole page: the frame, ``body`` with its regions filled in, the stream to follow."""
    filled = body
    for name, content in regions.items():
        filled = filled.replace(f"<!--{name}-->", content)
    links = "".join(
        f'<a href="{href}"{" aria-current=page" if href == nav else ""}>{_e(text)}</a>'
        for href, text in (("/", "Overview"), ("/runtimes", "Runtimes and queues"))
    )
    return (
        "<!doctype html><html lang=en><head><meta charset=utf-8>"
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f'<meta name="csrf-token" content="{_e(csrf)}">'
        f"<title>{_e(title)} · subagent-control</title>"
        '<link rel="stylesheet" href="/static/console.css">'
        '<script src="/static/console.js" defer></script>'
        f'</head><body data-stream="{_e(stream)}">'
        f"<header><strong>subagent-control</strong><nav>{links}</nav>"
        '<span id="live" class="live">connecting…</span></header>'
        f'<main>{filled}<p id="flash" role="status" aria-live="polite"></p></main>'
        "</body></html>"
    )


# -- the overview -----------------------------------------------------------------------


OVERVIEW_BODY: Final = (
    "<h1>Children</h1>"
    '<p><label for="filter">Filter</label> '
    '<input id="filter" type="search" placeholder="label, status, provider or id" '
    'autocomplete="off">'
    "</p>"
    '<div id="region-groups"><!--region-groups--></div>'
    "<h2>Sessions, children and grandchildren</h2>"
    '<div id="region-tree"><!--region-tree--></div>'
)


def overview_regions(view: Overview) -> dict[str, str]:
    """The overview's regions: the three groups, and the tree."""
    now = utcnow()
    groups = []
    for name, title in GROUP_TITLES.items():
        rows = view.group(name)
        table = (
            _table(
                ("Label", "Status", "Age", "Provider:model", "Tokens", "Cost", "Child"),
                (_child_cells(row, now) for row in rows),
                row_class="child",
            )
            if rows
            else '<p class="empty">none</p>'
        )
        groups.append(
            f'<section class="group group-{name}" data-group="{name}">'
            f"<h2>{_e(title)} <span class=count>{len(rows)}</span></h2>{table}</section>"
        )
    tree = "".join(
        f"<li><span class=session>session {_e(root)}</span>{_subtree(view, root, now, 0)}</li>"
        for root in view.roots
    )
    return {
        "region-groups": "".join(groups),
        "region-tree": f'<ul class="tree">{tree}</ul>' if tree else '<p class="empty">none</p>',
    }


def _child_cells(row: ChildRowView, now: datetime) -> tuple[str, ...]:
    label = row.meta.label or "(no label)"
    return (
        f'<a href="/children/{_e(row.meta.child_id)}">{_e(label)}</a>',
        f'<span class="status status-{_e(row.task.status.value if row.task else "idle")}">'
        f"{_e(row.status)}</span>",
        _e(_age(row.task.created_at if row.task else row.meta.created_at, now)),
        _e(row.provider_model),
        f"{row.tokens:,}",
        _cost(row.cost),
        f"<code>{_e(row.meta.child_id[:8])}</code>",
    )


def _subtree(view: Overview, parent: str, now: datetime, depth: int) -> str:
    rows = view.under.get(parent, [])
    if not rows or depth > 16:
        return ""
    items = "".join(
        f'<li><a href="/children/{_e(r.meta.child_id)}">{_e(r.meta.label or "(no label)")}</a>'
        f' <span class="status status-{_e(r.task.status.value if r.task else "idle")}">'
        f"{_e(r.status)}</span>{_subtree(view, r.meta.child_id, now, depth + 1)}</li>"
        for r in rows
    )
    return f"<ul>{items}</ul>"


# -- a child's page ----------------------------------------------------------------------


def child_body(child_id: str) -> str:
    """The child page's frame: its regions and its forms (which no update replaces, so
    what a person types stays)."""
    cid = _e(child_id)
    return (
        '<div id="region-head"><!--region-head--></div>'
        '<div id="region-state"><!--region-state--></div>'
        '<section class="act"><h2><label for="message">Message</label></h2>'
        '<textarea id="message" rows="3" maxlength="100000"></textarea> '
        f'<button type="button" data-post="/api/children/{cid}/messages" '
        'data-fields="message" data-clear="message">Send</button>'
        '<p id="send-result" role="status"></p></section>'
        '<section class="act"><h2>Budget</h2>'
        '<label for="budget-tokens">Tokens</label> '
        '<input id="budget-tokens" name="tokens" type="number" min="1" step="1"> '
        '<label for="budget-cost">Cost (USD)</label> '
        '<input id="budget-cost" name="cost" type="number" min="0" step="0.01"> '
        f'<button type="button" data-post="/api/children/{cid}/budget" '
        'data-fields="budget-tokens,budget-cost">Raise budget</button></section>'
        '<div id="region-usage"><!--region-usage--></div>'
        '<div id="region-tasks"><!--region-tasks--></div>'
        "<h2>Transcript</h2>"
        '<div id="region-timeline"><!--region-timeline--></div>'
    )


def child_regions(view: ChildPage) -> dict[str, str]:
    """A child's regions: its header, its state (request, Kill), usage, Tasks, transcript."""
    now = utcnow()
    meta = view.meta
    model = ", ".join(view.models) or "-"
    budget = (
        ", ".join(f"{k} {v:g}" for k, v in sorted(view.budget.items())) if view.budget else "none"
    )
    kids = "".join(
        f'<li><a href="/children/{_e(c.child_id)}">{_e(c.label or "(no label)")}</a></li>'
        for c in view.children
    )
    head = (
        f"<h1>{_e(meta.label or '(no label)')}</h1><dl class=facts>"
        f"<dt>Child</dt><dd><code>{_e(meta.child_id)}</code></dd>"
        f"<dt>Parent</dt><dd>{_parent_link(meta.parent_session, meta.depth)}</dd>"
        f"<dt>Provider:model</dt><dd>{_e(view.provider or '-')}:{_e(model)}</dd>"
        f"<dt>Created</dt><dd>{_e(_age(meta.created_at, now))} ago</dd>"
        f"<dt>Budget</dt><dd>{_e(budget)}</dd></dl>"
        + (f"<h2>Its children</h2><ul>{kids}</ul>" if kids else "")
    )
    return {
        "region-head": head,
        "region-state": _state(view),
        "region-usage": _usage(view),
        "region-tasks": _tasks(view.tasks, now),
        "region-timeline": _timeline(view.events),
    }


def _parent_link(parent: str, depth: int) -> str:
    if depth > 1:
        return f'<a href="/children/{_e(parent)}"><code>{_e(parent)}</code></a>'
    return f"session <code>{_e(parent)}</code>"


def _state(view: ChildPage) -> str:
    task = view.running
    if task is None:
        last = view.tasks[0] if view.tasks else None
        said = f"last Task {_e(last.status.value)}" if last is not None else "no Task yet"
        return (
            f'<section class="state idle"><h2>Idle</h2><p>{said}; a message resumes it.</p>'
            "</section>"
        )
    parts = [
        f'<section class="state"><h2>Task <code>{_e(task.id[:8])}</code> '
        f'<span class="status status-{_e(task.status.value)}">'
        f"{_e(_status(task) + recovery_note(task, view.orphaned, view.provider))}</span></h2>"
    ]
    request = view.request
    if request is not None:
        rid = _e(request.id)
        parts.append(
            '<div class="request"><h3>Approval request</h3>'
            f"<p>Tool <code>{_e(request.tool)}</code>"
            f"{f' — {_e(request.reason)}' if request.reason else ''}</p>"
            f"<pre class=args>{_e(_json(request.arguments))}</pre>"
            '<label for="note">Note</label> '
            '<input id="note" type="text" maxlength="10000" autocomplete="off"> '
            f'<button type="button" data-post="/api/requests/{rid}/answer" '
            'data-body=\'{"allow":true}\' data-fields="note">Allow</button> '
            f'<button type="button" data-post="/api/requests/{rid}/answer" '
            'data-body=\'{"allow":false}\' data-fields="note">Deny</button></div>'
        )
    parts.append(
        f'<button type="button" class="danger" data-post="/api/tasks/{_e(task.id)}/kill" '
        'data-confirm="Kill this Task?">Kill</button></section>'
    )
    return "".join(parts)


def _status(task: TaskSnapshot) -> str:
    if task.queue_position is not None:
        return f"{task.status.value} #{task.queue_position}"
    return str(task.status.value)


def _usage(view: ChildPage) -> str:
    total = view.total
    return (
        "<h2>Usage</h2>"
        f"<p>{total.total_tokens:,} tokens ({total.input_tokens:,} in, "
        f"{total.output_tokens:,} out), {total.model_calls} model calls, "
        f"{total.tool_calls} tool calls, cost {_cost(total.cost)}</p>" + tokens_chart(view.turns)
    )


def tokens_chart(turns: list[TurnUsage], *, width: int = 600, height: int = 140) -> str:
    """Tokens per turn as an SVG bar chart (model calls when no call reported tokens)."""
    if not turns:
        return ""
    tokens = [t.usage.total_tokens for t in turns]
    what = "Tokens per turn"
    if not any(tokens):
        tokens = [t.usage.model_calls for t in turns]
        what = "Model calls per turn (no tokens reported)"
    top = max(max(tokens), 1)
    slot = width / len(turns)
    bar = min(max(slot * 0.8, 1.0), 48.0)
    usable = height - 20
    bars = []
    for index, (turn, value) in enumerate(zip(turns, tokens, strict=True)):
        h = usable * value / top
        x = index * slot + (slot - bar) / 2
        bars.append(
            f'<rect x="{x:.1f}" y="{usable - h:.1f}" width="{bar:.1f}" height="{h:.1f}">'
            f"<title>turn {turn.turn}: {value:,}</title></rect>"
        )
    return (
        f'<figure class="chart"><svg role="img" aria-label="{_e(what)}" '
        f'viewBox="0 0 {width} {height}" width="{width}" height="{height}">'
        f'{"".join(bars)}<line x1="0" y1="{usable}" x2="{width}" y2="{usable}"></line>'
        f'<text x="0" y="{height - 4}">turn {turns[0].turn}</text>'
        f'<text x="{width}" y="{height - 4}" text-anchor="end">turn {turns[-1].turn} · '
        f"max {top:,}</text></svg><figcaption>{_e(what)}</figcaption></figure>"
    )


def _tasks(tasks: list[TaskSnapshot], now: datetime) -> str:
    if not tasks:
        return ""
    rows = (
        (
            f"<code>{_e(t.id[:8])}</code>",
            f'<span class="status status-{_e(t.status.value)}">{_e(_status(t))}</span>',
            _e(_age(t.created_at, now)),
            f"{t.usage.total_tokens:,}",
            _cost(t.usage.cost),
            str(t.recoveries),
            _e(_clip((t.outcome.output or t.outcome.detail or "") if t.outcome else "", 200)),
        )
        for t in tasks
    )
    return "<h2>Tasks</h2>" + _table(
        ("Task", "Status", "Age", "Tokens", "Cost", "Recoveries", "Outcome"), rows, row_class="task"
    )


def _timeline(events: list[SessionEvent]) -> str:
    items = "".join(_event(e) for e in events)
    return f'<ol class="timeline">{items}</ol>' if items else '<p class="empty">no events</p>'


_TITLES: Final = {
    EventKind.TURN_START: "turn started",
    EventKind.TURN_END: "turn ended",
    EventKind.USER_MESSAGE: "message",
    EventKind.STEERING_MESSAGE: "steer",
    EventKind.ASSISTANT_MESSAGE: "assistant",
    EventKind.APPROVAL_REQUEST: "approval request",
    EventKind.APPROVAL_ANSWER: "approval answer",
    EventKind.DESCRIPTOR: "provider",
    EventKind.TASK_RECOVERED: "recovered",
    "tool/call": "tool call",
    "tool/result": "tool result",
}


def _event(event: SessionEvent) -> str:
    kind = event.kind
    title = _TITLES.get(kind, kind)
    data: Any = event.data
    text = _event_text(kind, data)
    css = "ev-" + "".join(c if c.isalnum() else "-" for c in kind)
    usage = data.get("usage") if isinstance(data, dict) else None
    extra = f' <span class="usage">{_e(_json(usage))}</span>' if usage else ""
    return (
        f'<li class="ev {css}" data-seq="{event.seq}"><span class="seq">{event.seq}</span> '
        f'<span class="turn">turn {event.turn}</span> <span class="kind">{_e(title)}</span>'
        f"{_source(event.source)}{extra}"
        f"{f'<pre>{_e(_clip(text, _TEXT_CLIP))}</pre>' if text else ''}</li>"
    )


def _event_text(kind: str, data: Any) -> str:
    if not isinstance(data, dict):
        return "" if data is None else _json(data)
    if kind in (EventKind.TURN_START, EventKind.TURN_END):
        return " ".join(
            f"{k}={v}"
            for k, v in data.items()
            if k in ("task_id", "activation", "status", "detail")
        )
    if kind == EventKind.TASK_RECOVERED:
        return (
            f"recovered by runtime {data.get('runtime_id', '?')} from runtime "
            f"{data.get('from_runtime', '?')} (recovery {data.get('recovery', '?')}, "
            f"task {data.get('task_id', '?')})"
        )
    if kind == "tool/call":
        return f"{data.get('name', '')}({_json(data.get('arguments', {}))})"
    if kind == EventKind.APPROVAL_REQUEST:
        reason = f" — {data['reason']}" if data.get("reason") else ""
        return f"{data.get('tool', '')}({_json(data.get('arguments', {}))}){reason}"
    if kind == EventKind.APPROVAL_ANSWER:
        verdict = "allowed" if data.get("allow") else "denied"
        return f"{verdict}{': ' + str(data['note']) if data.get('note') else ''}"
    for key in ("text", "output", "error", "content", "message"):
        value = data.get(key)
        if isinstance(value, str):
            return value
    rest = {k: v for k, v in data.items() if k not in ("usage", "usage_reported")}
    return _json(rest) if rest else ""


def _source(source: MessageSource | None) -> str:
    if source is None:
        return ""
    who = f" {source.sender_session_id}" if source.sender_session_id else ""
    return f' <span class="source source-{_e(source.kind)}">from {_e(source.kind)}{_e(who)}</span>'


# -- runtimes and queues -----------------------------------------------------------------

RUNTIMES_BODY: Final = (
    "<h1>Runtimes and queues</h1>"
    '<div id="region-runtimes"><!--region-runtimes--></div>'
    '<div id="region-queues"><!--region-queues--></div>'
)


def runtimes_regions(view: RuntimesPage) -> dict[str, str]:
    """The runtimes (alive or not, with the children they hold) and each key's queue."""
    now = utcnow()
    runtimes = _table(
        ("Runtime", "State", "Host", "PID", "Heartbeat", "Running", "Holds"),
        (
            (
                f"<code>{_e(r.info.runtime_id)}</code>",
                "alive" if r.alive else "dead",
                _e(r.info.host),
                str(r.info.pid),
                f"{_e(_age(r.info.heartbeat_at, now))} ago",
                str(r.info.running_tasks),
                " ".join(
                    f'<a href="/children/{_e(c)}"><code>{_e(c[:8])}</code></a>@{f}'
                    for c, _t, f in r.holds
                ),
            )
            for r in view.runtimes
        ),
        row_class="runtime",
    )
    queues = "".join(
        f"<h3>{_e(key)}</h3>"
        + _table(
            ("Task", "State", "Status", "Label"),
            (
                (
                    f"<code>{_e(k.task_id[:8])}</code>",
                    _e(k.state),
                    _e(k.status),
                    f'<a href="/children/{_e(k.child_id)}">{_e(k.label)}</a>'
                    if k.child_id
                    else _e(k.label),
                )
                for k in keyed
            ),
            row_class="queued",
        )
        for key, keyed in view.queues.items()
    )
    return {
        "region-runtimes": "<h2>Runtimes</h2>"
        + (runtimes if view.runtimes else '<p class="empty">none</p>'),
        "region-queues": "<h2>Concurrency queues</h2>"
        + (queues or '<p class="empty">no running or queued Task under a limit</p>'),
    }


# -- helpers -------------------------------------------------------------------------------


def _table(header: Iterable[str], rows: Iterable[Iterable[str]], *, row_class: str) -> str:
    head = "".join(f"<th>{_e(h)}</th>" for h in header)
    body = "".join(
        f'<tr class="{row_class}">' + "".join(f"<td>{cell}</td>" for cell in row) + "</tr>"
        for row in rows
    )
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _age(when: datetime, now: datetime) -> str:
    seconds = max(int((now - when).total_seconds()), 0)
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


def _cost(cost: float | None) -> str:
    return "-" if cost is None else f"${cost:,.4f}"


def _json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, sort_keys=True, default=str)


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:limit] + f"… ({len(text) - limit} more)"
