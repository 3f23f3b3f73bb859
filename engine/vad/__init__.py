"""Voice activity detection on the host's microphone.

The detector itself lives in :mod:`engine.vad.silero` (imported on demand: it
loads onnxruntime); this package exports only the light result types.
"""

from engine.vad.results import (
    VADEndOfTurn,
    VADResult,
    VADSpeechPaused,
    VADSpeechResumed,
    VADSpeechStarted,
)

__all__ = ["VADEndOfTurn", "VADResult", "VADSpeechPaused", "VADSpeechResumed", "VADSpeechStarted"]
