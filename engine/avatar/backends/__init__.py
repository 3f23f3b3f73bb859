"""Frame backends: the same generator module run by torch (CPU), CUDA graphs, ONNX Runtime or TensorRT."""

from engine.avatar.backends.base import BACKENDS, BackendUnavailable, FrameBackend
from engine.avatar.backends.select import select_backend

__all__ = ["BACKENDS", "BackendUnavailable", "FrameBackend", "select_backend"]
