"""The animation parameter vector: the one contract between the animator and the renderer.

The animator writes one float32 vector of length :data:`NUM_PARAMS` per output
frame; the frame generator (any backend) turns a batch ``[B, NUM_PARAMS]`` into
RGBA frames ``[B, 4, H, W]``. Indices are stable: add new parameters at the end.
"""

from __future__ import annotations

import numpy as np

# The vocabularies come from the stages that produce them: visemes from lipsync, expressions
# and gestures from the reply tags. Their order is the parameter order below.
from engine.lipsync.visemes import VISEMES
from engine.text.tags import EXPRESSIONS

_SCALARS: tuple[tuple[str, float, float, float], ...] = (
    # name, default, min, max
    ("head_yaw", 0.0, -1.0, 1.0),  # left/right turn, -1..1 (about ±20°)
    ("head_pitch", 0.0, -1.0, 1.0),  # nod down (+) / up (-)
    ("head_roll", 0.0, -1.0, 1.0),  # tilt, ±1 = about ±15°
    ("body_x", 0.0, -1.0, 1.0),  # sway, fraction of a small max offset
    ("breath", 0.0, 0.0, 1.0),  # chest rise
    ("eye_open_l", 1.0, 0.0, 1.0),
    ("eye_open_r", 1.0, 0.0, 1.0),
    ("gaze_x", 0.0, -1.0, 1.0),
    ("gaze_y", 0.0, -1.0, 1.0),
    ("brow_l", 0.0, -1.0, 1.0),  # raise (+) / lower (-)
    ("brow_r", 0.0, -1.0, 1.0),
    ("mouth_open", 0.0, 0.0, 1.0),  # overall jaw opening (sum of viseme shapes drives detail)
    ("mouth_smile", 0.0, -1.0, 1.0),  # corners up (+) / down (-)
    ("blush", 0.0, 0.0, 1.0),
    ("arm_wave", 0.0, 0.0, 1.0),  # raises the right arm
    ("wave_phase", 0.0, -1.0, 1.0),  # hand swing within a wave
)

PARAM_NAMES: tuple[str, ...] = (
    tuple(s[0] for s in _SCALARS)
    + tuple(f"expr_{e}" for e in EXPRESSIONS)
    + tuple(f"viseme_{v}" for v in VISEMES)
)
NUM_PARAMS = len(PARAM_NAMES)
INDEX: dict[str, int] = {n: i for i, n in enumerate(PARAM_NAMES)}

DEFAULTS = np.zeros(NUM_PARAMS, dtype=np.float32)
for _name, _default, _lo, _hi in _SCALARS:
    DEFAULTS[INDEX[_name]] = _default
DEFAULTS[INDEX["expr_neutral"]] = 1.0
DEFAULTS[INDEX["viseme_sil"]] = 1.0

LOWER = np.full(NUM_PARAMS, 0.0, dtype=np.float32)
UPPER = np.full(NUM_PARAMS, 1.0, dtype=np.float32)
for _name, _default, _lo, _hi in _SCALARS:
    LOWER[INDEX[_name]] = _lo
    UPPER[INDEX[_name]] = _hi

EXPR_SLICE = slice(INDEX[f"expr_{EXPRESSIONS[0]}"], INDEX[f"expr_{EXPRESSIONS[-1]}"] + 1)
VISEME_SLICE = slice(INDEX[f"viseme_{VISEMES[0]}"], INDEX[f"viseme_{VISEMES[-1]}"] + 1)


def default_params() -> np.ndarray:
    """A fresh copy of the rest pose."""
    return DEFAULTS.copy()


def clamp(params: np.ndarray) -> np.ndarray:
    """Clip a ``[..., NUM_PARAMS]`` array into each parameter's range (in place) and return it."""
    np.clip(params, LOWER, UPPER, out=params)
    return params
