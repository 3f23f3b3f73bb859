"""The session media clock.

Every session owns exactly one :class:`MediaClock`. Audio and video pts, turn
timestamps and pacing all read it, so lips and sound cannot drift apart. Tests
inject a :class:`ScriptedClock` and advance it by hand; nothing else in the
engine reads wall time directly.
"""

from __future__ import annotations

import asyncio
import time
from typing import Protocol


class Clock(Protocol):
    """Seconds since the session started, and a way to wait until a later time."""

    def now(self) -> float: ...

    async def sleep_until(self, t: float) -> None: ...


class MediaClock:
    """A monotonic clock whose zero is the session's start."""

    def __init__(self, start: float | None = None) -> None:
        self._origin = time.monotonic() if start is None else start

    @property
    def origin(self) -> float:
        """The `time.monotonic()` value that corresponds to t = 0."""
        return self._origin

    def now(self) -> float:
        return time.monotonic() - self._origin

    async def sleep_until(self, t: float) -> None:
        delay = t - self.now()
        if delay > 0:
            await asyncio.sleep(delay)


class ScriptedClock:
    """A clock that only moves when told to: for tests.

    `sleep_until` waits until `advance` (or `set`) moves time past the target.
    """

    def __init__(self, t: float = 0.0) -> None:
        self._t = t
        self._changed = asyncio.Event()

    def now(self) -> float:
        return self._t

    def set(self, t: float) -> None:
        if t < self._t:
            raise ValueError("a scripted clock never goes backwards")
        self._t = t
        self._changed.set()
        self._changed = asyncio.Event()

    def advance(self, dt: float) -> None:
        self.set(self._t + dt)

    async def sleep_until(self, t: float) -> None:
        while self._t < t - 1e-9:  # tolerate float rounding of summed steps
            await self._changed.wait()
