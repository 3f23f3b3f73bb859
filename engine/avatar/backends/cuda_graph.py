"""CUDA with CUDA-graph replay: one captured graph per batch bucket (static shapes per profile).

The whole step — parameters in, generator forward, float → uint8 HWC — is
captured once per bucket after a warm-up on a side stream; a frame is then
``copy params in → graph.replay() → copy frames out`` (pinned host memory).
Several sessions on one GPU are rendered by stacking their parameter rows into
one batch, padded up to the next bucket (1, 2, 4, … ``max_batch``); more rows than
``max_batch`` are rendered ``max_batch`` at a time.

Every bucket is captured when the backend is made, before any session exists. A
capture made later, while the ASR or LLM threads launch work on the same GPU,
breaks both (``cudaErrorStreamCaptureUnsupported`` in the other thread, then an
invalidated capture): found with 16 sessions on the H200 (docs/PERFORMANCE.md).

The buckets share one memory pool, captured largest first: each replay's working set (the layers'
float intermediates, tens of MB a row at 720p) is then the largest bucket's alone, not the sum over
every bucket (1 + 2 + 4 + … rows). Sharing is safe because the replays are never concurrent (one
render thread) and a bucket's frames are read before the next replay: :meth:`render` copies them to
host memory and waits; :meth:`render_tensor`'s view is valid until the next replay of *any* bucket.
The engine sizes ``max_batch`` by ``server.max_sessions`` (a batch holds one frame a session).
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
    def __init__(self, gen: FrameGenerator, batch: int, device: torch.device, pool: Any = None) -> None:
        self.params = torch.zeros(batch, NUM_PARAMS, device=device)
        self.params[:] = torch.from_numpy(_rest()).to(device)
        stream = torch.cuda.Stream(device)
        stream.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(stream), torch.no_grad():
            for _ in range(3):  # warm-up: allocator pools, cuDNN/kernels picked outside the capture
                self.frames = to_uint8(gen(self.params))
        torch.cuda.current_stream(device).wait_stream(stream)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph, pool=pool, capture_error_mode="thread_local"), torch.no_grad():
            self.frames = to_uint8(gen(self.params))
        self.host = [torch.empty(self.frames.shape, dtype=torch.uint8, pin_memory=True) for _ in range(2)]
        self.turn = 0


def _rest() -> np.ndarray:
    from engine.avatar.params import DEFAULTS

    return DEFAULTS[None]


def buckets(max_batch: int) -> tuple[int, ...]:
    """Batch sizes captured: powers of two below ``max_batch``, then ``max_batch`` itself."""
    sizes = [1]
    while sizes[-1] * 2 < max_batch:
        sizes.append(sizes[-1] * 2)
    if max_batch > 1:
        sizes.append(max_batch)
    return tuple(sizes)


class CudaGraphBackend:
    """The generator on a CUDA device, replayed from per-batch CUDA graphs."""

    name = "cuda-graph"

    def __init__(
        self,
        character: Character,
        profile: str | tuple[int, int] = "720p",
        device: str = "cuda",
        max_batch: int = 32,
        share_pool: bool = True,
    ) -> None:
        if not torch.cuda.is_available():
            raise BackendUnavailable("CUDA is not available (torch.cuda.is_available() is False)")
        self.device = torch.device(device)
        self.generator = FrameGenerator(character, profile).eval().to(self.device)
        self.width, self.height = self.generator.width, self.generator.height
        self.profile = profile_name(self.width, self.height)
        self.max_batch = max(1, max_batch)
        pool = torch.cuda.graph_pool_handle() if share_pool else None
        self._graphs: dict[int, _Captured] = {}
        for b in sorted(buckets(self.max_batch), reverse=True):  # the largest first: the pool fits it
            self._graphs[b] = _Captured(self.generator, b, self.device, pool)
        torch.cuda.empty_cache()  # the warm-ups' blocks, cached outside the graphs' pool, go back to the driver
        self.ring = 2
        # The frames' own stream, at the highest priority: a frame waits neither behind the LLM's and the
        # ASR's work queued in this process (the default stream) nor for it to finish, only for its own
        # replay and copy; the scheduler gives its blocks the SMs first as they free up.
        highest = torch.cuda.Stream.priority_range()[1]  # type: ignore[call-arg]  # a static method at run time
        self.stream = torch.cuda.Stream(self.device, priority=highest)

    def captured(self, batch: int) -> _Captured:
        """The graph of the smallest bucket holding ``batch`` rows (1 ≤ batch ≤ max_batch)."""
        return self._graphs[min(b for b in self._graphs if b >= batch)]

    def render_tensor(self, params: np.ndarray | torch.Tensor) -> torch.Tensor:
        """Frames left on the device: uint8 ``[B, H, W, 4]`` for ``B ≤ max_batch`` rows (a view of the
        bucket's output, overwritten by the next replay of any bucket: they share a pool), written on
        :attr:`stream`: another stream that reads them waits for it first
        (``other.wait_stream(backend.stream)``)."""
        p = torch.as_tensor(params, dtype=torch.float32).reshape(-1, NUM_PARAMS)
        if p.shape[0] > self.max_batch:
            raise ValueError(f"{p.shape[0]} rows in one replay; at most {self.max_batch} (use render)")
        cap = self.captured(p.shape[0])
        with torch.cuda.stream(self.stream):
            cap.params[: p.shape[0]].copy_(p, non_blocking=True)
            cap.graph.replay()
        return cap.frames[: p.shape[0]]

    def render(self, params: np.ndarray) -> np.ndarray:
        rows = np.asarray(params, dtype=np.float32).reshape(-1, NUM_PARAMS)
        if rows.shape[0] > self.max_batch:
            parts = [
                self.render(rows[i : i + self.max_batch]) for i in range(0, rows.shape[0], self.max_batch)
            ]
            return np.concatenate(parts)
        frames = self.render_tensor(rows)
        cap = self.captured(rows.shape[0])
        host = cap.host[cap.turn][: rows.shape[0]]
        cap.turn = (cap.turn + 1) % len(cap.host)
        with torch.cuda.stream(self.stream):
            host.copy_(frames, non_blocking=True)
        self.stream.synchronize()
        out: Any = host.numpy()
        return out
