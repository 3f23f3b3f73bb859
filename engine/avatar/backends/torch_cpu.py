"""Plain torch on the CPU: the generator's art drawn by the uint8 dirty-box renderer."""

from __future__ import annotations

import numpy as np
import torch

from engine.avatar.character import Character
from engine.avatar.config import KernelMode
from engine.avatar.cpu_render import CpuRenderer, Damage
from engine.avatar.generator import FrameGenerator
from engine.avatar.params import NUM_PARAMS
from engine.avatar.profiles import profile_name
from engine.progress import Progress


class TorchBackend:
    """CPU rendering through :class:`~engine.avatar.cpu_render.CpuRenderer`: one uint8 frame buffer per
    batch slot, of which only the boxes that changed are redrawn (:attr:`damage` lists them).

    A returned array is rendered into again on the next call with the same batch size: copy what you keep.
    With ``kernels`` "auto" or "on" the face's features are compiled here (engine/avatar/kernels.py: seconds,
    ~45 s the first time on a machine; ``progress`` hears of it).
    """

    name = "torch"

    def __init__(
        self,
        character: Character,
        profile: str | tuple[int, int] = "720p",
        threads: int | None = None,
        kernels: KernelMode = "off",
        progress: Progress | None = None,
    ) -> None:
        if threads is not None:
            torch.set_num_threads(threads)
        self.generator = FrameGenerator(character, profile).eval()
        self.width, self.height = self.generator.width, self.generator.height
        self.profile = profile_name(self.width, self.height)
        self.renderer = CpuRenderer(self.generator, kernels=kernels)
        if kernels != "off":
            self.renderer.compile_features(progress)

    @property
    def damage(self) -> list[Damage]:
        """Per frame of the last batch: which boxes changed since that buffer's previous frame."""
        return self.renderer.damage

    def render(self, params: np.ndarray) -> np.ndarray:
        return self.renderer.render(np.asarray(params, dtype=np.float32).reshape(-1, NUM_PARAMS))

    def render_keyed(self, params: np.ndarray, keys: list[object]) -> list[np.ndarray]:
        """Each row into its key's own buffer (a session's: ``CpuRenderer.render_keyed``); the render pool
        calls this when it knows whose frame each row is."""
        return self.renderer.render_keyed(np.asarray(params, dtype=np.float32).reshape(-1, NUM_PARAMS), keys)
