"""The voice's queue: every session's syntheses through one loaded voice, a reply's first chunk first.

One engine serves several sessions with one voice. Their replies' chunks wait for its worker threads in
one queue, ordered by urgency and then by arrival: a reply's **first** chunk (the host is waiting in
silence for it) goes before other replies' later chunks, which have the audio already queued before them
to hide their wait (the first chunk is ~1.4 s of speech). A running synthesis is never interrupted; a job
whose caller gave up (a barge-in cancelled the reply) before a worker took it is skipped.

The workers are model threads (``engine/native.py``: nicer than the media), named ``<name>_<i>``.
"""

from __future__ import annotations

import asyncio
import itertools
import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, TypeVar

from engine.native import as_model_thread

T = TypeVar("T")

FIRST = 0  # a reply's first chunk
LATER = 1  # any other chunk

_Job = tuple[int, int, Callable[[], Any] | None, "Future[Any] | None"]


class VoiceQueue:
    """``workers`` threads (started with the first job) taking jobs by (urgency, arrival). ``close`` stops
    them; jobs still queued are cancelled."""

    def __init__(self, workers: int = 1, name: str = "piper") -> None:
        self._jobs: queue.PriorityQueue[_Job] = queue.PriorityQueue()
        self._seq = itertools.count()
        self._lock = threading.Lock()
        self._closed = False
        self._started = False
        self._threads = [
            threading.Thread(target=self._work, name=f"{name}_{i}", daemon=True)
            for i in range(max(1, workers))
        ]

    def submit(self, fn: Callable[[], T], urgency: int = LATER) -> Future[T]:
        """Queue ``fn``; its future (cancel it to have it skipped if no worker has taken it yet)."""
        fut: Future[T] = Future()
        with self._lock:
            if self._closed:
                raise RuntimeError("the voice's queue is closed (after shutdown): no synthesis")
            if not self._started:  # the workers start with the first job
                self._started = True
                for t in self._threads:
                    t.start()
            self._jobs.put((urgency, next(self._seq), fn, fut))
        return fut

    async def run(self, fn: Callable[[], T], urgency: int = LATER) -> T:
        """``fn`` on a worker; cancelling the caller cancels the job if it has not started."""
        return await asyncio.wrap_future(self.submit(fn, urgency))

    def waiting(self) -> int:
        """Jobs queued, not yet taken by a worker."""
        return self._jobs.qsize()

    def _work(self) -> None:
        as_model_thread()
        while True:
            _, _, fn, fut = self._jobs.get()
            if fn is None or fut is None:  # close()
                return
            if not fut.set_running_or_notify_cancel():
                continue  # its caller gave up before it started
            try:
                fut.set_result(fn())
            except BaseException as e:  # noqa: BLE001 - handed to the caller
                fut.set_exception(e)

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            started = self._started
        while True:
            try:
                _, _, _, fut = self._jobs.get_nowait()
            except queue.Empty:
                break
            if fut is not None:
                fut.cancel()
        if started:
            for _ in self._threads:
                self._jobs.put((2, next(self._seq), None, None))  # after anything else: each worker stops


__all__ = ["FIRST", "LATER", "VoiceQueue"]
