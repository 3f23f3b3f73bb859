"""The bench's GIL tools: threads that want the GIL beside a worker, and the worker's torch calls counted."""

from __future__ import annotations

import sys
import threading

import pytest
import torch

from engine.bench.gil import busy_threads, torch_calls

pytestmark = pytest.mark.unit


def test_torch_calls_counts_this_threads_calls_into_torch_only() -> None:
    x = torch.zeros(4)

    def work() -> None:
        for _ in range(5):
            torch.add(x, 1.0)
        sorted([3, 1, 2])  # not torch's

    assert torch_calls(work) == 5
    assert sys.getprofile() is None


def test_busy_threads_run_while_inside_and_the_switch_interval_comes_back() -> None:
    before = sys.getswitchinterval()
    alive = threading.active_count()
    with busy_threads(2, switch_ms=1.0):
        assert sys.getswitchinterval() == pytest.approx(0.001)
        assert threading.active_count() == alive + 2
    assert sys.getswitchinterval() == before
    assert threading.active_count() == alive
