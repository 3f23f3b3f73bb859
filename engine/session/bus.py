"""Fan-out of a session's events: typed observers on the loop, and subscribers reading the wire format.

Observers (the animator, the chat queue, MQTT) get each :class:`~engine.events.Event` synchronously
as it is published. Subscribers (the event WebSocket) each have a bounded queue and get the JSON
object of :func:`~engine.events.to_wire`; a slow subscriber loses its oldest events, never slows the
session down. Publishing an :class:`~engine.events.Interruption` drops every interruptible event
(reply tokens) still queued for a subscriber: the reply they belong to was cut.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import AsyncIterator, Callable
from typing import Any

from engine.events import Event, Interruption, to_wire

Observer = Callable[[Event], None]


class Subscription:
    """One subscriber's queue of events, read as wire dicts; ``None`` means the session ended."""

    def __init__(self, max_queued: int) -> None:
        self._items: deque[Event | None] = deque(maxlen=max_queued)
        self._ready = asyncio.Event()

    def put(self, event: Event | None) -> None:
        self._items.append(event)  # a full queue drops its oldest
        self._ready.set()

    def drop_interruptible(self) -> None:
        kept = [e for e in self._items if e is None or not e.interruptible]
        self._items.clear()
        self._items.extend(kept)

    def qsize(self) -> int:
        return len(self._items)

    async def get(self) -> dict[str, Any] | None:
        while not self._items:
            self._ready.clear()
            await self._ready.wait()
        event = self._items.popleft()
        return None if event is None else to_wire(event)


class EventBus:
    def __init__(self, max_queued: int = 256) -> None:
        self.max_queued = max_queued
        self._subscriptions: set[Subscription] = set()
        self._observers: list[Observer] = []

    def publish(self, event: Event) -> None:
        for observer in list(self._observers):
            observer(event)
        for sub in list(self._subscriptions):
            if isinstance(event, Interruption):
                sub.drop_interruptible()
            sub.put(event)

    def add_observer(self, observer: Observer) -> None:
        """A synchronous observer, called on the loop for every event (keep it cheap)."""
        self._observers.append(observer)

    def remove_observer(self, observer: Observer) -> None:
        with contextlib.suppress(ValueError):
            self._observers.remove(observer)

    @contextlib.asynccontextmanager
    async def subscribe(self) -> AsyncIterator[Subscription]:
        """The events from now on, as wire dicts (``await sub.get()``)."""
        sub = Subscription(self.max_queued)
        self._subscriptions.add(sub)
        try:
            yield sub
        finally:
            self._subscriptions.discard(sub)

    def close(self) -> None:
        for sub in list(self._subscriptions):
            sub.put(None)
