"""Per-token cost of the GPU decode path's sampling: the transformers processors (what the graph path ran
before, and the eager path still runs) against the device sampler's graph, alone and beside Python threads
that want the GIL (as an engine's encoders, loop and Piper do). Needs a CUDA device.

    python scripts/sampler_ab.py [--vocab 151936] [--tokens 200] [--busy 0,4]
"""

from __future__ import annotations

import argparse
import threading
import time
from collections.abc import Callable
from typing import Any

import torch
from transformers import (
    LogitsProcessorList,
    NoRepeatNGramLogitsProcessor,
    RepetitionPenaltyLogitsProcessor,
    TemperatureLogitsWarper,
    TopPLogitsWarper,
)

from engine.llm.device_sampler import DeviceSampler

Pick = Callable[[torch.Tensor, list[int]], int]


def processors_pick(vocab: int) -> Pick:
    procs: Any = LogitsProcessorList(
        [
            RepetitionPenaltyLogitsProcessor(1.3),
            NoRepeatNGramLogitsProcessor(3),
            TemperatureLogitsWarper(0.7),
            TopPLogitsWarper(0.9),
        ]
    )

    def pick(logits: torch.Tensor, reply: list[int]) -> int:
        x = procs(torch.tensor([reply], dtype=torch.long, device="cuda"), logits.to(torch.float32, copy=True))
        return int(torch.multinomial(torch.softmax(x, dim=-1), 1))

    return pick


def device_pick(vocab: int) -> Pick:
    s = DeviceSampler(vocab, torch.bfloat16, torch.device("cuda"), use_graph=True)
    s.begin(0.7, 0.9, 1.3, 3)
    return s.pick


def per_token_ms(pick: Pick, vocab: int, tokens: int) -> float:
    logits = (torch.randn(1, vocab, device="cuda") * 0.8).to(torch.bfloat16)  # a random-weight model's spread
    reply: list[int] = []
    for _ in range(5):
        pick(logits, reply[-30:])
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(tokens):
        reply.append(pick(logits, reply[-30:]))
    return (time.perf_counter() - start) * 1000 / tokens


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--vocab", type=int, default=151_936)
    ap.add_argument("--tokens", type=int, default=200)
    ap.add_argument("--busy", default="0,4")
    args = ap.parse_args()
    for busy in (int(b) for b in args.busy.split(",")):
        stop = threading.Event()

        def spin(stop: threading.Event = stop) -> None:
            while not stop.is_set():
                sum(range(2000))  # pure Python: holds the GIL between switch intervals

        threads = [threading.Thread(target=spin, daemon=True) for _ in range(busy)]
        for t in threads:
            t.start()
        try:
            for name, make in (("processors", processors_pick), ("device sampler (graph)", device_pick)):
                ms = per_token_ms(make(args.vocab), args.vocab, args.tokens)
                print(f"busy threads {busy}: {name}: {ms:.2f} ms a token")
        finally:
            stop.set()
            for t in threads:
                t.join()


if __name__ == "__main__":
    main()
