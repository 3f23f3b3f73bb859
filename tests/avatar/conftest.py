"""Shared avatar fixtures: generators are built once per session (drawing the art takes a moment)."""

from __future__ import annotations

import functools

import pytest
import torch

from engine.avatar.generator import FrameGenerator
from engine.avatar.loaders import load_character

# Other processes share this machine's two cores: torch's intra-op threads then spin against each
# other and small-tensor ops get many times slower. One thread is faster and steadier here.
torch.set_num_threads(1)


@functools.lru_cache(maxsize=4)
def generator(profile: str = "360p") -> FrameGenerator:
    return FrameGenerator(load_character("builtin:default"), profile).eval()


@pytest.fixture(scope="session")
def gen360() -> FrameGenerator:
    return generator("360p")
