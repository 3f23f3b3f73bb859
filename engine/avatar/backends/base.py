"""The frame-backend protocol and backend selection.

A backend renders a batch of parameter vectors ``[B, P]`` into uint8 RGBA
frames ``[B, H, W, 4]`` (premultiplied alpha) for one output profile.
``select_backend`` picks one by name or, for 'auto', by availability:
TensorRT if a matching plan exists and ``tensorrt`` imports, else CUDA graphs if
CUDA is available, else torch on the CPU. ONNX Runtime only when asked for.
"""

from __future__ import annotations

import logging
from typing import Protocol, runtime_checkable

import numpy as np

log = logging.getLogger(__name__)

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


def select_backend(
    name: str = "auto",
    profile: str = "720p",
    character: str = "builtin:default",
    plan_dir: str = "trt_plans",
) -> FrameBackend:
    """Build the backend ``name`` ('auto', 'torch', 'cuda-graph', 'onnxruntime', 'tensorrt') for ``profile``."""
    from engine.avatar.character import load_character

    if name not in ("auto", *BACKENDS):
        raise ValueError(f"unknown frame backend {name!r} (expected auto or one of {', '.join(BACKENDS)})")
    char = load_character(character)
    if name == "auto":
        reasons = []
        try:
            from engine.avatar.backends.tensorrt import TensorRTBackend

            return TensorRTBackend.from_plans(char, profile, plan_dir=plan_dir)
        except BackendUnavailable as e:
            reasons.append(f"tensorrt: {e}")
        try:
            from engine.avatar.backends.cuda_graph import CudaGraphBackend

            return CudaGraphBackend(char, profile)
        except BackendUnavailable as e:
            reasons.append(f"cuda-graph: {e}")
        log.info("frame backend: torch CPU (%s)", "; ".join(reasons))
        name = "torch"
    if name == "torch":
        from engine.avatar.backends.torch_cpu import TorchBackend

        return TorchBackend(char, profile)
    if name == "cuda-graph":
        from engine.avatar.backends.cuda_graph import CudaGraphBackend

        return CudaGraphBackend(char, profile)
    if name == "onnxruntime":
        from engine.avatar.backends.onnx_runtime import OnnxRuntimeBackend

        return OnnxRuntimeBackend(char, profile)
    from engine.avatar.backends.tensorrt import TensorRTBackend

    return TensorRTBackend.from_plans(char, profile, plan_dir=plan_dir)
