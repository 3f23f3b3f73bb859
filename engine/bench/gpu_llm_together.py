"""Replies decoded at the same time on the GPU path: each slot stepping alone against the slots' shared step.

    python -m engine.bench.gpu_llm_together --shape 1.5B --replies 1,2,4,8 --out $OUT/llm-together.json

A Qwen2.5-shaped random-weight model (bf16, nothing downloaded) behind the engine's own :class:`GraphSlots`,
as the transformers backend drives them: per reply a thread takes a slot, prefills a prompt of
``--prompt-len`` random tokens through the slot's chunk graph, then picks ``--new-tokens`` tokens with the
slot's device sampler (temperature 0.7, top-p 0.9, as a reply does) and feeds each back. All ``N`` replies
start together. Both ways on the same weights, ``--repeats`` times each, interleaved: the slots stepping
alone (one captured step per slot, ``llm.cuda_graph_batched = false``), and the rows of one batched cache
taking their tokens in shared steps (the default). Reported per N and way: tokens/s over all replies, each
reply's decode tokens/s (after its first token), and for the shared step the mean rows a step.
"""

from __future__ import annotations

import argparse
import json
import statistics
import threading
import time
from pathlib import Path
from typing import Any

import torch

from engine.llm.cuda_reference import build_qwen2
from engine.llm.graph_kv import GraphSlots


def _reply(
    slots: GraphSlots, prompt: list[int], new_tokens: int, start: threading.Barrier
) -> dict[str, float]:
    stop = threading.Event()
    slot = slots.take(prompt, stop)
    assert slot is not None
    try:
        start.wait()
        t0 = time.perf_counter()
        slot.crop(0)
        logits = slot.decoder.prefill(torch.tensor(prompt, device=slot.decoder.device), 0)
        slot.ids[:] = prompt
        slot.sampler.begin(0.7, 0.9, 1.1, 0)
        reply: list[int] = []
        first = 0.0
        for i in range(new_tokens):
            token = slot.sampler.pick(logits, reply)
            reply.append(token)
            if i == 0:
                first = time.perf_counter()
            if i < new_tokens - 1:
                logits = slots.step(slot, token)
        end = time.perf_counter()
    finally:
        slots.put_back(slot, valid=False)
    return {
        "first_token_ms": (first - t0) * 1e3,
        "decode_tok_s": (new_tokens - 1) / (end - first),
        "end": end,
    }


def _round(slots: GraphSlots, n: int, args: argparse.Namespace, vocab: int, seed: int) -> dict[str, Any]:
    gen = torch.Generator().manual_seed(seed)
    prompts = [torch.randint(0, vocab, (args.prompt_len,), generator=gen).tolist() for _ in range(n)]
    start = threading.Barrier(n + 1)
    results: list[dict[str, float]] = [{} for _ in range(n)]

    def run(i: int) -> None:
        results[i] = _reply(slots, prompts[i], args.new_tokens, start)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    start.wait()
    t0 = time.perf_counter()
    for t in threads:
        t.join()
    wall = max(r["end"] for r in results) - t0
    return {
        "tok_s_all": n * args.new_tokens / wall,
        "reply_decode_tok_s": [r["decode_tok_s"] for r in results],
        "first_token_ms": [r["first_token_ms"] for r in results],
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", default="1.5B")
    ap.add_argument("--replies", default="1,2,4,8", help="comma list of replies decoded at once")
    ap.add_argument("--prompt-len", type=int, default=300)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--device", default="cuda", help="cpu: eager steps in float32, to check the bench itself")
    args = ap.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("needs a CUDA device (or --device cpu)")
    counts = [int(x) for x in args.replies.split(",") if x.strip()]
    slots_n = max(counts)
    model = build_qwen2(args.shape, args.device, torch.bfloat16 if args.device == "cuda" else torch.float32)
    config: Any = model.config
    vocab = int(config.vocab_size)
    max_len = args.prompt_len + args.new_tokens + 8
    ways = {
        "alone": GraphSlots(model, max_len=max_len, slots=slots_n, batched=False),
        "together": GraphSlots(model, max_len=max_len, slots=slots_n, batched=True),
    }
    for slots in ways.values():
        slots.warm(0)
    report: dict[str, Any] = {
        "device": torch.cuda.get_device_name() if args.device == "cuda" else "cpu",
        "args": {k: str(v) for k, v in vars(args).items()},
        "results": [],
    }
    print(
        "| replies | way | tokens/s, all | a reply's decode tokens/s (median) | first token ms (median) | rows a step |"
    )
    print("| --- | --- | --- | --- | --- | --- |")
    for n in counts:
        for way, slots in ways.items():
            rounds = []
            shared = slots.shared
            before = (shared.steps, shared.rows_stepped) if shared is not None else (0, 0)
            for rep in range(args.repeats):
                rounds.append(_round(slots, n, args, vocab, seed=rep))
            rows = None
            if shared is not None:
                steps, stepped = shared.steps - before[0], shared.rows_stepped - before[1]
                rows = stepped / steps if steps else None
            row = {
                "replies": n,
                "way": way,
                "tok_s_all": statistics.median(r["tok_s_all"] for r in rounds),
                "reply_decode_tok_s_median": statistics.median(
                    x for r in rounds for x in r["reply_decode_tok_s"]
                ),
                "first_token_ms_median": statistics.median(x for r in rounds for x in r["first_token_ms"]),
                "rows_a_step": rows,
                "rounds": rounds,
            }
            report["results"].append(row)
            print(
                f"| {n} | {way} | {row['tok_s_all']:.0f} | {row['reply_decode_tok_s_median']:.0f} "
                f"| {row['first_token_ms_median']:.1f} | {'-' if rows is None else f'{rows:.2f}'} |",
                flush=True,
            )
            if args.out is not None:
                args.out.parent.mkdir(parents=True, exist_ok=True)
                args.out.write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
