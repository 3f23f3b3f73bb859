"""Lip sync: phonemes → visemes, coarticulated mouth timelines, and receiver-side measurement.

* :mod:`engine.lipsync.visemes`: IPA (Piper / espeak-ng) → Oculus-style visemes.
* :mod:`engine.lipsync.timeline`: per-chunk mouth timelines (:class:`VisemeTimeline` from
  alignments, :class:`AmplitudeTimeline` from the audio when there are none).
* :mod:`engine.lipsync.measure`: mouth-vs-audio offset at the receiver, for the bench.

The animator (:mod:`engine.avatar.animator`) places timelines on the session clock.
"""

from engine.lipsync.measure import SyncOffset, estimate_offset, offsets_per_reply, summarize
from engine.lipsync.timeline import AmplitudeTimeline, MouthTimeline, VisemeTimeline, openness
from engine.lipsync.visemes import phonemes_to_visemes, viseme_of, viseme_target

__all__ = [
    "AmplitudeTimeline",
    "MouthTimeline",
    "SyncOffset",
    "VisemeTimeline",
    "estimate_offset",
    "offsets_per_reply",
    "openness",
    "phonemes_to_visemes",
    "summarize",
    "viseme_of",
    "viseme_target",
]
