"""Backend selection: one by name or, for 'auto', by availability.

TensorRT if a matching plan exists and ``tensorrt`` imports, else CUDA graphs if
CUDA is available, else torch on the CPU. ONNX Runtime only when asked for.
The backends are imported lazily: each pulls in its own runtime (torch, CUDA, TensorRT).
"""

from __future__ import annotations

import logging

from engine.avatar.backends.base import BACKENDS, BackendUnavailable, FrameBackend
from engine.avatar.config import KernelMode
from engine.progress import Progress

log = logging.getLogger(__name__)


def select_backend(
    name: str = "auto",
    profile: str = "720p",
    character: str = "builtin:default",
    plan_dir: str = "trt_plans",
    cpu_kernels: KernelMode = "off",
    progress: Progress | None = None,
    max_batch: int = 32,
) -> FrameBackend:
    """Build the backend ``name`` ('auto', 'torch', 'cuda-graph', 'onnxruntime', 'tensorrt') for ``profile``.
    ``cpu_kernels``: the torch backend's face features compiled (``avatar.cpu_kernels``; seconds, reported to
    ``progress``); ``max_batch``: the most rows the CUDA-graph backend captures a graph for (the engine's
    ``server.max_sessions``: a batch holds a frame a session)."""
    from engine.avatar.loaders import load_character  # torch: only when a backend is built

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

            return CudaGraphBackend(char, profile, max_batch=max_batch)
        except BackendUnavailable as e:
            reasons.append(f"cuda-graph: {e}")
        log.info("frame backend: torch CPU (%s)", "; ".join(reasons))
        name = "torch"
    if name == "torch":
        from engine.avatar.backends.torch_cpu import TorchBackend

        return TorchBackend(char, profile, kernels=cpu_kernels, progress=progress)
    if name == "cuda-graph":
        from engine.avatar.backends.cuda_graph import CudaGraphBackend

        return CudaGraphBackend(char, profile, max_batch=max_batch)
    if name == "onnxruntime":
        from engine.avatar.backends.onnx_runtime import OnnxRuntimeBackend

        return OnnxRuntimeBackend(char, profile)
    from engine.avatar.backends.tensorrt import TensorRTBackend

    return TensorRTBackend.from_plans(char, profile, plan_dir=plan_dir)
