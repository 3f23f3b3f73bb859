"""Choose and load the configured TTS backend (imported lazily: loading pulls in onnxruntime)."""

from __future__ import annotations

from engine.progress import Progress
from engine.tts.base import TTS
from engine.tts.config import TTSConfig


def load_tts(config: TTSConfig, progress: Progress) -> TTS:
    """Load the voice named by ``config`` once, warmed up, behind the :class:`TTS` seam."""
    if config.backend == "piper":
        from engine.tts.piper_backend import load_piper

        return load_piper(config, progress)
    raise ValueError(f"tts.backend: unknown backend {config.backend!r}")
