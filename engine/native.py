"""Import the native inference libraries first, on the main thread, in a known order.

Seen here: importing onnxruntime after usearch crashes the process (a segfault inside
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
