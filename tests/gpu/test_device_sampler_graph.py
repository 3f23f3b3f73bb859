"""The device sampler's CUDA graph picks what its eager ops pick (greedy, with the reply's penalty, n-gram bans
and a logit bias), keeps a nucleus, and draws fresh noise on every replay. Skipped without a CUDA device."""

from __future__ import annotations

from collections import Counter

import pytest
import torch

from engine.llm.device_sampler import DeviceSampler

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
VOCAB = 151_936  # Qwen2.5's row


def pair() -> tuple[DeviceSampler, DeviceSampler]:
    dev = torch.device("cuda")
    return (
        DeviceSampler(VOCAB, torch.bfloat16, dev, use_graph=True),
        DeviceSampler(VOCAB, torch.bfloat16, dev, use_graph=False),
    )


def test_graph_picks_what_the_eager_ops_pick() -> None:
    graph, eager = pair()
    gen = torch.Generator(device="cuda").manual_seed(0)
    bias = torch.zeros(1, VOCAB, device="cuda")
    bias[0, 1::2] = float("-inf")
    for s in (graph, eager):
        s.begin(0.0, 0.9, 1.3, 3, bias)
    reply: list[int] = []
    for _ in range(32):
        logits = torch.randn(1, VOCAB, device="cuda", generator=gen).to(torch.bfloat16)
        a, b = graph.pick(logits, reply), eager.pick(logits, reply)
        assert a == b and a % 2 == 0 and a not in reply[-1:]
        reply.append(a)


def test_graph_keeps_the_nucleus_and_draws_afresh() -> None:
    graph, _ = pair()
    peaked = torch.full((1, VOCAB), -10.0, device="cuda")
    peaked[0, [11, 222, 3333]] = torch.tensor([4.0, 3.5, 2.8], device="cuda")
    graph.begin(1.0, 0.9, 1.0, 0)
    got = Counter(graph.pick(peaked.to(torch.bfloat16), []) for _ in range(600))
    assert set(got) == {11, 222, 3333} and got[11] > got[222] > got[3333]
    flat = torch.zeros(1, VOCAB, dtype=torch.bfloat16, device="cuda")
    assert len({graph.pick(flat, []) for _ in range(50)}) > 45
