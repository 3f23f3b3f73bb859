"""Voice activity detection on the host's microphone.

:class:`~engine.vad.base.VoiceActivity` is what the session needs from a detector; the one
implementation lives in :mod:`engine.vad.silero` (imported on demand: it loads onnxruntime). This
package exports only the light protocol and result types.
"""

from engine.vad.base import VoiceActivity
from engine.vad.results import (
    VADEndOfTurn,
    VADResult,
    VADSpeechPaused,
    VADSpeechResumed,
    VADSpeechStarted,
)

__all__ = [
    "VADEndOfTurn",
    "VADResult",
    "VADSpeechPaused",
    "VADSpeechResumed",
    "VADSpeechStarted",
    "VoiceActivity",
]
