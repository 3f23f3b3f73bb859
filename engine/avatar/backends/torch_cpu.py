"""Plain torch on the CPU: the generator's eager fast path writing uint8 frames in place."""

from __future__ import annotations

import numpy as np
import torch

from engine.avatar.character import Character
from engine.avatar.generator import FrameGenerator
from engine.avatar.params import NUM_PARAMS
from engine.avatar.profiles import profile_name


class TorchBackend:
    """CPU rendering through :meth:`FrameGenerator.render_into` into a small ring of frame buffers.

    Only the moving region is rewritten each frame; the rest of each buffer keeps the static art.
    A returned array is rendered into again ``ring`` calls later.
    """

    name = "torch"

    def __init__(
        self,
        character: Character,
        profile: str | tuple[int, int] = "720p",
        ring: int = 3,
        threads: int | None = None,
    ) -> None:
        if threads is not None:
            torch.set_num_threads(threads)
        self.generator = FrameGenerator(character, profile).eval()
        self.width, self.height = self.generator.width, self.generator.height
        self.profile = profile_name(self.width, self.height)
        self.ring = ring
        self._buffers: dict[int, list[np.ndarray]] = {}
        self._next: dict[int, int] = {}

    def render(self, params: np.ndarray) -> np.ndarray:
        params = np.asarray(params, dtype=np.float32).reshape(-1, NUM_PARAMS)
        b = params.shape[0]
        if b not in self._buffers:
            self._buffers[b] = [self.generator.new_frames(b) for _ in range(self.ring)]
            self._next[b] = 0
        i = self._next[b]
        self._next[b] = (i + 1) % self.ring
        return self.generator.render_into(self._buffers[b][i], params)
