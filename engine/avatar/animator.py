"""The animator: one parameter vector per video frame, for that frame's presentation time.

Inputs arrive from the session loop (speech chunks with their playback start on the
media clock, barge-in, expressions, gestures); :meth:`Animator.params_at` is called
from the render worker for each frame's pts. Each mutation builds a new immutable
:class:`_State` under a lock and swaps it in; a render call reads one snapshot, so
the loop and the renderer never see a half-updated state. Nothing reads the wall
clock: the result is a pure function of the calls made, the times given and the seed.

Lip timing
----------
The mouth for the frame stamped ``t`` is the speech at *mouth time*::

    mouth_time(t) = t + articulation_lead + compensation

* ``articulation_lead`` (config ``avatar.articulation_lead_ms``, default 20 ms): in
  natural speech the lips move slightly before the sound (most visibly for /p b m/),
  so the frame at ``t`` shows the shape for the sound a little ahead.
* ``compensation`` (lip-phase compensation, passed per call by the video track):
  aiortc stamps both tracks from the session clock (RTP ts = origin + pts·rate), but
  a receiver lines the two streams up through RTCP sender reports, which pair the
  wall clock *at send time* with the RTP timestamp of the last packet sent. If the
  frame with pts ``t`` leaves ``D`` seconds later than audio with the same pts (render
  + encode minus the audio path's own delay), the video report maps pts ``t`` to
  wall time ``t + D`` and the receiver plays that frame together with the audio
  stamped ``t + D``. So that frame must show the mouth for ``t + D``: pass
  ``compensation = D``, the measured (smoothed) extra send delay of video over
  audio; positive when video is slower. A track that renders ahead of its send time
  so that ``D ≈ 0`` passes 0. The receiver-side offset (``engine.lipsync.measure``)
  closes the loop: it should read ≈ −articulation_lead plus the TTS alignments' own
  bias (Piper's trail the sound by 10–25 ms: about −5 ms in all with the default lead).

Parameters written: the 15 viseme weights (they carry the jaw: ``mouth_open`` is left at
rest, the renderer adds it on top of the visemes), expr_* weights (the renderer draws
the face from them; the animator only adds a little head posture), and the scalars of
idle motion and gestures.

Barge-in: :meth:`Animator.interrupt` at ``t`` (the pts where the audio stops) cuts
every scheduled chunk at mouth time ``t``: the mouth eases shut over ``close_s``
(80 ms) from there, i.e. on the frame that plays with the last audible sample,
chunks starting at or after ``t`` are dropped, and later chunks of an interrupted
turn starting after its cut are refused.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from engine.avatar.config import AvatarConfig
from engine.avatar.motion import GESTURE_LIBRARY, IdleMotion, MotionPrimitive, ease_in_out
from engine.avatar.params import (
    EXPR_SLICE,
    EXPRESSIONS,
    INDEX,
    NUM_PARAMS,
    VISEME_SLICE,
    clamp,
    default_params,
)
from engine.events import PhonemeSpan, SpeechAudio
from engine.lipsync.timeline import AmplitudeTimeline, MouthTimeline, VisemeTimeline, openness
from engine.lipsync.visemes import NUM_VISEMES, SIL

# Posture each expression adds at full weight. The face itself (mouth corners, brows,
# eyes, blush) is drawn by the renderer from the expr_* weights, so no face scalars here.
_EXPRESSION_SCALARS: dict[str, dict[str, float]] = {
    "neutral": {},
    "happy": {"head_pitch": -0.04},
    "sad": {"gaze_y": -0.2, "head_pitch": 0.12},
    "angry": {"head_pitch": 0.08},
    "surprised": {"head_pitch": -0.08},
}
EXPRESSION_SCALARS = np.zeros((len(EXPRESSIONS), NUM_PARAMS), dtype=np.float32)
for _i, _e in enumerate(EXPRESSIONS):
    for _name, _v in _EXPRESSION_SCALARS[_e].items():
        EXPRESSION_SCALARS[_i, INDEX[_name]] = _v

_HISTORY_S = 10.0  # keep past items this long, for frames rendered a little behind
_SIL_VEC = np.eye(NUM_VISEMES, dtype=np.float32)[SIL]


@dataclass(frozen=True)
class _Speech:
    start_t: float
    timeline: MouthTimeline
    turn_id: int
    index: int
    cut_t: float = math.inf  # mouth time where the closing fade starts

    @property
    def end_t(self) -> float:
        return self.start_t + self.timeline.duration_s


@dataclass(frozen=True)
class _Fade:
    t0: float
    src: np.ndarray
    dst: np.ndarray


@dataclass(frozen=True)
class _Gesture:
    start_t: float
    primitive: MotionPrimitive

    @property
    def end_t(self) -> float:
        return self.start_t + self.primitive.duration_s


@dataclass(frozen=True)
class _State:
    speech: tuple[_Speech, ...] = ()
    fades: tuple[_Fade, ...] = ()
    gestures: tuple[_Gesture, ...] = ()
    cuts: tuple[tuple[int, float], ...] = ()  # (turn_id, cut time), most recent last
    base_expression: str = "neutral"


def _one_hot_expression(name: str) -> np.ndarray:
    if name not in EXPRESSIONS:
        raise ValueError(f"unknown expression {name!r}; expected one of {', '.join(EXPRESSIONS)}")
    vec = np.zeros(len(EXPRESSIONS), dtype=np.float32)
    vec[EXPRESSIONS.index(name)] = 1.0
    return vec


class Animator:
    """Speech, barge-in, expressions, gestures and idle motion → parameter vectors."""

    def __init__(
        self,
        *,
        articulation_lead_s: float = 0.02,
        seed: int | None = None,
        rng: np.random.Generator | None = None,
        expression_fade_s: float = 0.25,
        close_s: float = 0.08,
    ) -> None:
        self.articulation_lead_s = articulation_lead_s
        self.expression_fade_s = expression_fade_s
        self.close_s = close_s
        self._idle = IdleMotion(rng if rng is not None else np.random.default_rng(seed))
        self._state = _State()
        self._lock = threading.Lock()

    @classmethod
    def from_config(cls, config: AvatarConfig, seed: int | None = None) -> Animator:
        """Build from the ``avatar`` config section (``articulation_lead_ms``)."""
        return cls(articulation_lead_s=config.articulation_lead_ms / 1000.0, seed=seed)

    # ---- inputs (session loop) ------------------------------------------------------

    def schedule_speech(
        self,
        start_t: float,
        phonemes: Sequence[PhonemeSpan],
        pcm: np.ndarray | None = None,
        sample_rate: int = 48000,
        *,
        turn_id: int,
        index: int = 0,
    ) -> bool:
        """Animate a chunk whose first sample plays at ``start_t`` on the media clock.

        Uses the phoneme alignments, or the audio envelope of ``pcm`` when there are none.
        Returns False (and animates nothing) for an empty chunk or a chunk of an
        interrupted turn that would start after its cut.
        """
        timeline: MouthTimeline
        if phonemes:
            timeline = VisemeTimeline(phonemes)
        elif pcm is not None and len(pcm):
            timeline = AmplitudeTimeline(pcm, sample_rate)
        else:
            return False
        with self._lock:
            st = self._state
            cut = min((c for tid, c in st.cuts if tid == turn_id), default=math.inf)
            if start_t >= cut:
                return False
            keep = tuple(s for s in st.speech if s.end_t > start_t - _HISTORY_S)
            item = _Speech(start_t, timeline, turn_id, index, cut_t=cut)
            self._state = replace(st, speech=(*keep, item))
        return True

    def schedule_audio(self, start_t: float, audio: SpeechAudio) -> bool:
        """:meth:`schedule_speech` for a :class:`~engine.events.SpeechAudio` event."""
        return self.schedule_speech(
            start_t, audio.phonemes, audio.pcm, audio.sample_rate, turn_id=audio.turn_id, index=audio.index
        )

    def interrupt(self, t: float, turn_id: int | None = None) -> None:
        """Barge-in at pts ``t``: the mouth eases shut from mouth time ``t``; later speech is dropped.

        Every turn with scheduled speech is cut at ``t``; pass ``turn_id`` to also cut a
        turn none of whose chunks has been scheduled yet.
        """
        with self._lock:
            st = self._state
            speech = tuple(replace(s, cut_t=min(s.cut_t, t)) for s in st.speech if s.start_t < t)
            turns = {s.turn_id for s in st.speech} | ({turn_id} if turn_id is not None else set())
            earlier = {tid: c for tid, c in st.cuts if tid in turns}
            cuts = tuple((tid, c) for tid, c in st.cuts if tid not in turns)
            cuts = (*cuts, *((tid, min(t, earlier.get(tid, t))) for tid in sorted(turns)))[-32:]
            self._state = replace(st, speech=speech, cuts=cuts)

    def set_expression(self, name: str, t: float, hold_s: float | None = None) -> None:
        """Cross-fade to ``name`` from ``t`` over ``expression_fade_s``.

        With ``hold_s`` the face returns to the base expression (the last one set
        without a hold) ``hold_s`` seconds later; without it ``name`` becomes the base.
        """
        dst = _one_hot_expression(name)
        with self._lock:
            st = self._state
            fades = tuple(f for f in st.fades if f.t0 <= t)
            src = self._expression(fades, t)
            fades = (*self._prune_fades(fades, t), _Fade(t, src, dst))
            base = st.base_expression
            if hold_s is None:
                base = name
            else:
                back = t + max(hold_s, 0.0)
                fades = (*fades, _Fade(back, self._expression(fades, back), _one_hot_expression(base)))
            self._state = replace(st, fades=fades, base_expression=base)

    def trigger_gesture(self, name: str, t: float) -> float:
        """Play gesture ``name`` from ``t`` (queued after a running one of the same name).

        Returns the time it actually starts.
        """
        primitive = GESTURE_LIBRARY.get(name)
        if primitive is None:
            raise ValueError(
                f"unknown gesture {name!r}; expected one of {', '.join(sorted(GESTURE_LIBRARY))}"
            )
        with self._lock:
            st = self._state
            start = max([t, *(g.end_t for g in st.gestures if g.primitive.name == name and g.end_t > t)])
            keep = tuple(g for g in st.gestures if g.end_t > t - _HISTORY_S)
            self._state = replace(st, gestures=(*keep, _Gesture(start, primitive)))
        return start

    # ---- output (render worker) -----------------------------------------------------

    def mouth_time(self, t: float, compensation_s: float = 0.0) -> float:
        """The speech time whose mouth the frame stamped ``t`` shows (see the module docstring)."""
        return t + self.articulation_lead_s + compensation_s

    def params_at(self, t: float, compensation_s: float = 0.0) -> np.ndarray:
        """The parameter vector (float32 ``[NUM_PARAMS]``) for the frame presented at ``t``."""
        st = self._state  # one immutable snapshot for the whole frame
        mt = self.mouth_time(t, compensation_s)
        p = default_params()
        mouth = self._mouth(st, mt)
        p[VISEME_SLICE] = mouth  # the visemes carry the jaw; mouth_open stays free (an extra opening)
        jaw = float(openness(mouth))
        expr = self._expression(st.fades, t)
        p[EXPR_SLICE] = expr
        p += expr @ EXPRESSION_SCALARS
        talking = self._talking(st, mt)
        p[INDEX["head_pitch"]] += 0.05 * talking * jaw
        self._idle.apply(p, t, talking)
        for g in st.gestures:
            if g.start_t <= t <= g.end_t:
                for name, offset in g.primitive.offsets(t - g.start_t).items():
                    p[INDEX[name]] += offset
        return clamp(p)

    def params_many(self, ts: Sequence[float] | np.ndarray, compensation_s: float = 0.0) -> np.ndarray:
        """``[len(ts), NUM_PARAMS]`` for a batch of frame times."""
        out = np.empty((len(ts), NUM_PARAMS), dtype=np.float32)
        for i, t in enumerate(ts):
            out[i] = self.params_at(t, compensation_s)
        return out

    # ---- internals ------------------------------------------------------------------

    def _mouth(self, st: _State, mt: float) -> np.ndarray:
        voiced = np.zeros(NUM_VISEMES, dtype=np.float32)
        for s in st.speech:
            tau = mt - s.start_t
            if tau <= 0.0 or tau >= s.timeline.duration_s or mt >= s.cut_t + self.close_s:
                continue
            w = s.timeline.weights_at(tau)
            gain = 1.0 - ease_in_out((mt - s.cut_t) / self.close_s) if mt > s.cut_t else 1.0
            w = gain * w
            w[SIL] = 0.0
            voiced += w
        total = float(voiced.sum())
        if total > 1.0:
            voiced /= total
            total = 1.0
        return voiced + (1.0 - total) * _SIL_VEC

    def _talking(self, st: _State, mt: float) -> float:
        level = 0.0
        for s in st.speech:
            end = min(s.end_t, s.cut_t + self.close_s)
            rise = ease_in_out((mt - s.start_t + 0.15) / 0.3)
            fall = 1.0 - ease_in_out((mt - end) / 0.5)
            level = max(level, rise * fall)
        return level

    def _expression(self, fades: Sequence[_Fade], t: float) -> np.ndarray:
        current = None
        for f in fades:
            if f.t0 <= t:
                current = f
        if current is None:
            return _one_hot_expression("neutral")
        x = ease_in_out((t - current.t0) / max(self.expression_fade_s, 1e-6))
        return np.asarray(current.src + (current.dst - current.src) * x, dtype=np.float32)

    @staticmethod
    def _prune_fades(fades: tuple[_Fade, ...], t: float) -> tuple[_Fade, ...]:
        old = [i for i, f in enumerate(fades) if f.t0 < t - _HISTORY_S]
        return fades[old[-1] :] if old else fades
