"""The native inference libraries: how their thread pools wait, and the order they are imported in.

**Waiting threads sleep** (``engine.quiet_thread_pools``, run when the package is imported).
llama.cpp, CTranslate2 (the ASR) and torch each bring their own OpenMP runtime (three copies of libgomp in one process), and by default an OpenMP worker spins for a while
after every parallel region, waiting for the next. On two cores the LLM's prefill workers spun while
the ASR decoded and Piper synthesized, and the decode ran at 19-26 tokens/s in the engine against
~40 alone (docs/PERFORMANCE.md, "spinning thread pools"). So ``OMP_WAIT_POLICY=PASSIVE`` (and
``KMP_BLOCKTIME=0`` for an Intel OpenMP a user's build may bring) are set before any of them loads,
unless the environment already says otherwise: a machine with cores to spare may prefer ``ACTIVE``.
With the policy, ``GOMP_SPINCOUNT=1000``: a worker spins ~1,000 pauses (tens of microseconds) before it
sleeps. Without it PASSIVE sleeps at every barrier inside a forward pass, and llama.cpp's 6-token batch on
two threads took 92 ms instead of 29 on the AMX Xeon (docs/PERFORMANCE.md, "one OpenMP team"). libgomp
spins at all only while it manages no more threads than there are cores, so llama.cpp runs every call on
its own compute threads (engine/llm/llama_cpp_backend.py).

**OpenCV converts in the calling thread** (``OPENCV_FOR_THREADS_NUM=1``, set with the above). The sent
picture's RGBA → I420 conversion (engine/avatar/picture.py) runs in every session's media thread, 30 times a
second; OpenCV's default pool has a worker per core, and each call wakes them all, which then wait actively
before they sleep. On the GPU path nothing else set it (the CPU render sets 1 itself), so on the 16-core
H100 box each engine held 15 such workers, and `native_media` (threads without a Python name started by
media threads) was the largest share of a session's CPU: 0.19 of ~0.55 cores. A 720p conversion takes
~0.5 ms in one thread.

**Import order.** Seen here: importing onnxruntime after usearch crashes the process (a segfault inside
onnxruntime's import); the other order works. Models load in worker threads so the event
loop stays free; their libraries are imported first, here, before anything imports usearch.
"""

from __future__ import annotations

import importlib
import logging
import os
import threading
from concurrent.futures import ThreadPoolExecutor

log = logging.getLogger(__name__)

NATIVE_MODULES = ("onnxruntime", "torch", "ctranslate2", "piper", "av", "usearch.index")


def preload_native_modules() -> None:
    for name in NATIVE_MODULES:
        try:
            importlib.import_module(name)
        except ImportError as e:  # the stage that needs it reports this when it loads
            log.debug("could not preload %s: %s", name, e)


# ---- models run nicer than media --------------------------------------------------------------------------
#
# A frame has a deadline every 33 ms; a model's work (the ASR's decode, the LLM's prefill and decode, Piper)
# has a budget of a few hundred ms. On a full machine the kernel shares the cores by the threads' nice values,
# so the model threads run ``server.model_nice`` steps nicer than the event loop, the render thread and the
# encoders: when everything wants a core at the end of a turn, the frame goes first (on the 2-core machine the
# engine otherwise dropped a few frames as late in that second). Raising a thread's nice needs no privilege.
# A native runtime's own worker threads (llama.cpp's and CTranslate2's OpenMP teams, ONNX Runtime's pool)
# inherit the nice of the thread that starts them, so models load and run in model threads only.

_model_nice = 0
_thread = threading.local()


def set_model_nice(nice: int) -> None:
    """How much nicer model threads run (0: as nice as the rest). Set once at start, before models load."""
    global _model_nice
    _model_nice = max(0, min(19, int(nice)))


def model_nice() -> int:
    """The nice steps model threads run below the rest (``server.model_nice``, as set at start)."""
    return _model_nice


def as_model_thread() -> None:
    """Make the calling thread a model thread: ``server.model_nice`` steps nicer (once per thread; Linux,
    where a thread's nice is its own; elsewhere nothing). Threads it starts from now on inherit it."""
    if _model_nice <= 0 or getattr(_thread, "niced", False) or not hasattr(os, "setpriority"):
        return
    _thread.niced = True
    tid = threading.get_native_id()
    try:
        os.setpriority(os.PRIO_PROCESS, tid, min(19, os.getpriority(os.PRIO_PROCESS, tid) + _model_nice))
    except OSError as e:  # pragma: no cover - a sandbox that forbids it
        log.debug("could not lower thread %d's priority: %s", tid, e)


def model_executor(workers: int, name: str) -> ThreadPoolExecutor:
    """A thread pool whose threads are model threads (:func:`as_model_thread`)."""
    return ThreadPoolExecutor(max_workers=workers, thread_name_prefix=name, initializer=as_model_thread)
