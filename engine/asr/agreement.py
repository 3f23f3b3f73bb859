"""LocalAgreement-2 (whisper_streaming): commit the word prefix two decodes agree on."""

from __future__ import annotations

from engine.asr.wer import normalize_words


def _key(word: str) -> str:
    return "".join(normalize_words(word))


def common_prefix_len(a: list[str], b: list[str]) -> int:
    """How many leading words agree, ignoring case and punctuation."""
    n = 0
    for x, y in zip(a, b, strict=False):
        if _key(x) != _key(y):
            break
        n += 1
    return n


def agree(stable: list[str], previous: list[str], current: list[str]) -> list[str]:
    """The committed words after ``current``: ``stable`` only ever extends.

    Words beyond ``stable`` are committed when the previous and current
    hypotheses agree on them and the current one still agrees with ``stable``.
    """
    if common_prefix_len(stable, current) < len(stable):
        return stable
    n = common_prefix_len(previous, current)
    if n <= len(stable):
        return stable
    return stable + current[len(stable) : n]


def hypothesis_text(stable: list[str], current: list[str]) -> str:
    """The text to show: the committed words, then the current decode's words beyond them."""
    return " ".join(stable + current[len(stable) :])
