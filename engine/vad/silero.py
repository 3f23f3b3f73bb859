"""Silero VAD (ONNX) as a per-session, sample-clocked turn detector.

One :class:`SileroModel` (an onnxruntime session, thread-safe for ``run``) is
loaded once and shared; each :class:`VoiceActivityDetector` keeps its own
recurrent state and 64-sample context, which is all the state silero's own
``OnnxWrapper`` keeps. Times come from the samples fed, never from wall time.
"""

from __future__ import annotations

import functools
import logging
from collections import deque
from enum import Enum

import numpy as np
import onnxruntime

from engine.vad.config import VADConfig
from engine.vad.results import (
    VADEndOfTurn,
    VADResult,
    VADSpeechPaused,
    VADSpeechResumed,
    VADSpeechStarted,
)

log = logging.getLogger(__name__)

SAMPLE_RATE = 16000
WINDOW = 512  # samples per model call at 16 kHz (32 ms)
CONTEXT = 64  # samples of the previous window the model sees
RESYNC_TOLERANCE_S = 0.02  # a piece whose time is further off than this re-anchors the buffer
BLOCK = 128  # samples per loudness block (8 ms) for placing the end of speech
NOISE_FLOOR_RMS = 0.002  # about -54 dBFS: quieter than any voice the end of speech is placed on


class SileroModel:
    """The shared silero ONNX session; per-stream state lives in the detector."""

    def __init__(self, session: onnxruntime.InferenceSession) -> None:
        self.session = session
        self._sr = np.array(SAMPLE_RATE, dtype=np.int64)

    @classmethod
    def load(cls) -> SileroModel:
        """Load the model bundled with ``silero-vad`` (keeps torch's thread count intact)."""
        import torch

        threads = torch.get_num_threads()
        try:
            from silero_vad import load_silero_vad
        finally:
            torch.set_num_threads(threads)
        wrapper = load_silero_vad(onnx=True)
        return cls(wrapper.session)

    def run(self, frame: np.ndarray, state: np.ndarray) -> tuple[float, np.ndarray]:
        """Speech probability of one (1, CONTEXT + WINDOW) frame, and the next state."""
        out, new_state = self.session.run(None, {"input": frame, "state": state, "sr": self._sr})
        return float(out[0, 0]), new_state


@functools.lru_cache(maxsize=1)
def shared_silero_model() -> SileroModel:
    """The process-wide silero model, loaded on first use."""
    return SileroModel.load()


class _Phase(Enum):
    IDLE = "idle"  # no turn in progress (maybe a candidate onset)
    SPEECH = "speech"
    SILENCE = "silence"  # silence inside a turn, before the end of turn


