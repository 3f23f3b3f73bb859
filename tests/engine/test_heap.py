"""The loaded engine's objects are frozen out of the garbage collector's walks (engine/heap.py)."""

from __future__ import annotations

import gc

import pytest

from engine.heap import CollectionPauses, freeze_loaded_heap

pytestmark = pytest.mark.unit


def test_objects_alive_when_frozen_are_out_of_every_later_collection() -> None:
    loaded = [[i] for i in range(1000)]  # tracked containers, like the models' Python objects
    try:
        frozen = freeze_loaded_heap()
        # another thread may free a frozen object meanwhile (CI saw 799,114 frozen, then 799,112 left)
        assert frozen >= 1000 and frozen - 100 <= gc.get_freeze_count() <= frozen
        walked = {id(o) for o in gc.get_objects()}  # what a full collection walks
        assert not any(id(x) in walked for x in loaded)
        made_later = [[0]]
        assert id(made_later[0]) in {
            id(o) for o in gc.get_objects()
        }  # a session's objects are still collected
    finally:
        gc.unfreeze()


def test_every_collection_s_pause_is_counted_by_generation_until_stopped() -> None:
    from prometheus_client import CollectorRegistry

    registry = CollectorRegistry()
    pauses = CollectionPauses(registry)
    pauses.watch()
    try:
        gc.collect(0)
        gc.collect()
        count = registry.get_sample_value
        assert count("idolcast_gc_pause_seconds_count", {"generation": "0"}) >= 1
        assert count("idolcast_gc_pause_seconds_count", {"generation": "2"}) >= 1
        assert count("idolcast_gc_pause_seconds_sum", {"generation": "2"}) > 0
    finally:
        pauses.stop()
    before = registry.get_sample_value("idolcast_gc_pause_seconds_count", {"generation": "2"})
    gc.collect()
    assert registry.get_sample_value("idolcast_gc_pause_seconds_count", {"generation": "2"}) == before
    assert pauses._on_collection not in gc.callbacks
