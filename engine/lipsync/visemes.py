"""IPA phoneme → viseme mapping for what Piper / espeak-ng emits for English.

Piper phonemizes to single IPA characters: diphthongs and affricates arrive as
two characters (``a ɪ``, ``d ʒ``), stress marks ``ˈ ˌ`` precede the stressed
vowel, ``ː`` lengthens the previous vowel, combining marks (``̩`` syllabic) modify
the previous consonant, spaces and punctuation separate words, ``^``/``$`` open
and close a sentence. Piper's alignments give *every* one of these a duration
(a stress mark typically gets 30–70 ms), so they are classified here and the
timeline folds them into their neighbours:

* :data:`STRESS` marks: their time belongs to the following phoneme;
* :data:`LENGTH` and combining marks: their time belongs to the previous phoneme;
* ``h``: :data:`TRANSPARENT`, the lips already take the next vowel's shape;
* spaces, punctuation, ``^ $ _``, digits: ``sil``.

A phoneme's viseme *target* is a weight vector over :data:`VISEMES` (summing to 1),
usually one-hot; reduced vowels blend toward a closed mouth so schwas look lighter.
"""

from __future__ import annotations

import unicodedata
from typing import Final, Literal

import numpy as np

# Oculus-style viseme set: silence, 10 consonant groups, 5 vowels.
VISEMES: Final[tuple[str, ...]] = (
    "sil",
    "PP",
    "FF",
    "TH",
    "DD",
    "kk",
    "CH",
    "SS",
    "nn",
    "RR",
    "aa",
    "E",
    "I",
    "O",
    "U",
)
NUM_VISEMES: Final = len(VISEMES)
VISEME_INDEX: Final[dict[str, int]] = {v: i for i, v in enumerate(VISEMES)}
SIL: Final = VISEME_INDEX["sil"]

# Visemes whose lips must fully close or touch (/p b m/, /f v/): the timeline keeps them crisp.
CRISP_VISEMES: Final[frozenset[str]] = frozenset({"PP", "FF"})

# How far each viseme opens the jaw, 0..1 (drives the ``mouth_open`` parameter).
VISEME_OPENNESS: Final[np.ndarray] = np.array(
    [
        {
            "sil": 0.0, "PP": 0.0, "FF": 0.12, "TH": 0.2, "DD": 0.25, "kk": 0.3, "CH": 0.22,
            "SS": 0.12, "nn": 0.2, "RR": 0.28, "aa": 1.0, "E": 0.62, "I": 0.42, "O": 0.8, "U": 0.38,
        }[v]
        for v in VISEMES
    ],
    dtype=np.float32,
)  # fmt: skip

PhonemeKind = Literal["viseme", "stress", "length", "transparent", "silence"]
STRESS: Final[frozenset[str]] = frozenset({"ˈ", "ˌ"})
LENGTH: Final[frozenset[str]] = frozenset({"ː", "ˑ", "̩", "̃", "̪", "̯", "̧", "ʰ", "ʲ", "ˤ", "˞"})
TRANSPARENT: Final[frozenset[str]] = frozenset({"h", "ɦ"})