class VoiceActivityDetector:
    """Feed 16 kHz mono float32 pieces of any length; get typed VAD results back.

    Speech starts when the probability reaches ``threshold`` and stays above
    ``threshold - hysteresis`` for ``min_speech_ms``; inside a turn, silence is a
    probability below ``threshold - hysteresis``, and only ``threshold`` resumes
    speech. A synchronous, cheap (~0.3 ms per 32 ms window) class: the caller
    chooses whether to run it on the loop.
    """

    def __init__(self, config: VADConfig | None = None, model: SileroModel | None = None) -> None:
        self.config = config or VADConfig.model_validate({})
        self.model = model or shared_silero_model()
        self._on = self.config.threshold
        self._off = max(0.01, self.config.threshold - self.config.hysteresis)
        self._min_speech_s = self.config.min_speech_ms / 1000
        self._pause_s = self.config.pause_ms / 1000
        self._eot_s = self.config.end_of_turn_silence_ms / 1000
        self._refine_s = self.config.end_refine_ms / 1000
        self._quiet_ratio = 10 ** (self.config.end_quiet_db / 20)
        keep = int(self._refine_s * SAMPLE_RATE) // BLOCK + 2 * WINDOW // BLOCK
        self._blocks: deque[tuple[float, float]] = deque(maxlen=keep)
        self.reset()

    def reset(self) -> None:
        """Forget all audio and model state (a new session or a discontinuity)."""
        self._state = np.zeros((2, 1, 128), dtype=np.float32)
        self._frame = np.zeros((1, CONTEXT + WINDOW), dtype=np.float32)
        self._pending = np.zeros(0, dtype=np.float32)
        self._anchor_t = 0.0  # clock time of the sample that `_consumed` counts from
        self._consumed = 0  # samples run through the model since the anchor
        self._phase = _Phase.IDLE
        self._onset: float | None = None
        self._turn_start = 0.0
        self._silence_start = 0.0
        self._paused = False
        self._peak_rms = 0.0  # the loudest 8 ms block of the current turn's speech
        # (silence start, its end-of-turn silence in s): set by end_turn_sooner for that silence only
        self._sooner: tuple[float, float] | None = None
        self._blocks.clear()  # (end time, rms) of the latest 8 ms blocks
        self.last_probability = 0.0
        # the current run of windows at or above the threshold: its first window's start and the latest's end
        self._voiced_from: float | None = None
        self._voiced_to = 0.0

    @property
    def voiced_since(self) -> float | None:
        """When the current run of speech windows (probability at or above ``threshold``) began, or None."""
        return self._voiced_from

    @property
    def voiced_s(self) -> float:
        """How long the current run of speech windows has lasted, by the windows' own times (0 outside one)."""
        return 0.0 if self._voiced_from is None else self._voiced_to - self._voiced_from

    @property
    def in_turn(self) -> bool:
        """True from speech start until the end of the turn."""
        return self._phase is not _Phase.IDLE

    @property
    def speaking(self) -> bool:
        """True while the latest window was speech inside a turn."""
        return self._phase is _Phase.SPEECH

    @property
    def turn_start_t(self) -> float | None:
        """When the current turn's speech started, or None outside a turn."""
        return self._turn_start if self.in_turn else None

    @property
    def next_sample_t(self) -> float:
        """The clock time the next fed sample is expected to have."""
        return self._time_of(self._consumed + len(self._pending))

    def _time_of(self, sample: int) -> float:
        return self._anchor_t + sample / SAMPLE_RATE

    def feed(self, audio: np.ndarray, t: float) -> list[VADResult]:
        """Add ``audio`` whose first sample is at clock time ``t``; return what happened."""
        audio = np.asarray(audio, dtype=np.float32).reshape(-1)
        if abs(t - self.next_sample_t) > RESYNC_TOLERANCE_S:
            if self._consumed or len(self._pending):
                log.debug("vad: audio discontinuity of %.3fs; re-anchoring", t - self.next_sample_t)
            self._pending = self._pending[:0]
            self._anchor_t, self._consumed = t, 0
        self._pending = np.concatenate((self._pending, audio)) if len(self._pending) else audio.copy()
        results: list[VADResult] = []
        n_windows = len(self._pending) // WINDOW
        for i in range(n_windows):
            window = self._pending[i * WINDOW : (i + 1) * WINDOW]
            first = self._consumed + i * WINDOW
            self._step(window, self._time_of(first), self._time_of(first + WINDOW), results)
        if n_windows:
            used = n_windows * WINDOW
            self._pending = self._pending[used:].copy()
            self._consumed += used
        return results

    def _step(self, window: np.ndarray, start: float, end: float, results: list[VADResult]) -> None:
        frame = self._frame
        frame[0, :CONTEXT] = frame[0, -CONTEXT:]
        frame[0, CONTEXT:] = window
        p, self._state = self.model.run(frame, self._state)
        self.last_probability = p
        if p >= self._on:
            if self._voiced_from is None:
                self._voiced_from = start
            self._voiced_to = end
        else:
            self._voiced_from = None
        rms = np.sqrt(np.mean(window.reshape(-1, BLOCK) ** 2, axis=1))
        for k, r in enumerate(rms):
            self._blocks.append((start + (k + 1) * BLOCK / SAMPLE_RATE, float(r)))
        if self._phase is _Phase.SPEECH:
            self._peak_rms = max(self._peak_rms, float(rms.max()))

        if self._phase is _Phase.IDLE:
            if p >= self._on:
                if self._onset is None:
                    self._onset = start
            elif p < self._off:
                self._onset = None
            if self._onset is not None and end - self._onset >= self._min_speech_s:
                self._phase = _Phase.SPEECH
                self._turn_start = self._onset
                self._onset = None
                self._peak_rms = max((r for e, r in self._blocks if e > self._turn_start), default=0.0)
                results.append(VADSpeechStarted(t=self._turn_start, detected_t=end))
            return

        if self._phase is _Phase.SPEECH:
            if p >= self._off:
                return
            self._phase = _Phase.SILENCE
            self._silence_start = self._speech_fell_silent(start)
            self._paused = False
        elif p >= self._on:  # silence inside a turn, and speech is back
            self._phase = _Phase.SPEECH
            if self._paused:
                results.append(VADSpeechResumed(t=start, detected_t=end))
            return

        silent_for = end - self._silence_start
        eot_s = self._eot_s
        sooner = self._sooner  # one read: set from another thread
        if sooner is not None and sooner[0] == self._silence_start:
            eot_s = min(eot_s, sooner[1])
        if not self._paused and (silent_for >= self._pause_s or silent_for >= eot_s):
            self._paused = True
            results.append(VADSpeechPaused(t=self._silence_start, detected_t=end))
        if silent_for >= eot_s:
            self._phase = _Phase.IDLE
            results.append(
                VADEndOfTurn(
                    t=end,
                    detected_t=end,
                    speech_start_t=self._turn_start,
                    speech_end_t=self._silence_start,
                )
            )

    def end_turn_sooner(self, silence_start: float, silence_ms: float) -> None:
        """Let the silence that began at ``silence_start`` (a :class:`VADSpeechPaused`'s ``t``) end the
        turn after ``silence_ms`` instead of ``end_of_turn_silence_ms`` (when the words so far read as
        a finished question). Safe to call from another thread than :meth:`feed`'s; a silence that has
        already ended, by speech or by the end of the turn, is left alone."""
        self._sooner = (silence_start, silence_ms / 1000)

    def _speech_fell_silent(self, flagged: float) -> float:
        """When the speech really stopped, given that silero flagged silence from ``flagged`` on.

        Silero's probability is smoothed by its recurrent state and falls 50-140 ms after the voice does
        (measured on the bench's questions). Inside that lag the loudness says where the voice ended:
        the end of the last 8 ms block (up to the end of the flagged window) no quieter than the turn's
        loudest block by more than ``end_quiet_db`` and louder than a noise floor, at most
        ``end_refine_ms`` before ``flagged``. In a noisy room every block is loud and the end lands
        on the flagged window's end at the latest.
        """
        if self._refine_s <= 0 or self._peak_rms <= 0:
            return flagged
        quiet = max(self._peak_rms * self._quiet_ratio, NOISE_FLOOR_RMS)
        earliest = max(flagged - self._refine_s, self._turn_start)
        # the flagged window counts too: a last plosive burst ("fact") can come after silero's flag
        last_loud = max((e for e, r in self._blocks if r >= quiet), default=None)
        if last_loud is None:
            return earliest
        return max(last_loud, earliest)
