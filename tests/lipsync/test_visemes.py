"""Phoneme → viseme mapping."""

from __future__ import annotations

import numpy as np
import pytest

from engine.lipsync.visemes import (
    NUM_VISEMES,
    VISEME_OPENNESS,
    classify,
    phonemes_to_visemes,
    viseme_of,
    viseme_target,
)

pytestmark = pytest.mark.unit

# Every symbol the bundled Piper voice emitted for a long English paragraph.
PIPER_ENGLISH = list(" !,.;?abdefhijklmnopsuvwzæðŋɐɑɔəɚɛɜɡɪɹɾʃʊʌʒʔˈˌːθᵻ") + ["̩"]


@pytest.mark.parametrize(
    ("phonemes", "expected"),
    [
        ("mˈæp", ["PP", "aa", "PP"]),  # "map", as Piper writes it
        ("bˈɔːl", ["PP", "O", "nn"]),  # "ball": stress and length folded away
        ("fˈɪʃ", ["FF", "I", "CH"]),
        ("θˈɪŋk", ["TH", "I", "kk", "kk"]),
        ("sˈuː", ["SS", "U"]),
        ("dʒˈʌdʒ", ["DD", "CH", "aa", "DD", "CH"]),  # "judge": the affricate is two symbols
        ("ɹˈɛd", ["RR", "E", "DD"]),
        ("wˈiː", ["U", "I"]),
        ("hˈɛloʊ", ["E", "E", "nn", "O", "U"]),  # "hello": h takes the vowel's shape
        ("ðə kˈæt.", ["TH", "E", "sil", "kk", "aa", "DD", "sil"]),
    ],
)
def test_words_map_to_expected_visemes(phonemes: str, expected: list[str]) -> None:
    assert phonemes_to_visemes(list(phonemes)) == expected


def test_every_piper_symbol_is_handled() -> None:
    for ph in PIPER_ENGLISH:
        vec = viseme_target(ph)
        assert vec.shape == (NUM_VISEMES,)
        assert vec.sum() == pytest.approx(1.0)
        assert classify(ph) in ("viseme", "stress", "length", "transparent", "silence")


def test_marks_spaces_and_punctuation() -> None:
    assert classify("ˈ") == classify("ˌ") == "stress"
    assert classify("ː") == classify("̩") == "length"
    assert classify("h") == "transparent"
    for ph in (" ", ",", ".", "!", "?", "^", "$", "_", "3"):
        assert classify(ph) == "silence"
        assert viseme_of(ph) == "sil"


def test_unknown_letters_half_open_multichar_units_use_first_symbol() -> None:
    assert viseme_of("iː") == "I"  # the TTS adapter merges length marks into units
    assert viseme_of("n̩") == "nn"
    unknown = viseme_target("ʘ")  # a click: a letter with no mapping
    assert 0.2 < float(unknown @ VISEME_OPENNESS) < 0.6


def test_openness_ordering_is_plausible() -> None:
    o = {
        v: float(viseme_target(p) @ VISEME_OPENNESS)
        for v, p in [("PP", "p"), ("aa", "a"), ("I", "i"), ("O", "o")]
    }
    assert o["PP"] == 0.0
    assert o["aa"] > o["O"] > o["I"] > o["PP"]
    assert np.all(VISEME_OPENNESS >= 0) and np.all(VISEME_OPENNESS <= 1)
