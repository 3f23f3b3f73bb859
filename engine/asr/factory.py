"""Build the configured ASR backend."""

from __future__ import annotations

from engine.asr.base import ASRModel
from engine.asr.config import ASRConfig
from engine.progress import Progress, silent_progress, timed


def load_asr(config: ASRConfig | None = None, progress: Progress = silent_progress) -> ASRModel:
    """Load the model named by ``config`` (a blocking call: run it at start-up or in a thread)."""
    config = config or ASRConfig.model_validate({})
    if config.backend == "faster-whisper":
        from engine.asr.faster_whisper import FasterWhisperASR

        with timed(progress, "asr", f"faster-whisper {config.model}"):
            return FasterWhisperASR.load(config)
    if config.backend == "transformers":
        from engine.asr.torch_whisper import TorchWhisperASR

        with timed(progress, "asr", f"transformers whisper {config.model}"):
            return TorchWhisperASR.load(config)
    raise ValueError(f"asr.backend: unknown backend {config.backend!r}")
