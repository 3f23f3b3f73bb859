"""Phoneme and word alignments from Piper's per-phoneme-id sample counts.

Piper (VITS) predicts a duration in samples for every phoneme id; those counts add up
exactly to the audio. This module turns them into :class:`PhonemeSpan` units a lip-sync
stage can use, and maps the phoneme words back onto the words of the text for captions.

Phoneme units, contiguous and covering the whole audio:

* a stress mark (``ˈ``, ``ˌ``) is merged into the phoneme after it (it lengthens the vowel);
* a length mark (``ː``), combining diacritics and modifier letters (``ʰ``) are merged into
  the phoneme before them (``i`` + ``ː`` -> ``iː``);
* sentence start/end, punctuation and word-boundary spaces become one :data:`PAUSE` unit
  (consecutive pauses are merged).
"""

from __future__ import annotations

import itertools
import unicodedata
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from engine.events import PhonemeSpan, WordSpan

PAUSE = "_"
_BOS, _EOS, _PAD, _SPACE = "^", "$", "_", " "
_STRESS = frozenset({"ˈ", "ˌ"})
_LENGTH = frozenset({"ː", "ˑ"})


@dataclass(slots=True)
class Unit:
    """One phoneme (or pause) in source samples; ``group`` numbers the phoneme word it belongs to."""

    phoneme: str
    start: int
    end: int
    group: int  # -1 for pauses


def token_samples(
    phonemes: Sequence[str],
    phoneme_ids: Sequence[int],
    id_samples: np.ndarray,
    id_map: Mapping[str, Sequence[int]],
) -> list[tuple[str, int]] | None:
    """Samples per phoneme token (BOS and EOS included, each token owning its trailing pad).

    Phonemes missing from ``id_map`` were dropped by Piper when it built the ids and are
    skipped here too. Returns None when the ids do not line up with the phonemes.
    """
    pad = list(id_map.get(_PAD, []))
    out: list[tuple[str, int]] = []
    idx = 0
    for ph in itertools.chain([_BOS], phonemes, [_EOS]):
        ids = id_map.get(ph)
        if ids is None:
            continue
        expected = list(ids) + (pad if ph != _EOS else [])
        if list(phoneme_ids[idx : idx + len(expected)]) != expected:
            return None
        out.append((ph, int(id_samples[idx : idx + len(expected)].sum())))
        idx += len(expected)
    if idx != len(phoneme_ids):
        return None
    return out


def _is_suffix_mark(ph: str) -> bool:
    return ph in _LENGTH or all(
        unicodedata.combining(c) or (unicodedata.category(c) == "Lm" and c not in _STRESS) for c in ph
    )


def _is_pause(ph: str) -> bool:
    return ph in (_BOS, _EOS, _SPACE) or not any(unicodedata.category(c).startswith("L") for c in ph)


def build_units(tokens: Sequence[tuple[str, int]], offset: int, first_group: int) -> tuple[list[Unit], int]:
    """Units of one sentence starting at sample ``offset``; returns them and the next free group number."""
    units: list[Unit] = []
    group = first_group
    pending = 0  # samples of stress marks waiting for the next unit
    pos = offset
    group_used = False
    for ph, n in tokens:
        start, pos = pos, pos + n
        if ph in _STRESS:
            pending += n
            continue
        if units and units[-1].group >= 0 and _is_suffix_mark(ph):
            units[-1].phoneme += ph
            units[-1].end = pos
            continue
        if _is_pause(ph):
            if ph == _SPACE and group_used:
                group += 1
                group_used = False
            if units and units[-1].group < 0:
                units[-1].end = pos
            else:
                units.append(Unit(PAUSE, start - pending, pos, -1))
            pending = 0
            continue
        units.append(Unit(ph, start - pending, pos, group))
        group_used = True
        pending = 0
    if pending and units:
        units[-1].end = pos
    return units, group + (1 if group_used else 0)


def merge_sentences(sentences: Sequence[list[Unit]]) -> list[Unit]:
    """Concatenate the units of consecutive sentences, merging the pauses where they meet."""
    out: list[Unit] = []
    for units in sentences:
        for u in units:
            if out and u.group < 0 and out[-1].group < 0:
                out[-1].end = u.end
            else:
                out.append(u)
    return out


def phoneme_spans(units: Sequence[Unit], scale: Callable[[int], int], rate: int) -> tuple[PhonemeSpan, ...]:
    """Spans in seconds; ``scale`` maps a source sample index to an output sample index."""
    return tuple(PhonemeSpan(u.phoneme, scale(u.start) / rate, scale(u.end) / rate) for u in units)


def caption_words(text: str, phoneme_words: Callable[[str], int]) -> list[tuple[str, int]]:
    """The words of ``text`` for captions, each with the number of phoneme words it is spoken as.

    Tokens that are not spoken at all (a lone dash, an ellipsis) are glued to a neighbour.
    """
    words: list[tuple[str, int]] = []
    carry = ""
    for token in text.split():
        n = phoneme_words(token)
        if n == 0:
            if words:
                words[-1] = (f"{words[-1][0]} {token}", words[-1][1])
            else:
                carry = f"{carry}{token} "
            continue
        words.append((carry + token, n))
        carry = ""
    if carry and words:
        words[-1] = (words[-1][0] + " " + carry.strip(), words[-1][1])
    return words


def word_spans(
    words: Sequence[tuple[str, int]],
    weights: Sequence[int],
    units: Sequence[Unit],
    duration: int,
    scale: Callable[[int], int],
    rate: int,
) -> tuple[WordSpan, ...]:
    """Map caption words onto phoneme words.

    When the phoneme-word counts agree with the synthesized groups each word gets exactly
    its groups; otherwise words are spread over the phonemes in proportion to ``weights``
    (their phoneme counts), snapped to phoneme boundaries. ``duration`` (source samples)
    is used only when there are no phoneme units at all.
    """
    if not words:
        return ()
    phones = [u for u in units if u.group >= 0]
    groups: dict[int, list[Unit]] = {}
    for u in phones:
        groups.setdefault(u.group, []).append(u)
    ordered = [groups[g] for g in sorted(groups)]
    bounds: list[tuple[int, int]] = []
    if phones and sum(n for _, n in words) == len(ordered):
        i = 0
        for _, n in words:
            taken = ordered[i : i + n]
            bounds.append((taken[0][0].start, taken[-1][-1].end))
            i += n
    else:
        total = max(sum(weights), 1)
        cum = np.concatenate([[0], np.cumsum(weights)]) / total
        if phones:
            edges = np.round(cum * len(phones)).astype(int)
            for a, b in itertools.pairwise(edges.tolist()):
                if b > a:
                    bounds.append((phones[a].start, phones[b - 1].end))
                else:
                    t = phones[min(a, len(phones) - 1)].start
                    bounds.append((t, t))
        else:
            edges = np.round(cum * duration).astype(int)
            bounds = list(itertools.pairwise(edges.tolist()))
    return tuple(
        WordSpan(word, scale(a) / rate, scale(b) / rate)
        for (word, _), (a, b) in zip(words, bounds, strict=True)
    )
