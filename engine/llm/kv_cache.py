"""Per-conversation KV caches kept between calls, so a stable prompt prefix is prefilled once.

Each entry holds the token ids whose keys/values are in the cache (prompt + reply, minus the
last sampled token, which was never fed). On the next call the longest common token prefix is
kept (the cache is cropped to it) and only the new tail is prefilled.

An entry is *taken* by a call for its whole duration and *put back* at the end, so two calls on
one conversation never share a cache; a call that finds its key in flight waits briefly for it.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any


@dataclass
class CacheEntry:
    ids: list[int]
    cache: Any  # transformers DynamicCache


def common_prefix_len(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


@dataclass(frozen=True, slots=True)
class Shift:
    """A run of cached positions ``src .. src + length - 1`` that the new prompt holds at ``dst .. dst +
    length - 1`` (``dst < src``: what stood before it in the cache is gone from the prompt)."""

    src: int
    dst: int
    length: int


def shifted_runs(cached: list[int], wanted: list[int], start: int, min_run: int) -> list[Shift]:
    """After their common prefix (``start`` tokens), the runs of ``cached`` that ``wanted`` holds again,
    earlier: the history dropped from its front (trimmed, or consolidated into a summary), the exchanges
    after it kept. Greedy, left to right: at each place in ``wanted`` the cache is searched forward for
    a run of at least ``min_run`` equal tokens; tokens new to ``wanted`` end the search (what follows
    them is prefilled). Only deletions are found, so every run moves towards the front."""
    runs: list[Shift] = []
    c = p = start
    while c < len(cached) and p < len(wanted):
        n = 0
        while c + n < len(cached) and p + n < len(wanted) and cached[c + n] == wanted[p + n]:
            n += 1
        if n >= min_run:
            runs.append(Shift(c, p, n))
            c, p = c + n, p + n
        else:
            c += 1
    return runs


def crop_cache(cache: Any, cached: int, keep: int) -> None:
    """Drop the last ``cached - keep`` positions (negative ``crop`` means 'remove this many')."""
    if cached > keep:
        cache.crop(-(cached - keep))


class PrefixCacheStore:
    """A small LRU of :class:`CacheEntry` by conversation key."""

    def __init__(self, slots: int = 8) -> None:
        self.slots = slots
        self._entries: OrderedDict[str, CacheEntry] = OrderedDict()
        self._busy: dict[str, threading.Event] = {}
        self._lock = threading.Lock()

    def take(self, key: str, stop: threading.Event, wait_s: float = 2.0) -> tuple[bool, CacheEntry | None]:
        """Claim ``key`` and remove its entry: ``(owned, entry)``.

        Waits up to ``wait_s`` while another call holds the key; if it is still held then (or
        ``stop`` is set) returns ``(False, None)``: run cold and do not put anything back.
        """
        waited = 0.0
        while True:
            with self._lock:
                busy = self._busy.get(key)
                if busy is None:
                    self._busy[key] = threading.Event()
                    return True, self._entries.pop(key, None)
            if waited >= wait_s or stop.is_set():
                return False, None
            busy.wait(0.05)
            waited += 0.05

    def put_back(self, key: str, entry: CacheEntry | None) -> None:
        """Release a key claimed by :meth:`take`; store ``entry`` (if any) as most recent, evicting the oldest beyond ``slots``."""
        with self._lock:
            done = self._busy.pop(key, None)
            if entry is not None and self.slots > 0:
                self._entries[key] = entry
                self._entries.move_to_end(key)
                while len(self._entries) > self.slots:
                    self._entries.popitem(last=False)
            if done is not None:
                done.set()

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)

    def cached_tokens(self, key: str) -> int:
        with self._lock:
            entry = self._entries.get(key)
            return len(entry.ids) if entry is not None else 0
