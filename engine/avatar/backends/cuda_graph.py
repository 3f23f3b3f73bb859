"""CUDA with CUDA-graph replay: one captured graph per batch size (static shapes per profile).

The whole step — parameters in, generator forward, float → uint8 HWC — is
captured once per batch size after a warm-up on a side stream; a frame is then
``copy params in → graph.replay() → copy frames out`` (pinned host memory).
Several sessions on one GPU are rendered by stacking their parameter rows into
one batch.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from engine.avatar.backends.base import BackendUnavailable
from engine.avatar.character import Character
from engine.avatar.generator import FrameGenerator, to_uint8
from engine.avatar.params import NUM_PARAMS
from engine.avatar.profiles import profile_name


class _Captured:
    def __init__(self, gen: FrameGenerator, batch: int, device: torch.device) -> None:
        self.params = torch.zeros(batch, NUM_PARAMS, device=device)
        self.params[:] = torch.from_numpy(_rest()).to(device)
        stream = torch.cuda.Stream(device)
        stream.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(stream), torch.no_grad():
            for _ in range(3):  # warm-up: allocator pools, cuDNN/kernels picked outside the capture
                self.frames = to_uint8(gen(self.params))
        torch.cuda.current_stream(device).wait_stream(stream)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph), torch.no_grad():
            self.frames = to_uint8(gen(self.params))
        self.host = [torch.empty(self.frames.shape, dtype=torch.uint8, pin_memory=True) for _ in range(2)]
        self.turn = 0


def _rest() -> np.ndarray:
    from engine.avatar.params import DEFAULTS

    return DEFAULTS[None]


class CudaGraphBackend:
    """The generator on a CUDA device, replayed from per-batch CUDA graphs."""

    name = "cuda-graph"

    def __init__(
        self, character: Character, profile: str | tuple[int, int] = "720p", device: str = "cuda"
    ) -> None:
        if not torch.cuda.is_available():
            raise BackendUnavailable("CUDA is not available (torch.cuda.is_available() is False)")
        self.device = torch.device(device)
        self.generator = FrameGenerator(character, profile).eval().to(self.device)
        self.width, self.height = self.generator.width, self.generator.height
        self.profile = profile_name(self.width, self.height)
        self._graphs: dict[int, _Captured] = {}
        self.ring = 2

    def captured(self, batch: int) -> _Captured:
        if batch not in self._graphs:
            self._graphs[batch] = _Captured(self.generator, batch, self.device)
        return self._graphs[batch]

    def render_tensor(self, params: np.ndarray | torch.Tensor) -> torch.Tensor:
        """Frames left on the device: uint8 ``[B, H, W, 4]`` (overwritten by the next replay)."""
        p = torch.as_tensor(params, dtype=torch.float32).reshape(-1, NUM_PARAMS)
        cap = self.captured(p.shape[0])
        cap.params.copy_(p, non_blocking=True)
        cap.graph.replay()
        return cap.frames

    def render(self, params: np.ndarray) -> np.ndarray:
        frames = self.render_tensor(params)
        cap = self._graphs[frames.shape[0]]
        host = cap.host[cap.turn]
        cap.turn = (cap.turn + 1) % len(cap.host)
        host.copy_(frames, non_blocking=True)
        torch.cuda.current_stream(self.device).synchronize()
        out: Any = host.numpy()
        return out
