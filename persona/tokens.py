"""Token counting for the prompt budget: pluggable, with a cheap conservative default."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

TokenCounter = Callable[[str], int]

# Chat templates add a few tokens of framing per message (role markers, separators).
MESSAGE_OVERHEAD = 4


def approx_tokens(text: str) -> int:
    """UTF-8 bytes / 3, rounded up: above the real count of common BPE tokenizers on English
    (about 4 bytes a token) and about one token per CJK character, so a budget kept with this
    estimate holds with the real tokenizer."""
    return (len(text.encode("utf-8")) + 2) // 3


def counter_from_tokenizer(tokenizer: Any) -> TokenCounter:
    """Exact counts from a Hugging Face tokenizer (``encode`` without special tokens)."""

    def count(text: str) -> int:
        return len(tokenizer.encode(text, add_special_tokens=False))

    return count


def truncate_to_tokens(text: str, budget: int, count: TokenCounter) -> str:
    """The longest word-prefix of ``text`` within ``budget`` tokens (with an ellipsis when cut)."""
    if count(text) <= budget:
        return text
    words = text.split()
    lo, hi = 0, len(words)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if count(" ".join(words[:mid]) + " …") <= budget:
            lo = mid
        else:
            hi = mid - 1
    return (" ".join(words[:lo]) + " …") if lo else ""
