"""The native inference libraries: how their thread pools wait, and the order they are imported in.

**Waiting threads sleep** (``engine.quiet_thread_pools``, run when the package is imported).
llama.cpp, CTranslate2 (the ASR) and torch each bring their own OpenMP runtime (three copies of libgomp in one process), and by default an OpenMP worker spins for a while
after every parallel region, waiting for the next. On two cores the LLM's prefill workers spun while
the ASR decoded and Piper synthesized, and the decode ran at 19-26 tokens/s in the engine against
~40 alone (docs/PERFORMANCE.md, "spinning thread pools"). So ``OMP_WAIT_POLICY=PASSIVE`` (and
``KMP_BLOCKTIME=0`` for an Intel OpenMP a user's build may bring) are set before any of them loads,
unless the environment already says otherwise: a machine with cores to spare may prefer ``ACTIVE``.

**Import order.** Seen here: importing onnxruntime after usearch crashes the process (a segfault inside
onnxruntime's import); the other order works. Models load in worker threads so the event
loop stays free; their libraries are imported first, here, before anything imports usearch.
"""

from __future__ import annotations

import importlib
import logging

log = logging.getLogger(__name__)

NATIVE_MODULES = ("onnxruntime", "torch", "ctranslate2", "piper", "av", "usearch.index")


def preload_native_modules() -> None:
    for name in NATIVE_MODULES:
        try:
            importlib.import_module(name)
        except ImportError as e:  # the stage that needs it reports this when it loads
            log.debug("could not preload %s: %s", name, e)
