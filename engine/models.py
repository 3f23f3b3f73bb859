"""The models an engine loads once and every session shares."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

from engine.asr.base import ASRModel
from engine.config import Settings
from engine.llm.base import LLM
from engine.progress import Progress, silent_progress
from engine.tts.base import TTS
from engine.vad.config import VADConfig
from engine.vad.silero import VoiceActivityDetector, shared_silero_model

log = logging.getLogger(__name__)


@dataclass
class EngineModels:
    asr: ASRModel
    llm: LLM
    tts: TTS
    new_vad: Callable[[], VoiceActivityDetector]

    def describe(self) -> dict[str, str]:
        return {"asr": self.asr.describe(), "llm": self.llm.describe(), "tts": self.tts.describe()}


def load_models(settings: Settings, progress: Progress = silent_progress) -> EngineModels:
    """Load VAD, ASR, LLM and TTS (blocking: call it from a worker thread in a server)."""
    from engine.asr.factory import load_asr
    from engine.llm.factory import load_llm
    from engine.tts.factory import load_tts

    new_vad = load_vad_factory(settings.vad, progress)
    asr = load_asr(settings.asr, progress)
    tts = load_tts(settings.tts, progress)
    llm = load_llm(settings.llm, progress)
    return EngineModels(asr=asr, llm=llm, tts=tts, new_vad=new_vad)


def load_vad_factory(
    config: VADConfig, progress: Progress = silent_progress
) -> Callable[[], VoiceActivityDetector]:
    """Load silero once; each session gets its own detector state."""
    progress("vad", "loading silero VAD (ONNX)")
    model = shared_silero_model()
    return lambda: VoiceActivityDetector(config, model)
