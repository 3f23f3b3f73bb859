"""The GIL's toll on a worker thread: threads that only want the GIL beside it, and its calls into torch.

Every torch call (and every OpenCV call) gives up the GIL while it runs in C and takes it back; beside
threads running Python each taking-back can wait a switch interval. ``gpu_stages`` and
``scripts/gil_convoy.py`` time stages beside :func:`busy_threads` and count their calls with
:func:`torch_calls` (docs/PERFORMANCE.md, "2026-12-08, H100").
"""

from __future__ import annotations

import contextlib
import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any


def _spin(stop: threading.Event) -> None:
    """Pure Python until told to stop: what the other sessions' threads are to a worker."""
    n = 0
    while not stop.is_set():
        n = (n + 1) % 1_000_003


@contextlib.contextmanager
def busy_threads(count: int, switch_ms: float) -> Iterator[None]:
    """``count`` threads that hold the GIL whenever they get it, at a switch interval of ``switch_ms``
    (both undone on leaving)."""
    previous = sys.getswitchinterval()
    sys.setswitchinterval(switch_ms / 1000.0)
    stop = threading.Event()
    spinners = [threading.Thread(target=_spin, args=(stop,), daemon=True) for _ in range(count)]
    for s in spinners:
        s.start()
    try:
        yield
    finally:
        stop.set()
        for s in spinners:
            s.join()
        sys.setswitchinterval(previous)


def torch_calls(fn: Callable[[], object], all_threads: bool = False) -> int | None:
    """Calls into torch's C functions while ``fn`` runs on this thread (or on every thread: Python 3.12+, else
    None): beside busy threads a stage costs about this many waits for the GIL."""
    count = 0
    set_all: Any = getattr(threading, "setprofile_all_threads", None)
    if all_threads and set_all is None:
        fn()
        return None

    def profile(frame: Any, event: str, arg: Any) -> None:
        nonlocal count
        if event == "c_call":
            owner = getattr(arg, "__self__", None)
            module = getattr(arg, "__module__", None) or type(owner).__module__
            if module and module.startswith("torch"):
                count += 1

    setter = set_all if all_threads else sys.setprofile
    setter(profile)
    try:
        fn()
    finally:
        setter(None)
    return count
