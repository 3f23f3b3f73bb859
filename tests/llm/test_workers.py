"""The CUDA path's worker pool: every thread it may use is started and has run the warm-up first."""

from __future__ import annotations

import threading

import pytest

from engine.llm.workers import warmed_pool


def test_every_worker_thread_is_warmed_before_use() -> None:
    warmed: list[str] = []
    lock = threading.Lock()

    def warm() -> None:
        with lock:
            warmed.append(threading.current_thread().name)

    pool = warmed_pool(5, warm, name="t-warm")
    assert len(warmed) == 5 and len(set(warmed)) == 5  # five distinct threads, one warm-up each
    used = {pool.submit(lambda: threading.current_thread().name).result() for _ in range(40)}
    assert used <= set(warmed)  # later work only ever runs on a warmed thread
    pool.shutdown()


def test_a_failing_warm_up_fails_the_pool() -> None:
    calls = []

    def warm() -> None:
        calls.append(1)
        raise RuntimeError("no device")

    with pytest.raises(RuntimeError, match="no device"):
        warmed_pool(3, warm)
    with pytest.raises(ValueError):
        warmed_pool(0, warm)
