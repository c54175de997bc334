"""`ListTasks`: the parent's Tasks filtered, newest first, one page at a time, as the SDK's
own stores page them (the same cursor tokens)."""

from __future__ import annotations

from collections.abc import Sequence

from a2a.types.a2a_pb2 import ListTasksRequest, ListTasksResponse, Task
from a2a.utils.constants import DEFAULT_LIST_TASKS_PAGE_SIZE
from a2a.utils.errors import InvalidParamsError
from a2a.utils.task import (
    ListTasksCursor,
    decode_list_tasks_cursor,
    encode_list_tasks_cursor,
    validate_page_size,
)

from controlplane.contract import TaskSnapshot
from controlplane.fronts._a2a_view import task_view

__all__ = ["list_page"]


def list_page(snapshots: Sequence[TaskSnapshot], params: ListTasksRequest) -> ListTasksResponse:
    """One page of ``snapshots`` as A2A Tasks (without history: the caller adds it when
    asked), by status time, newest first.

    Raises:
        InvalidParamsError: a page size out of range or a page token not ours.
    """
    if params.HasField("page_size"):
        validate_page_size(params.page_size)
    tasks = [task_view(snapshot) for snapshot in snapshots]
    if params.context_id:
        tasks = [task for task in tasks if task.context_id == params.context_id]
    if params.status:
        tasks = [task for task in tasks if task.status.state == params.status]
    if params.HasField("status_timestamp_after"):
        after = params.status_timestamp_after.ToNanoseconds()
        tasks = [task for task in tasks if task.status.timestamp.ToNanoseconds() >= after]
    tasks.sort(key=lambda task: _cursor(task).sort_key(), reverse=True)
    start = 0
    if params.page_token:
        cursor = decode_list_tasks_cursor(params.page_token)
        if cursor is None:
            raise InvalidParamsError(message="the page token is not one this server gave")
        start = next(
            (i for i, task in enumerate(tasks) if _cursor(task).sort_key() < cursor.sort_key()),
            len(tasks),
        )
    size = params.page_size or DEFAULT_LIST_TASKS_PAGE_SIZE
    end = start + size
    more = end < len(tasks)
    return ListTasksResponse(
        tasks=tasks[start:end],
        next_page_token=encode_list_tasks_cursor(_cursor(tasks[end - 1])) if more else "",
        page_size=size,
        total_size=len(tasks),
    )


def _cursor(task: Task) -> ListTasksCursor:
    return ListTasksCursor(timestamp_ns=task.status.timestamp.ToNanoseconds(), task_id=task.id)
