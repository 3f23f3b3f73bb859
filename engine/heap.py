"""Python's cyclic garbage collector and a loaded engine.

A full collection walks every tracked object. Once the models, the runtimes' Python layers and the persona
bank are loaded that is ~200-500k objects, and a full collection of them took 95-115 ms on the 2-core machine
with every Python thread held: the event loop, the video track and the audio track all wait. CPython runs one
only when the objects that survived since the last grow past a quarter of the long-lived ones, so it is rare
(two 20-turn runs with and without this module showed no difference in the viewer's frame pacing,
docs/PERFORMANCE.md), but when it comes every session stalls at once. Nothing loaded at start-up is garbage,
so once the engine is ready :func:`freeze_loaded_heap` moves it all to the permanent generation
(``gc.freeze``): later collections walk only what sessions made since. :class:`CollectionPauses` times every
collection for ``/metrics``, where a studio sees whether they matter on its machines.
"""

from __future__ import annotations

import gc
import logging
import time

from prometheus_client import CollectorRegistry, Histogram

log = logging.getLogger(__name__)


def freeze_loaded_heap() -> int:
    """Collect once, then keep every object alive now out of all later collections; the objects frozen."""
    t0 = time.perf_counter()
    gc.collect()
    gc.freeze()
    frozen = gc.get_freeze_count()
    log.info(
        "heap: %d objects frozen out of the collector's walks (%.0f ms)",
        frozen,
        (time.perf_counter() - t0) * 1e3,
    )
    return frozen


class CollectionPauses:
    """Every collection's pause, by generation, into ``idolcast_gc_pause_seconds`` (a histogram): while it
    runs no Python thread runs, so a long one is a stall every session's media shares."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.histogram = Histogram(
            "idolcast_gc_pause_seconds",
            "Pauses of Python's garbage collector (every Python thread waits), by generation",
            ["generation"],
            buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0),
            registry=registry,
        )
        self._started = 0.0

    def _on_collection(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
        elif self._started:
            self.histogram.labels(generation=str(info["generation"])).observe(
                time.perf_counter() - self._started
            )

    def watch(self) -> None:
        gc.callbacks.append(self._on_collection)

    def stop(self) -> None:
        if self._on_collection in gc.callbacks:
            gc.callbacks.remove(self._on_collection)
