"""Silence trimming before a Whisper decode (no model imports: every decoder shares it)."""

from __future__ import annotations

import numpy as np

SAMPLE_RATE = 16000
FRAME_S = 0.02  # silence detection frame
SILENCE_RMS = 0.0005  # about -66 dBFS: quieter than this is silence (a quiet host's mic peaks near -50 dBFS:
# at the old -50 dBFS floor her whole question was trimmed away, and silero still heard speech: an unanswered turn)
RELATIVE_RMS = 0.03  # ... and so is anything 30 dB below the loudest frame
MIN_LOUD_S = 0.08  # less loud audio than this is not worth a decode


def loud_bounds(audio: np.ndarray) -> tuple[int, int, float] | None:
    """(first, end) sample of the non-silent part and its loud seconds; None if all silent."""
    hop = int(FRAME_S * SAMPLE_RATE)
    n = len(audio) // hop
    if n == 0:
        return None
    frames = audio[: n * hop].reshape(n, hop).astype(np.float32)
    rms = np.sqrt(np.mean(frames * frames, axis=1))
    floor = max(SILENCE_RMS, float(rms.max()) * RELATIVE_RMS)
    loud = np.flatnonzero(rms > floor)
    if len(loud) == 0 or len(loud) * FRAME_S < MIN_LOUD_S:
        return None
    return int(loud[0]) * hop, (int(loud[-1]) + 1) * hop, len(loud) * FRAME_S
