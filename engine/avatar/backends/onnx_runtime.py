"""ONNX Runtime: the exported generator graph, one session per batch size."""

from __future__ import annotations

import numpy as np

from engine.avatar.backends.base import BackendUnavailable
from engine.avatar.character import Character
from engine.avatar.export import INPUT_NAME, export_onnx
from engine.avatar.generator import FrameGenerator
from engine.avatar.params import NUM_PARAMS
from engine.avatar.profiles import profile_name


class OnnxRuntimeBackend:
    """Runs the exported graph with onnxruntime (CPU, or CUDA when its provider is installed)."""

    name = "onnxruntime"

    def __init__(
        self,
        character: Character,
        profile: str | tuple[int, int] = "720p",
        providers: list[str] | None = None,
        threads: int | None = None,
    ) -> None:
        try:
            import onnxruntime as ort
        except ImportError as e:  # pragma: no cover - a hard dependency
            raise BackendUnavailable(f"onnxruntime does not import: {e}") from e
        self._ort = ort
        self.generator = FrameGenerator(character, profile).eval()
        self.width, self.height = self.generator.width, self.generator.height
        self.profile = profile_name(self.width, self.height)
        self.providers = providers or [
            p for p in ("CUDAExecutionProvider", "CPUExecutionProvider") if p in ort.get_available_providers()
        ]
        self.threads = threads
        self._sessions: dict[int, object] = {}

    def session(self, batch: int) -> object:
        if batch not in self._sessions:
            opts = self._ort.SessionOptions()
            if self.threads:
                opts.intra_op_num_threads = self.threads
            model = export_onnx(self.generator, batch)
            self._sessions[batch] = self._ort.InferenceSession(model, opts, providers=self.providers)
        return self._sessions[batch]

    def render_float(self, params: np.ndarray) -> np.ndarray:
        """The raw graph output: float32 ``[B, 4, H, W]`` premultiplied."""
        p = np.ascontiguousarray(params, dtype=np.float32).reshape(-1, NUM_PARAMS)
        sess = self.session(p.shape[0])
        (out,) = sess.run(None, {INPUT_NAME: p})  # type: ignore[attr-defined]
        return np.asarray(out)

    def render(self, params: np.ndarray) -> np.ndarray:
        out = self.render_float(params)
        return (out.transpose(0, 2, 3, 1) * 255.0 + 0.5).clip(0, 255).astype(np.uint8)
