"""The frame-backend protocol.

A backend renders a batch of parameter vectors ``[B, P]`` into uint8 RGBA
frames ``[B, H, W, 4]`` (premultiplied alpha) for one output profile.
Choosing one is :mod:`engine.avatar.backends.select`'s job.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import numpy as np

BACKENDS: tuple[str, ...] = ("torch", "cuda-graph", "onnxruntime", "tensorrt")


class BackendUnavailable(RuntimeError):
    """The requested backend cannot run here; the message says why."""


@runtime_checkable
class FrameBackend(Protocol):
    """Renders ``params [B, P]`` float32 to uint8 ``[B, H, W, 4]`` premultiplied RGBA."""

    name: str
    profile: str
    width: int
    height: int

    def render(self, params: np.ndarray) -> np.ndarray:
        """Frames for a batch. The array may be reused by the backend after a few more calls
        (see each backend's ``ring``); copy it to keep it longer."""
        ...
