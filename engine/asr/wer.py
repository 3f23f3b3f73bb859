"""Word error rate, with the light normalisation every ASR comparison here uses."""

from __future__ import annotations

import re
from collections.abc import Sequence

_NON_WORD = re.compile(r"[^\w\s']+")


def normalize_words(text: str) -> list[str]:
    """Lowercase, drop punctuation (apostrophes kept), split on whitespace."""
    return _NON_WORD.sub(" ", text.lower()).replace(" '", " ").split()


def edit_distance(ref: list[str], hyp: list[str]) -> int:
    """Levenshtein distance between two word lists (substitutions, insertions, deletions)."""
    prev = list(range(len(hyp) + 1))
    for i, r in enumerate(ref, 1):
        cur = [i] + [0] * len(hyp)
        for j, h in enumerate(hyp, 1):
            cur[j] = min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (r != h))
        prev = cur
    return prev[-1]


def wer(reference: str, hypothesis: str) -> float:
    """Word error rate of one hypothesis against one reference (0.0 is perfect)."""
    ref, hyp = normalize_words(reference), normalize_words(hypothesis)
    if not ref:
        return 0.0 if not hyp else 1.0
    return edit_distance(ref, hyp) / len(ref)


def corpus_wer(pairs: list[tuple[str, str]]) -> float:
    """Total edits over total reference words for (reference, hypothesis) pairs."""
    edits = words = 0
    for reference, hypothesis in pairs:
        ref, hyp = normalize_words(reference), normalize_words(hypothesis)
        edits += edit_distance(ref, hyp) if ref else len(hyp)
        words += len(ref)
    return edits / words if words else 0.0


def word_error_rate(references: Sequence[str], hypotheses: Sequence[str]) -> float:
    """Corpus WER of parallel lists of references and hypotheses (missing hypotheses count as empty)."""
    padded = list(hypotheses) + [""] * max(0, len(references) - len(hypotheses))
    return corpus_wer(list(zip(references, padded, strict=False)))
