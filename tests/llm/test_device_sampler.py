"""The GPU decode path's sampler, run eagerly on the CPU (the same ops its CUDA graph replays), against the
numpy sampler of the llama.cpp path: the same nucleus, the same penalties and bans."""

from __future__ import annotations

from collections import Counter
from typing import cast

import torch

from engine.llm.device_sampler import DeviceSampler
from engine.llm.sampling import Sampler

VOCAB = 64


def sampler() -> DeviceSampler:
    return DeviceSampler(VOCAB, torch.bfloat16, torch.device("cpu"), use_graph=False)


def row(values: dict[int, float], rest: float = -8.0) -> torch.Tensor:
    x = torch.full((1, VOCAB), rest)
    for i, v in values.items():
        x[0, i] = v
    return x.to(torch.bfloat16)


def draws(pick: object, n: int) -> Counter[int]:
    return Counter(pick() for _ in range(n))  # type: ignore[operator]


def test_nucleus_matches_the_numpy_sampler() -> None:
    logits = row({3: 4.0, 9: 3.5, 20: 2.8, 41: 1.0})
    s = sampler()
    s.begin(1.0, 0.9, 1.0, 0)
    got = draws(lambda: s.pick(logits, []), 3000)
    ref = Sampler(1.0, 0.9, 1.0, 0, seed=1)
    want = draws(lambda: ref.pick(logits.float().numpy()[0], []), 3000)
    assert set(got) == set(want) == {3, 9, 20}
    for token in (3, 9, 20):
        assert abs(got[token] - want[token]) < 150, (got, want)


def test_top_p_1_keeps_every_token_and_temperature_sharpens() -> None:
    logits = row(dict.fromkeys(range(VOCAB), 0.0))  # flat: every token is in the nucleus
    s = sampler()
    s.begin(1.0, 1.0, 1.0, 0)
    assert len(draws(lambda: s.pick(logits, []), 2000)) == VOCAB
    peaked = row({7: 2.0, 8: 1.0}, rest=-3.0)
    s.begin(0.1, 1.0, 1.0, 0)
    assert draws(lambda: s.pick(peaked, []), 200) == Counter({7: 200})


def test_greedy_penalises_the_reply_and_bans_repeated_ngrams() -> None:
    s = sampler()
    s.begin(0.0, 0.9, 2.0, 3)
    logits = row({5: 3.0, 6: 2.0, 7: 1.9})
    assert s.pick(logits, []) == 5
    assert s.pick(logits, [5]) == 6  # 5 is in the reply: 3.0 / 2 = 1.5
    assert s.pick(logits, [5, 6]) == 7
    # A negative logit is multiplied: -1 * 2 = -2 falls below -1.5.
    neg = row({10: -1.0, 11: -1.5}, rest=-9.0)
    s.begin(0.0, 1.0, 2.0, 0)
    assert s.pick(neg, []) == 10 and s.pick(neg, [10]) == 11
    # [1, 2, 9, 1, 2]: a 9 next would repeat the 3-gram (1, 2, 9).
    s.begin(0.0, 1.0, 1.0, 3)
    favours9 = row({9: 5.0, 4: 1.0})
    assert s.pick(favours9, [1, 2, 9, 1]) == 9
    assert s.pick(favours9, [1, 2, 9, 1, 2]) == 4
    assert s.pick(favours9, [1, 2, 9, 1, 2, 4]) == 9  # the ban is lifted once the tail moves on
    # A new reply starts with nothing penalised.
    s.begin(0.0, 1.0, 2.0, 0)
    assert s.pick(logits, []) == 5


def test_bias_excludes_tokens_and_agrees_with_the_processors() -> None:
    from transformers import (
        LogitsProcessorList,
        NoRepeatNGramLogitsProcessor,
        RepetitionPenaltyLogitsProcessor,
    )

    gen = torch.Generator().manual_seed(0)
    bias = torch.zeros(1, VOCAB)
    bias[0, ::3] = float("-inf")
    procs = LogitsProcessorList([RepetitionPenaltyLogitsProcessor(1.3), NoRepeatNGramLogitsProcessor(2)])
    s = sampler()
    s.begin(0.0, 0.9, 1.3, 2, bias)
    reply: list[int] = []
    for _ in range(20):
        logits = torch.randn(1, VOCAB, generator=gen).to(torch.bfloat16)
        given = logits.clone()
        ids = cast(torch.LongTensor, torch.tensor([reply], dtype=torch.long))
        ref = procs(ids, logits.float() + bias)
        token = s.pick(logits, reply)
        assert token % 3 != 0 and token == int(torch.argmax(ref)), (reply, token)
        assert torch.equal(logits, given)  # the row handed in is not modified
        reply.append(token)
