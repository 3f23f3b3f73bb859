"""Alignment arithmetic on hand-made Piper token streams (no model)."""

from __future__ import annotations

import numpy as np
import pytest

from engine.tts import alignment
from engine.tts.alignment import PAUSE, Unit
from engine.tts.resample import output_length, resample_int16

pytestmark = pytest.mark.unit

ID_MAP = {"_": [0], "^": [1], "$": [2], " ": [3], "!": [4], ",": [8], "h": [20], "a": [14], "ɪ": [74], "ˈ": [120], "ː": [122]}  # fmt: skip


def _ids(phonemes: list[str]) -> list[int]:
    ids = [1, 0]
    for p in phonemes:
        if p in ID_MAP:
            ids += [*ID_MAP[p], 0]
    return [*ids, 2]


def test_token_samples_skip_unknown_phonemes_and_sum_exactly() -> None:
    phonemes = ["h", "ˈ", "a", "ɪ", "@", "!"]  # "@" is not in the map: Piper dropped it
    ids = _ids(phonemes)
    samples = np.arange(1, len(ids) + 1) * 256
    tokens = alignment.token_samples(phonemes, ids, samples, ID_MAP)
    assert tokens is not None
    assert [t for t, _ in tokens] == ["^", "h", "ˈ", "a", "ɪ", "!", "$"]
    assert sum(n for _, n in tokens) == samples.sum()


def test_token_samples_reject_misaligned_ids() -> None:
    assert alignment.token_samples(["h", "a"], [1, 0, 14, 0, 20, 0, 2], np.ones(7), ID_MAP) is None


def test_units_merge_stress_length_and_pauses() -> None:
    tokens = [
        ("^", 10),
        ("h", 5),
        ("ˈ", 3),
        ("a", 7),
        ("ː", 2),
        (",", 4),
        (" ", 6),
        ("ɪ", 8),
        ("!", 1),
        ("$", 2),
    ]
    units, next_group = alignment.build_units(tokens, offset=100, first_group=0)
    assert [(u.phoneme, u.start, u.end, u.group) for u in units] == [
        (PAUSE, 100, 110, -1),
        ("h", 110, 115, 0),
        ("aː", 115, 127, 0),  # stress before, length after
        (PAUSE, 127, 137, -1),  # "," and " " merged
        ("ɪ", 137, 145, 1),
        (PAUSE, 145, 148, -1),
    ]
    assert next_group == 2


def test_words_spread_proportionally_when_counts_disagree() -> None:
    units = [Unit("a", i * 10, i * 10 + 10, 0) for i in range(6)]  # one phoneme word, two text words
    spans = alignment.word_spans([("ab", 1), ("cdef", 1)], [2, 4], units, 60, lambda i: i, 10)
    assert [(w.word, w.start_s, w.end_s) for w in spans] == [("ab", 0.0, 2.0), ("cdef", 2.0, 6.0)]


def test_caption_words_glue_unspoken_tokens() -> None:
    counts = {"Wait": 1, "—": 0, "what?": 1, "...": 0}
    assert alignment.caption_words("... Wait — what?", counts.__getitem__) == [
        ("... Wait —", 1),
        ("what?", 1),
    ]


def test_resample_length_and_tone() -> None:
    t = np.arange(22050) / 22050
    tone = (10000 * np.sin(2 * np.pi * 440 * t)).astype(np.int16)
    out = resample_int16(tone, 22050, 48000)
    assert len(out) == output_length(len(tone), 22050, 48000) == 48000
    spectrum = np.abs(np.fft.rfft(out[4800:43200].astype(float)))
    assert abs(np.argmax(spectrum) * 48000 / 38400 - 440) < 2
    assert resample_int16(np.zeros(0, np.int16), 22050, 48000).shape == (0,)
