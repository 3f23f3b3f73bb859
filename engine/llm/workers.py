"""Long-lived worker threads for the CUDA decode path, every one of them warmed before the first reply.

Measured on the H200 (docs/PERFORMANCE.md, "GPU: stages"): a reply generated on a thread that had done no CUDA
work before took 75-90 ms longer to its first token than one on a thread that had; with a plain
``ThreadPoolExecutor`` a new call often lands on a fresh thread (the previous worker has handed its last piece
over but is not idle yet), so every thread the pool may use is started and warmed at load.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from engine.native import model_executor

WARM_TIMEOUT_S = 120.0


def warmed_pool(workers: int, warm: Callable[[], None], name: str = "llm-decode") -> ThreadPoolExecutor:
    """A pool of exactly ``workers`` started threads, each of which has run ``warm`` once (blocking)."""
    if workers < 1:
        raise ValueError("workers must be at least 1")
    pool = model_executor(workers, name)
    barrier = threading.Barrier(workers, timeout=WARM_TIMEOUT_S)

    def one() -> None:
        try:
            warm()
        except BaseException:
            barrier.abort()
            raise
        barrier.wait()  # hold this thread, so the next task starts another one

    try:
        for future in [pool.submit(one) for _ in range(workers)]:
            future.result()
    except BaseException:
        pool.shutdown(wait=False, cancel_futures=True)
        raise
    return pool
