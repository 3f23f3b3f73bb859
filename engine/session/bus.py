"""Fan-out of a session's events to observers (web sockets, MQTT, the bench).

Each subscriber has its own bounded queue; a slow subscriber loses its oldest
events, never slows the session down.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Any

Listener = Callable[[dict[str, Any]], None]


class EventBus:
    def __init__(self, max_queued: int = 256) -> None:
        self.max_queued = max_queued
        self._queues: set[asyncio.Queue[dict[str, Any] | None]] = set()
        self._listeners: list[Listener] = []

    def publish(self, event: dict[str, Any]) -> None:
        for listener in list(self._listeners):
            listener(event)
        for q in list(self._queues):
            if q.full():
                with contextlib.suppress(asyncio.QueueEmpty):
                    q.get_nowait()
            q.put_nowait(event)

    def add_listener(self, listener: Listener) -> None:
        """A synchronous observer, called on the loop for every event (keep it cheap)."""
        self._listeners.append(listener)

    def remove_listener(self, listener: Listener) -> None:
        with contextlib.suppress(ValueError):
            self._listeners.remove(listener)

    @contextlib.asynccontextmanager
    async def subscribe(self) -> AsyncIterator[asyncio.Queue[dict[str, Any] | None]]:
        """A queue of events; ``None`` means the session ended."""
        q: asyncio.Queue[dict[str, Any] | None] = asyncio.Queue(self.max_queued)
        self._queues.add(q)
        try:
            yield q
        finally:
            self._queues.discard(q)

    def close(self) -> None:
        for q in list(self._queues):
            if q.full():
                with contextlib.suppress(asyncio.QueueEmpty):
                    q.get_nowait()
            q.put_nowait(None)
