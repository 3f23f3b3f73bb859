"""Token sampling over a logits row in numpy: the same controls as the transformers path.

Repetition penalty and no-repeat n-grams look at the reply only (the prompt holds the persona, names and
the template's own markers, which the reply must stay free to repeat); then temperature and nucleus
(top-p) sampling, or greedy at temperature 0. Top-p is taken over the best ``TOP_CANDIDATES`` tokens when
they already hold ``top_p`` of the mass (nearly always), so a step costs a partial sort, not a full one.
"""

from __future__ import annotations

import numpy as np

TOP_CANDIDATES = 128


def banned_by_ngrams(reply: list[int], n: int) -> set[int]:
    """Tokens that would repeat an ``n``-gram the reply already contains."""
    if n <= 0 or len(reply) < n:
        return set()
    if n == 1:
        return set(reply)
    tail = tuple(reply[len(reply) - n + 1 :])
    return {reply[i + n - 1] for i in range(len(reply) - n + 1) if tuple(reply[i : i + n - 1]) == tail}


class Sampler:
    def __init__(
        self,
        temperature: float,
        top_p: float,
        repetition_penalty: float,
        no_repeat_ngram_size: int,
        seed: int | None = None,
    ) -> None:
        self.temperature = temperature
        self.top_p = top_p
        self.repetition_penalty = repetition_penalty
        self.no_repeat_ngram_size = no_repeat_ngram_size
        self.rng = np.random.default_rng(seed)

    def pick(self, logits: np.ndarray, reply: list[int]) -> int:
        """The next token after ``reply`` given the model's ``logits`` (float32 [V], not modified)."""
        x = logits.astype(np.float32, copy=True)
        if self.repetition_penalty != 1.0 and reply:
            seen = np.fromiter(set(reply), dtype=np.int64)
            v = x[seen]
            x[seen] = np.where(v > 0, v / self.repetition_penalty, v * self.repetition_penalty)
        banned = banned_by_ngrams(reply, self.no_repeat_ngram_size)
        if banned:
            x[np.fromiter(banned, dtype=np.int64)] = -np.inf
        if self.temperature <= 0:
            return int(np.argmax(x))
        x /= self.temperature
        x -= x.max()
        p = np.exp(x)
        p /= p.sum()
        if self.top_p >= 1.0:
            return int(self.rng.choice(len(p), p=p))
        k = min(TOP_CANDIDATES, len(p))
        top = np.argpartition(p, -k)[-k:]
        if p[top].sum() < self.top_p:
            top = np.arange(len(p))  # a flat distribution: the full sort
        order = top[np.argsort(p[top])[::-1]]
        cum = np.cumsum(p[order])
        keep = order[: int(np.searchsorted(cum, self.top_p)) + 1]  # the smallest set reaching top_p
        q = p[keep] / p[keep].sum()
        return int(keep[self.rng.choice(len(keep), p=q)])
