"""Speech recognition: the ``ASRModel``/``TranscriptStream`` seam and its backends.

Importing this package stays light; :func:`load_asr` imports the backend on demand.
"""

from engine.asr.base import ASRModel, Transcript, TranscriptStream
from engine.asr.factory import load_asr

__all__ = ["ASRModel", "Transcript", "TranscriptStream", "load_asr"]