# IPA (as espeak-ng/Piper write it) → viseme name, or a {viseme: weight} blend.
_MAP: Final[dict[str, str | dict[str, float]]] = {
    # bilabials: full closure
    "p": "PP", "b": "PP", "m": "PP", "ɓ": "PP", "ʙ": "PP", "ɸ": "FF", "β": "FF",
    # labiodentals
    "f": "FF", "v": "FF", "ɱ": "FF", "ʋ": "FF", "ⱱ": "FF",
    # dentals
    "θ": "TH", "ð": "TH",
    # alveolar stops, flaps, glottal stop
    "t": "DD", "d": "DD", "ɾ": "DD", "ɗ": "DD", "ʈ": "DD", "ɖ": "DD", "ʔ": "DD", "c": "DD",
    # velars / uvulars
    "k": "kk", "g": "kk", "ɡ": "kk", "ŋ": "kk", "q": "kk", "ɢ": "kk", "x": "kk", "ɣ": "kk",
    "χ": "kk", "ʁ": "kk", "ɴ": "kk", "ɠ": "kk", "ħ": "kk", "ʕ": "kk",
    # postalveolar fricatives (affricates arrive as t ʃ / d ʒ)
    "ʃ": "CH", "ʒ": "CH", "ç": "CH", "ɕ": "CH", "ʑ": "CH", "ʂ": "CH", "ʐ": "CH", "ʝ": "CH",
    # sibilants
    "s": "SS", "z": "SS",
    # nasals and laterals
    "n": "nn", "l": "nn", "ɫ": "nn", "ɬ": "nn", "ɮ": "nn", "ɲ": "nn", "ɳ": "nn", "ʎ": "nn",
    "ɭ": "nn", "ʟ": "nn", "ɺ": "nn",
    # rhotics
    "ɹ": "RR", "r": "RR", "ɻ": "RR", "ʀ": "RR", "ɽ": "RR", "ɚ": "RR", "ɝ": "RR",
    # glides
    "w": "U", "ʍ": "U", "ɥ": "U", "ɰ": "U", "j": "I",
    # open vowels
    "a": "aa", "ɑ": "aa", "æ": "aa", "ʌ": "aa", "ɶ": "aa",
    "ɐ": {"aa": 0.7, "sil": 0.3},
    # mid front / central vowels
    "ɛ": "E", "e": "E", "œ": "E", "ɜ": "E", "ɞ": "E", "ɘ": "E", "ε": "E",
    "ə": {"E": 0.65, "sil": 0.35},
    # close front vowels
    "i": "I", "ɪ": "I", "y": "I", "ʏ": "I", "ɨ": "I",
    "ᵻ": {"I": 0.7, "sil": 0.3},
    # rounded back vowels
    "o": "O", "ɔ": "O", "ɒ": "O", "ø": "O", "ɵ": "O", "ɤ": "O",
    "u": "U", "ʊ": "U", "ʉ": "U", "ɯ": "U",
}  # fmt: skip


def _vector(spec: str | dict[str, float]) -> np.ndarray:
    vec = np.zeros(NUM_VISEMES, dtype=np.float32)
    if isinstance(spec, str):
        vec[VISEME_INDEX[spec]] = 1.0
    else:
        for name, weight in spec.items():
            vec[VISEME_INDEX[name]] = weight
        vec /= vec.sum()
    return vec


_TARGETS: Final[dict[str, np.ndarray]] = {ph: _vector(spec) for ph, spec in _MAP.items()}
_SIL_VECTOR: Final = _vector("sil")
_UNKNOWN_LETTER: Final = _vector({"E": 0.6, "sil": 0.4})


def classify(phoneme: str) -> PhonemeKind:
    """What role a phoneme symbol plays in the timeline (see the module docstring)."""
    if phoneme in STRESS:
        return "stress"
    if phoneme in LENGTH or (len(phoneme) == 1 and unicodedata.combining(phoneme)):
        return "length"
    if phoneme in TRANSPARENT:
        return "transparent"
    if _key(phoneme) in _TARGETS or _is_letter(phoneme):
        return "viseme"
    return "silence"  # spaces, punctuation, ^ $ _, digits


def _key(phoneme: str) -> str:
    """Multi-character phonemes (``tʃ``, ``aɪ``) take their first known character's shape."""
    if phoneme in _TARGETS:
        return phoneme
    for ch in phoneme:
        if ch in _TARGETS:
            return ch
    return phoneme


def _is_letter(phoneme: str) -> bool:
    return any(unicodedata.category(ch).startswith("L") for ch in phoneme)


def viseme_target(phoneme: str) -> np.ndarray:
    """The viseme weight vector (float32, sums to 1) a phoneme aims at.

    Silence, punctuation and marks give ``sil``; an unknown letter gives a half-open
    neutral mouth rather than a closed one (a vowel of another language, most likely).
    """
    vec = _TARGETS.get(_key(phoneme))
    if vec is not None:
        return vec.copy()
    if _is_letter(phoneme):
        return _UNKNOWN_LETTER.copy()
    return _SIL_VECTOR.copy()


def viseme_of(phoneme: str) -> str:
    """The dominant viseme name of a phoneme (``sil`` for marks and punctuation)."""
    return VISEMES[int(np.argmax(viseme_target(phoneme)))]


def phonemes_to_visemes(phonemes: list[str] | tuple[str, ...] | str) -> list[str]:
    """Dominant viseme per *sounding* phoneme, marks folded away, ``h`` taking the next shape.

    For inspection and tests: ``phonemes_to_visemes("mˈæp") == ["PP", "aa", "PP"]``.
    """
    kinds = [(p, classify(p)) for p in phonemes]
    out: list[str] = []
    for i, (p, kind) in enumerate(kinds):
        if kind in ("stress", "length"):
            continue
        if kind == "transparent":
            nxt = next((q for q, k in kinds[i + 1 :] if k in ("viseme", "silence")), " ")
            out.append(viseme_of(nxt))
            continue
        out.append(viseme_of(p))
    return out
