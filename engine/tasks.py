"""Owned asyncio tasks: every task has a name, an owner, and is cancelled with a timeout."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine
from typing import Any, TypeVar

log = logging.getLogger(__name__)
T = TypeVar("T")


class TaskOwner:
    """Creates, tracks and cancels the tasks of one component.

    A task that fails is logged (with its name) and dropped from the set; the
    owner never swallows the caller's own cancellation.
    """

    def __init__(self, name: str) -> None:
        self.name = name
        self._tasks: set[asyncio.Task[Any]] = set()

    def spawn(self, coro: Coroutine[Any, Any, T], name: str) -> asyncio.Task[T]:
        task = asyncio.get_running_loop().create_task(coro, name=f"{self.name}:{name}")
        self._tasks.add(task)
        task.add_done_callback(self._done)
        return task

    def _done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if task.cancelled():
            return
        exc = task.exception()
        if exc is not None:
            log.error("task %s failed: %r", task.get_name(), exc, exc_info=exc)

    @property
    def tasks(self) -> frozenset[asyncio.Task[Any]]:
        return frozenset(self._tasks)

    async def cancel_all(self, grace_s: float = 2.0) -> None:
        tasks = [t for t in self._tasks if not t.done()]
        for t in tasks:
            t.cancel()
        if tasks:
            done, pending = await asyncio.wait(tasks, timeout=grace_s)
            for t in pending:
                log.warning("task %s did not stop within %.1fs", t.get_name(), grace_s)


async def cancel_and_wait(task: asyncio.Task[Any] | None, grace_s: float = 2.0) -> None:
    """Cancel one task and wait for it to finish, without swallowing our own cancellation."""
    if task is None or task.done():
        return
    task.cancel()
    try:
        await asyncio.wait_for(asyncio.shield(task), grace_s)
    except asyncio.CancelledError:
        # Re-raise only if *we* are being cancelled, not the task we cancelled.
        current = asyncio.current_task()
        if current is not None and current.cancelling():
            raise
    except TimeoutError:
        log.warning("task %s did not stop within %.1fs", task.get_name(), grace_s)
    except Exception:  # the task's own failure was already logged by its owner
        pass
